"""NaN never passes the CUDA backend's quantisers: every kernel that quantises (quantize.py, the
int8 / fp8 copies the producers write, the linear that quantises while loading) or writes the
per-row amax a quantiser reads gives a row holding a NaN a NaN a_scale / amax, so whatever is
computed from that row comes out NaN and the engine's non-finite check refuses it (an int8 code
cannot hold a NaN: the clamps make it a finite code). Rows without a NaN are bit-identical to
the same launch on NaN-free input.

The GPU's min / max drop a NaN (PTX max.f32: the other operand), which the interpreter's numpy
maximum would not: the `gpu_nan` fixture gives the interpreter the GPU's semantics, so these
tests fail on a kernel that relies on a clamp or a reduction to keep the NaN. Compiled on the
H200 by scripts/gpu_check.sh (ZOI_TRITON_COMPILED=1), where the fixture does nothing."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from tests import triton_mode  # noqa: E402
from tests.cuda_backend.cuda_helpers import batch, tiny_model  # noqa: E402
from tests.ops.helpers import DEV, poison, t  # noqa: E402

from zoi.errors import NumericalError  # noqa: E402

COMPILED = not triton_mode.interpreted()
pytestmark = pytest.mark.skipif(
    COMPILED and not torch.cuda.is_available(), reason="compiled Triton needs a CUDA GPU"
)


def _need_fp8(mode):
    if mode == "fp8" and COMPILED and torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("compiled FP8 Triton needs an sm_89+ GPU")


MODES = ["dynamic", "static", "dynamic_asym", "fp8"]
NAN = float("nan")


@pytest.fixture
def gpu_nan(monkeypatch):
    """The interpreter with the GPU's NaN semantics of tl.minimum / tl.maximum (maxnum: a NaN
    operand loses); its reductions (np.nanmax) already drop a NaN as the GPU's do."""
    if not COMPILED:
        from triton.runtime.interpreter import InterpreterBuilder as IB

        monkeypatch.setattr(IB, "create_maxnumf", lambda s, a, b: s.binary_op(a, b, np.fmax))
        monkeypatch.setattr(IB, "create_minnumf", lambda s, a, b: s.binary_op(a, b, np.fmin))


def test_the_fixture_drops_nan_like_the_gpu(gpu_nan):
    import triton
    import triton.language as tl

    @triton.jit
    def k(x_ptr, y_ptr, z_ptr):
        x = tl.load(x_ptr + tl.arange(0, 4))
        tl.store(y_ptr + tl.arange(0, 4), tl.minimum(tl.maximum(x, -1.0), 1.0))
        tl.store(z_ptr + tl.arange(0, 4), tl.maximum(x, 0.0, propagate_nan=tl.PropagateNan.ALL))

    x = t(np.array([NAN, 2.0, -3.0, 0.5], np.float32))
    y, z = poison((4,), torch.float32), poison((4,), torch.float32)
    k[(1,)](x, y, z)
    y, z = y.cpu().numpy(), z.cpu().numpy()
    assert np.isfinite(y).all()  # a plain clamp makes a NaN a finite value, here as on the GPU
    assert np.isnan(z[0]) and np.isfinite(z[1:]).all()


def _qbufs(T, K, mode):
    if mode == "fp8":
        q = torch.full((T, K), 0x7F, dtype=torch.uint8, device=DEV).view(torch.float8_e4m3fn)
    else:
        q = torch.full((T, K), 99, dtype=torch.int8, device=DEV)
    return q, poison((T,), torch.float32), torch.full((T,), -7, dtype=torch.int32, device=DEV)


def _np(q, qs, qz):
    q = q.view(torch.uint8) if q.dtype == torch.float8_e4m3fn else q
    return q.cpu().numpy(), qs.cpu().numpy(), qz.cpu().numpy()


def _assert_poisoned(clean, dirty, bad, mode):
    """dirty: the copy of the NaN input; rows in bad have a NaN a_scale, the others equal the
    clean run's copy, a_scale and zero point bit for bit."""
    (q0, s0, z0), (q1, s1, z1) = clean, dirty
    assert np.isfinite(s0).all()
    assert np.isnan(s1[bad]).all(), (mode, s1)
    good = np.setdiff1d(np.arange(len(s0)), bad)
    np.testing.assert_array_equal(s1[good], s0[good])
    np.testing.assert_array_equal(q1[good], q0[good])
    if mode == "dynamic_asym":
        np.testing.assert_array_equal(z1[good], z0[good])


