"""The H200 failure of test_default_quant_config_artifact_matches_reference[static-tiny-*]
(gpu_check_merged_20261201T144446Z: rel 0.0351 > 3e-2 at [2] * 64, normalised) is the fp16
storage of activations before a static quantisation, not a kernel fault: the interpreter gives
the same error on the same inputs, the CPU backend (fp32 activations) none, and the naive
fp16-storage emulation (cuda_helpers.fp16_storage_rel) within 2x of it. The same holds for
the errors the backend gave later (the default tiny artifact on the H200, the static one with
the pooled Gram in the interpreter), once the emulation stores fp16 at every site the backend
does: attention's output alone missed them by 16x and 40x."""

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
INTERP_BEFORE = ([1], [5, 1, 9], [32, 3, 17])  # test_backend's interpreter quant_lens
# (quantiser config, model size, cases drawn before, the case, normalised, the backend's rel)
FIGURES = [
    # the default quantiser's model: the H200 measured 0.0682 (gpu_check.sh test, main b424ad7,
    # 2026-12-02) with the SmoothQuant search of that tree, the interpreter 0.0682 too; with
    # today's search (pairwise-similarity score) the interpreter gives 0.02481 (the emulation
    # 0.02481; the CUDA backend under TRITON_INTERPRET=1 against the float64 reference)
    # (both figures: artifacts without the first-row residual, the quantiser's default then)
    (
        dict(first_row_residual=False),
        dict(max_tokens=512, max_batch=64),
        BEFORE[:3],
        [5, 1, 9, 32],
        False,
        0.0248,
    ),
    # the interpreter, static + shift with the pooled Gram: [static-tiny-True] gave 0.0704
    (
        dict(activations="static", smooth_shift=True, first_row_residual=False),
        dict(max_tokens=64),
        INTERP_BEFORE,
        [20, 20, 20],
        False,
        0.0704,
    ),
]


@pytest.mark.parametrize("config,size,before,lens,norm,backend_rel", FIGURES)
def test_fp16_storage_emulation_predicts_the_backends_errors(
    config, size, before, lens, norm, backend_rel
):
    """Numpy only: the emulation (fp16 at every storage site of the CUDA backend) is within
    2x of what the backend measured on these inputs, so _check's 2x bound covers it; rounding
    attention's output alone (the emulation before) gave 0.0016 and 0.0042 here."""
    model = default_quant_model(**size, **config)
    rng = np.random.default_rng(11)
    for b in before:
        batch(b, model.spec.vocab_size, rng)
    ids, pos, cu = batch(lens, model.spec.vocab_size, rng)
    naive = fp16_storage_rel(model, ids, pos, cu, norm)
    assert 0.5 * backend_rel < naive < 2 * backend_rel, (naive, backend_rel)


# the slow tier (~45 s in the interpreter: 64 sequences in a 128-token bucket); the default
# tier keeps the emulation's figures above and test_backend's static-tiny case, whose bound is
# this same 2x the naive fp16-storage emulation; scripts/gpu_check.sh runs it compiled
@pytest.mark.slow
def test_static_tiny_two_token_sequences_lose_what_fp16_storage_loses():
    from zoi.backends.cuda.backend import CudaBackend

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
