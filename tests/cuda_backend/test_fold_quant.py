"""The quantize launch folded into the consumer's GEMM (linear QUANT 16: the small
buckets' plan has no quantize launches): bit-identical to quantize_kernel + the QUANT 4 GEMM
on the same fp16 input, for every int8 mode and SmoothQuant transform, on awkward shapes (one
row, K not a multiple of BLOCK_K, N not a multiple of BLOCK_N), with the output poisoned before
each launch; a row holding a NaN comes out NaN (and only that row); and the GEMM agrees with
the integer-exact numpy emulation. Interpreter in CI, compiled on the H200 (gpu_check.sh)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from tests import triton_mode  # noqa: E402
from tests.ops.helpers import DEV, poison, t  # noqa: E402

from zoi.numerics import primitives as qp  # noqa: E402

COMPILED = not triton_mode.interpreted()
pytestmark = pytest.mark.skipif(
    COMPILED and not torch.cuda.is_available(), reason="compiled Triton needs a CUDA GPU"
)

MODES = ["dynamic", "static", "dynamic_asym"]
STATIC_AMAX = 2.5


def _case(M, N, K, tr, seed):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((M, K)) * 1.5 + 0.3).astype(np.float16)
    w = (rng.standard_normal((N, K)) / np.sqrt(K)).astype(np.float32)
    w_q, w_s = qp.quantize_weight(w)
    b = (0.1 * rng.standard_normal(N)).astype(np.float32)
    shift = (0.3 * rng.standard_normal(K)).astype(np.float32) if "shift" in tr else None
    mul = (0.5 + rng.random(K)).astype(np.float32) if "mul" in tr else None
    return x, w_q, w_s.astype(np.float32), b, shift, mul


def _fold(x, w_q, w_s, b, shift, mul, mode, cfg=None):
    from zoi.backends.cuda.kernels import linear as k_lin

    M, K = x.shape
    N = w_q.shape[0]
    y = poison((M, N), torch.float16)
    k_lin.launch_linear(
        t(x), None, t(w_q), t(w_s), t(b), None, None, None, y, None, M, N, K,
        quant=16, static_amax=STATIC_AMAX, cfg=cfg, in_mode=mode,
        in_shift=t(shift) if shift is not None else None,
        in_mul=t(mul) if mul is not None else None,
        colsum=t(qp.weight_colsum(w_q).astype(np.int32)) if mode == "dynamic_asym" else None,
    )  # fmt: skip
    return y.float().cpu().numpy()


def _two_launches(x, w_q, w_s, b, shift, mul, mode):
    """quantize_kernel, then the QUANT 4 GEMM on its copy (what the fused plan runs)."""
    from zoi.backends.cuda.kernels import linear as k_lin
    from zoi.backends.cuda.kernels import quantize as k_q

    M, K = x.shape
    N = w_q.shape[0]
    q = torch.full((M, K), 99, dtype=torch.int8, device=DEV)
    qs = poison((M,), torch.float32)
    qz = torch.full((M,), -7, dtype=torch.int32, device=DEV)
    k_q.launch_quantize(
        t(x), t(shift) if shift is not None else None, t(mul) if mul is not None else None,
        q, qs, qz, M, K, mode=mode, static_amax=STATIC_AMAX,
    )  # fmt: skip
    y = poison((M, N), torch.float16)
    asym = mode == "dynamic_asym"
    k_lin.launch_linear(
        q, qs, t(w_q), t(w_s), t(b), None, None, None, y, None, M, N, K, quant=4,
        a_zp=qz if asym else None,
        colsum=t(qp.weight_colsum(w_q).astype(np.int32)) if asym else None,
    )  # fmt: skip
    return y.float().cpu().numpy()


def _emulated(x, w_q, w_s, b, shift, mul, mode):
    """numpy: the consumer's transform, per-token quantisation, the exact integer sum."""
    v = x.astype(np.float32)
    if shift is not None:
        v = v - shift
    if mul is not None:
        v = v * mul
    if mode == "dynamic_asym":
        q, scale, zp = qp.quantize_act_asym(v)
        acc = qp.int8_matmul_asym_exact(q, zp, w_q)
    else:
        amax = STATIC_AMAX if mode == "static" else None
        q, scale = qp.quantize_act(v, amax) if amax is not None else qp.quantize_act(v)
        acc = q.astype(np.int64) @ w_q.astype(np.int64).T
    scale = np.asarray(scale, np.float64).reshape(-1, 1)
    return acc.astype(np.float64) * scale * w_s.astype(np.float64)[None, :] + b


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("tr", ["none", "mul", "shift+mul"])
@pytest.mark.parametrize("shape", [(1, 24, 40), (7, 100, 200), (33, 48, 384)])
def test_fold_is_bit_identical_to_quantize_then_gemm(mode, tr, shape):
    M, N, K = shape
    args = _case(M, N, K, tr, seed=M + N + K)
    got = _fold(*args, mode)
    want = _two_launches(*args, mode)
    assert np.isfinite(got).all(), "output not fully written"
    np.testing.assert_array_equal(got, want)
    emu = _emulated(*args, mode)
    err = np.linalg.norm(got - emu) / np.linalg.norm(emu)
    assert err < 2e-3, err  # the fp16 store of y only