def _transform(K, tr, seed=0):
    rng = np.random.default_rng(seed)
    shift = t((0.3 * rng.standard_normal(K)).astype(np.float32)) if "shift" in tr else None
    mul = t((0.5 + rng.random(K)).astype(np.float32)) if "mul" in tr else None
    return shift, mul


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("tr", ["none", "shift+mul"])
def test_quantize_kernel_poisons_nan_rows(gpu_nan, mode, tr):
    _need_fp8(mode)
    from zoi.backends.cuda.kernels import quantize as k_q

    T, K = 7, 37
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((T, K)) * 2).astype(np.float16)
    xn = x.copy()
    bad = [1, 3, 4]
    xn[1, 0], xn[3, K - 1], xn[4, 17] = NAN, NAN, NAN  # first, last, middle column
    shift, mul = _transform(K, tr)
    runs = []
    for v in (x, xn):
        q, qs, qz = _qbufs(T, K, mode)
        k_q.launch_quantize(t(v), shift, mul, q, qs, qz, T, K, mode=mode, static_amax=3.0)
        runs.append(_np(q, qs, qz))
    _assert_poisoned(*runs, bad, mode)


@pytest.mark.parametrize("mode", ["dynamic", "static"])
def test_inf_keeps_its_meaning(gpu_nan, mode):
    """Inf is no NaN: the dynamic scale of a row with an Inf is infinite (a non-finite output),
    the static scheme saturates it (zoi.numerics.primitives)."""
    from zoi.backends.cuda.kernels import quantize as k_q
    from zoi.numerics import primitives as qp

    x = np.random.default_rng(2).standard_normal((3, 20)).astype(np.float16)
    x[1, 4] = np.inf
    q, qs, qz = _qbufs(3, 20, mode)
    k_q.launch_quantize(t(x), None, None, q, qs, qz, 3, 20, mode=mode, static_amax=3.0)
    q, qs, _ = _np(q, qs, qz)
    if mode == "dynamic":
        assert np.isinf(qs[1]) and np.isfinite(qs[[0, 2]]).all()
    else:
        wq, ws = qp.quantize_act(x.astype(np.float32), 3.0)
        np.testing.assert_array_equal(q, wq)
        np.testing.assert_array_equal(qs, ws)


# ---- the producers' copies and amax rows ----------------------------------------------------
T_, H_ = 6, 40
BAD = [2]


def _embed(xq_kw, amax, nan):
    from zoi.backends.cuda.kernels import embed as k_embed

    rng = np.random.default_rng(3)
    V = 11
    word = rng.standard_normal((V, H_)).astype(np.float16)
    if nan:
        word[7, 31] = NAN
    ids = np.array([1, 3, 7, 2, 9, 4], np.int32)  # row 2 reads word row 7
    pos = np.arange(T_, dtype=np.int32)
    pe = (0.1 * rng.standard_normal((T_, H_))).astype(np.float16)
    lnw = (1 + 0.1 * rng.standard_normal(H_)).astype(np.float32)
    lnb = (0.1 * rng.standard_normal(H_)).astype(np.float32)
    x = poison((T_, H_), torch.float16)
    k_embed.launch_embed(
        t(ids), t(pos), t(word), None, t(pe), None, t(lnw), t(lnb), x, amax, None, T_, H_,
        0, T_, 1e-12, **xq_kw,
    )  # fmt: skip


def _inputs(nan, cols, seed=4):
    x = np.random.default_rng(seed).standard_normal((T_, cols)).astype(np.float16)
    if nan:
        x[2, cols - 3] = NAN
    return x


def _add_ln(xq_kw, amax, nan):
    from zoi.backends.cuda.kernels import layernorm as k_ln

    x, r = _inputs(nan, H_), _inputs(False, H_, 5)
    w = np.ones(H_, np.float32)
    y = poison((T_, H_), torch.float16)
    k_ln.launch_add_layernorm(t(x), t(r), t(w), t(0 * w), y, amax, T_, H_, 1e-12, **xq_kw)


