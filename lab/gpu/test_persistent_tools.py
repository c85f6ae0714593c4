"""The persistent-forward tools' own check (lab code: run with `python -m pytest lab/gpu` on a
GPU machine; the product's tests do not import lab/)."""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")
GPU = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"


@pytest.mark.skipif(not GPU, reason="needs a CUDA GPU")
def test_timing_runs():
    from lab.gpu.persistent_tools import time_persistent, time_steps
    from tests.cuda_backend.cuda_helpers import tiny_model

    from zoi.backends.cuda.backend import CudaBackend

    minilm = dict(hidden=384, heads=12, inter=1536)
    model = tiny_model("fp16", max_tokens=256, max_batch=32, **minilm)
    be = CudaBackend(model, buckets=[128], persistent_max=0)  # its _steps_for: per-op
    t_p = time_persistent(be, 128, iters=50)
    t_o = time_steps(be, be._steps_for(128), 128, iters=50)
    print(f"persistent {t_p:.1f} us, per-op {t_o:.1f} us (minilm 2 layers, tb 128)")
    assert t_p > 0 and t_o > 0
