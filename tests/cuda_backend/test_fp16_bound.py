"""The H200 failure of test_default_quant_config_artifact_matches_reference[static-tiny-*]
(gpu_check_merged_20261201T144446Z: rel 0.0351 > 3e-2 at [2] * 64, normalised) is the fp16
storage of activations before a static quantisation, not a kernel fault: the interpreter gives
the same error on the same inputs, the CPU backend (fp32 activations) none, and the naive
fp16-storage emulation (cuda_helpers.fp16_storage_rel) within 2x of it."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from tests import triton_mode  # noqa: E402
from tests.cuda_backend.cuda_helpers import (  # noqa: E402
    batch,
    default_quant_model,
    fp16_storage_rel,
    rel,
)

from zoi.backends.reference import ReferenceBackend  # noqa: E402

COMPILED = not triton_mode.interpreted()
pytestmark = pytest.mark.skipif(
    COMPILED and not torch.cuda.is_available(), reason="compiled Triton needs a CUDA GPU"
)
# the compiled test's cases before the failing one (the batches draw from one generator)
BEFORE = ([1], [16], [17], [5, 1, 9, 32], [32] * 12 + [3])


def test_static_tiny_two_token_sequences_lose_what_fp16_storage_loses():
    from zoi.backends.cuda.backend import CudaBackend
    from zoi.backends.cuda.options import CudaOptions

    model = default_quant_model(
        max_tokens=128, max_batch=64, activations="static", smooth_shift=True
    )
    rng = np.random.default_rng(11)
    for lens in BEFORE:
        batch(lens, model.spec.vocab_size, rng)
    ids, pos, cu = batch([2] * 64, model.spec.vocab_size, rng)
    be = CudaBackend(
        model,
        interpret=None if COMPILED else True,
        options=CudaOptions(fuse_min_tokens=128),
        buckets=[128],
    )
    ref = ReferenceBackend(model, dtype=np.float64)
    for norm in (False, True):
        got, want = be.run(ids, pos, cu, norm), ref.run(ids, pos, cu, norm)
        naive = fp16_storage_rel(model, ids, pos, cu, norm)
        e = rel(got, want)
        assert np.isfinite(got).all() and 0.5 * naive < e < 2 * naive, (norm, e, naive)
    try:
        from zoi.backends.cpu import CpuBackend
    except ImportError:
        return
    cpu = CpuBackend(model, nthreads=1)  # fp32 activations: the reference's quantisation
    assert rel(cpu.run(ids, pos, cu, True), ref.run(ids, pos, cu, True)) < 1e-3