def _glu(xq_kw, amax, nan):
    from zoi.backends.cuda.kernels import glu as k_glu

    n = H_
    x = _inputs(False, 2 * n)
    if nan:
        x[2, 37] = NAN  # in the third 16-column chunk: the statistics fold over the chunks
    y = poison((T_, n), torch.float16)
    cfg = dict(BLOCK_R=4, BLOCK_C=16, num_warps=4)
    k_glu.launch_glu(t(x), y, amax, T_, n, "gelu", cfg=cfg, **xq_kw)


PRODUCERS = {"embed": _embed, "add_layernorm": _add_ln, "glu": _glu}


@pytest.mark.parametrize("producer", list(PRODUCERS))
@pytest.mark.parametrize("mode", MODES)
def test_producer_copies_poison_nan_rows(gpu_nan, producer, mode):
    _need_fp8(mode)
    runs, amaxes = [], []
    for nan in (False, True):
        q, qs, qz = _qbufs(T_, H_, mode)
        pre = "x" if producer == "embed" else "y"
        kw = {f"{pre}q": q, f"{pre}q_scale": qs, f"{pre}q_zp": qz, "q_mode": mode}
        kw["q_static_amax"] = 3.0
        amax = torch.zeros(T_, dtype=torch.float32, device=DEV)
        PRODUCERS[producer](kw, amax, nan)
        runs.append(_np(q, qs, qz))
        amaxes.append(amax.cpu().numpy())
    _assert_poisoned(*runs, BAD, mode)
    a0, a1 = amaxes
    assert np.isfinite(a0).all() and np.isnan(a1[BAD]).all()
    np.testing.assert_array_equal(np.delete(a1, BAD), np.delete(a0, BAD))


def test_linear_atomic_amax_keeps_nan(gpu_nan):
    from zoi.backends.cuda.kernels import linear as k_lin

    M, N, K = T_, 40, 24
    rng = np.random.default_rng(9)
    w = (0.3 * rng.standard_normal((N, K))).astype(np.float16)
    b = np.zeros(N, np.float32)
    out = []
    for nan in (False, True):
        amax = torch.zeros(M, dtype=torch.float32, device=DEV)
        y = poison((M, N), torch.float16)
        cfg = dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=32, GROUP_M=8, num_warps=4, num_stages=1)
        k_lin.launch_linear(
            t(_inputs(nan, K)), None, t(w), None, t(b), None, y, amax, M, N, K, quant=0, cfg=cfg,
        )  # fmt: skip
        out.append(amax.cpu().numpy())
    assert np.isfinite(out[0]).all() and np.isnan(out[1][BAD]).all()
    np.testing.assert_array_equal(np.delete(out[1], BAD), np.delete(out[0], BAD))