@pytest.mark.parametrize("mode", MODES)
def test_fold_over_several_k_tiles_and_a_nan_row(mode):
    """BLOCK_K 32 over K 200 (7 tiles, the last partial): the statistics of the whole row,
    not of one tile; a NaN in row 2 makes that row NaN and leaves the others bit-identical."""
    from zoi.backends.cuda.kernels import linear as k_lin

    M, N, K = 9, 40, 200
    x, w_q, w_s, b, shift, mul = _case(M, N, K, "shift+mul", seed=5)
    cfg = k_lin.pick_config(M, N, K, True, False, prequant=False)
    cfg = dict(cfg, BLOCK_K=32, BLOCK_N=16, BLOCK_M=16)
    clean = _fold(x, w_q, w_s, b, shift, mul, mode, cfg=cfg)
    np.testing.assert_array_equal(clean, _two_launches(x, w_q, w_s, b, shift, mul, mode))
    xn = x.copy()
    xn[2, 150] = np.nan
    dirty = _fold(xn, w_q, w_s, b, shift, mul, mode, cfg=cfg)
    assert np.isnan(dirty[2]).all()
    np.testing.assert_array_equal(np.delete(dirty, 2, 0), np.delete(clean, 2, 0))


def test_small_plan_without_quantize_launches_gives_the_same_embeddings():
    """Every scheme and transform (cuda_helpers.MIXED) through the whole backend: the small
    plan with the fold (CudaOptions.fold_quant; off by default: slower) has no quantize launch and returns the embeddings of the
    plan with quantize launches (fold_quant=False) bit for bit; each fold is in the notes."""
    from tests.cuda_backend.cuda_helpers import MIXED, batch, tiny_model

    from zoi.backends.cuda.backend import CudaBackend
    from zoi.backends.cuda.options import CudaOptions

    model = tiny_model("int8", max_tokens=64, **MIXED)

    def build(fold):
        return CudaBackend(
            model, interpret=None if COMPILED else True, buckets=[16, 64], fuse_min_tokens=64,
            options=CudaOptions(fold_quant=fold, persistent="off"),
        )  # fmt: skip

    on, off = build(True), build(False)
    small_on, small_off = on.plan_for(16), off.plan_for(16)
    kinds = lambda p: [la.kind for la in p["launches"]]  # noqa: E731
    n_q = kinds(small_off).count("quantize")
    assert n_q == 3 and kinds(small_on).count("quantize") == 0
    assert len(kinds(small_on)) == len(kinds(small_off)) - n_q
    assert sum("consumer's GEMM" in v for v in small_on["notes"].values()) == n_q
    assert kinds(on.plan_for(64)) == kinds(off.plan_for(64))  # the fused plan: unchanged
    rng = np.random.default_rng(11)
    for lens in ([16], [3, 9, 1], [5, 5]):
        ids, pos, cu = batch(lens, model.spec.vocab_size, rng)
        a = on.run(ids, pos, cu, True)
        b = off.run(ids, pos, cu, True)
        assert np.isfinite(a).all()
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("precision", ["int8", "fp16"])
def test_small_plan_with_fused_layernorm(precision):
    """CudaOptions.fuse_ln_small: the IR's LN fusions in the small plan too (o + LN, ffn2 + LN:
    two launches fewer per layer), the copies for qkv / ffn1 then written by the linear + LN;
    the embeddings agree with the unfused small plan to fp16 accuracy (LN on fp32 y instead of
    its fp16 store) and with the reference backend."""
    from tests.cuda_backend.cuda_helpers import MIXED, batch, min_cosine, tiny_model

    from zoi.backends.cuda.backend import CudaBackend
    from zoi.backends.cuda.options import CudaOptions
    from zoi.backends.reference import ReferenceBackend

    kw = MIXED if precision == "int8" else {}
    model = tiny_model(precision, max_tokens=64, **kw)

    def build(ln):
        return CudaBackend(
            model, interpret=None if COMPILED else True, buckets=[16, 64], fuse_min_tokens=64,
            options=CudaOptions(fuse_ln_small=ln, persistent="off"),
        )  # fmt: skip

    on, off = build(True), build(False)
    L = model.spec.layers
    n_on, n_off = len(on.plan_for(16)["launches"]), len(off.plan_for(16)["launches"])
    assert n_on == n_off - 2 * L, (n_on, n_off)
    assert sum(la.ln is not None for la in on.plan_for(16)["launches"]) == 2 * L
    ref = ReferenceBackend(model)
    rng = np.random.default_rng(3)
    for lens in ([16], [2, 7, 4]):
        ids, pos, cu = batch(lens, model.spec.vocab_size, rng)
        a, b = on.run(ids, pos, cu, True), off.run(ids, pos, cu, True)
        want = ref.run(ids, pos, cu, True)
        assert np.isfinite(a).all()
        assert min_cosine(a, b) > 0.9999 and min_cosine(a, want) > 0.999, (
            min_cosine(a, b), min_cosine(a, want))  # fmt: skip
