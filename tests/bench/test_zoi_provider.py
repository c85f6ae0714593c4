"""zoi's bench provider: one artifact per (model, zoi source, precision), shared by devices."""

from __future__ import annotations

import numpy as np

import zoi
from zoi.bench.models import ModelRef
from zoi.bench.providers import SPECS
from zoi.bench.providers.zoi_engine import ZoiProvider


def _spec(name):
    return next(s for s in SPECS if s.name == name)


def test_cuda_int8_loads_the_parent_compiled_artifact(small_bert, tmp_path):
    """The CUDA INT8 / FP8 providers get the artifact the parent compiled (calibrated once,
    on the CPU), the same folder as the CPU provider of that precision; FP16 compiles for the
    GPU only, in the worker. The artifact loads and encodes on another device kind."""
    model = ModelRef("small", small_bert, hidden=32, layers=2, heads=2, max_len=64)
    cpu = ZoiProvider.convert(_spec("zoi-cpu-int8"), model, tmp_path)
    gpu = ZoiProvider.convert(_spec("zoi-cuda-int8"), model, tmp_path)
    assert gpu == cpu and (tmp_path / "small").is_dir()
    assert ZoiProvider.convert(_spec("zoi-cuda-fp16"), model, tmp_path) == {}
    fp8 = ZoiProvider.convert(_spec("zoi-cuda-fp8"), model, tmp_path)
    assert fp8["artifact"] != cpu["artifact"] and fp8["artifact"].endswith("fp8")
    texts = ["a short text", "and another one, a little longer"]
    a = zoi.load(cpu["artifact"], device="cpu").encode(texts)
    b = zoi.load(gpu["artifact"], device="reference").encode(texts)
    assert np.isfinite(a).all() and a.shape == b.shape
    assert float(np.min(np.sum(a * b, axis=1))) > 0.999  # the same INT8 model on two backends