@pytest.mark.parametrize("variant", ["plain", "rope"])
def test_attention_amax_keeps_nan(gpu_nan, variant):
    """A NaN in one token's v reaches every query of its sequence: their amax rows are NaN,
    the other sequence's are untouched."""
    from zoi.backends.cuda.kernels import attention as k_attn

    heads, d = 2, 8
    H = heads * d
    cu = np.array([0, 4, T_], np.int32)
    hdr = np.array([0, 2, T_, 0], np.int32)
    rng = np.random.default_rng(10)
    qkv0 = rng.standard_normal((T_, 3 * H)).astype(np.float16)
    ext = {}
    if variant == "rope":
        ang = np.arange(T_)[:, None] * (0.3 ** np.arange(d // 2))[None, :]
        ext = dict(cos=t(np.cos(ang).astype(np.float32)), sin=t(np.sin(ang).astype(np.float32)))
    out = []
    for nan in (False, True):
        qkv = qkv0.copy()
        if nan:
            qkv[1, 2 * H + 3] = NAN  # v of token 1 (sequence 0), head 0
        cfg = k_attn.pick_config(T_, d)
        tcum = torch.full((2,), -1, dtype=torch.int32, device=DEV)
        k_attn.launch_tiles(t(hdr), t(cu), tcum, 2, cfg)
        o = poison((T_, H), torch.float16)
        amax = torch.zeros(T_, dtype=torch.float32, device=DEV)
        k_attn.launch_attention(
            t(qkv), t(hdr), t(cu), tcum, o, amax, T_, 2, heads, d, 0.35, cfg=cfg, **ext
        )
        out.append(amax.cpu().numpy())
    assert np.isfinite(out[0]).all()
    assert np.isnan(out[1][:4]).all()
    np.testing.assert_array_equal(out[1][4:], out[0][4:])


# ---- the linear that quantises while loading (QUANT 1 / 2) -----------------------------------
@pytest.mark.parametrize("quant", [1, 2])
def test_in_loop_quantising_linear_gives_nan_rows(gpu_nan, quant):
    """QUANT 1 reads the producer's (NaN) amax, QUANT 2 (static) checks A itself: a NaN in the
    last K block of a row makes that output row NaN; the others are unchanged."""
    from zoi.backends.cuda.kernels import linear as k_lin
    from zoi.numerics import primitives as qp

    M, N, K = T_, 20, 70
    rng = np.random.default_rng(11)
    w_q, w_s = qp.quantize_weight((0.2 * rng.standard_normal((N, K))).astype(np.float32))
    b = np.zeros(N, np.float32)
    out = []
    for nan in (False, True):
        a = _inputs(nan, K)
        am = np.abs(a.astype(np.float32)).max(axis=1)  # NaN for the NaN row (the producer's)
        y = poison((M, N), torch.float32)
        cfg = dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=32, GROUP_M=8, num_warps=4, num_stages=1)
        k_lin.launch_linear(
            t(a), t(am), t(w_q), t(w_s), t(b), None, y, None, M, N, K, quant=quant,
            static_amax=3.0, cfg=cfg,
        )  # fmt: skip
        out.append(y.cpu().numpy())
    assert np.isfinite(out[0]).all()
    assert np.isnan(out[1][BAD]).all()
    np.testing.assert_array_equal(np.delete(out[1], BAD, 0), np.delete(out[0], BAD, 0))


def test_max_pool_keeps_nan(gpu_nan):
    from zoi.backends.cuda.kernels import pool as k_pool

    H = 12
    x = np.random.default_rng(12).standard_normal((T_, H)).astype(np.float16)
    x[1, 5] = NAN
    cu = np.array([0, 3, T_], np.int32)
    p = poison((2, H), torch.float32)
    k_pool.launch_pool(t(x), t(cu), t(np.array([0, 2, T_, 0], np.int32)), p, 2, H, "max")
    p = p.cpu().numpy()
    assert np.isnan(p[0, 5]) and np.isfinite(np.delete(p[0], 5)).all()
    np.testing.assert_array_equal(p[1], x[3:].astype(np.float32).max(axis=0))


# ---- the whole forward --------------------------------------------------------------------------
def test_static_int8_cls_model_refuses_a_nan_token(gpu_nan):
    """A static INT8 BERT with CLS pooling, a NaN in the embedding of a token that is not the
    CLS: the NaN used to stop at the first int8 copy (finite codes, finite static scale) and the
    CLS row came out finite. Now the sequence's output is NaN and wait() raises; the other
    sequence's output is unchanged."""
    from zoi.backends.cuda.backend import CudaBackend

    model = tiny_model("int8", max_tokens=16, pooling="cls", default="static")
    be = CudaBackend(model, interpret=None if COMPILED else True, buckets=[16], persistent_max=0)
    _, pos, cu = batch([5, 4])
    ids = np.array([1, 5, 9, 6, 7, 1, 8, 3, 4], np.int32)  # token 9 only at row 2
    want = be.run(ids, pos, cu, False)
    assert np.isfinite(want).all()
    word = be.w["embed.word"]
    saved = word.clone()
    word[9, 3] = NAN
    if be.dev.startswith("cuda"):
        torch.cuda.synchronize()
    try:
        got = be.run(ids, pos, cu, False)
        assert np.isnan(got[0]).all()
        np.testing.assert_array_equal(got[1], want[1])
        with pytest.raises(NumericalError, match="NaN/Inf"):
            be.wait(be.submit(ids, pos, cu, False, np.empty_like(want)))
    finally:
        word.copy_(saved)
