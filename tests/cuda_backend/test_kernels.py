"""Each Triton kernel of backends/cuda/kernels against zoi.numerics.reference (float64).

Runs under TRITON_INTERPRET=1 on the CPU (CI) with small, awkward shapes (1 token, primes,
hidden sizes that are not powers of two); on a GPU (ZOI_TRITON_COMPILED=1) the same tests
run compiled. Outputs are poisoned with NaN first: an unwritten element fails.
Tolerances: relative Frobenius error against float64; fp16 storage of activations puts a
naive fp16 implementation near 5e-4..1e-3, so 3e-3 is the bar (about 2x + margin);
INT8 linears are compared against the integer-exact emulation (zoi.numerics.primitives) run on
the same fp16-rounded activations, where only float epilogue rounding differs.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from zoi.backends.cuda.kernels import attention as k_attn  # noqa: E402
from zoi.backends.cuda.kernels import embed as k_embed  # noqa: E402
from zoi.backends.cuda.kernels import layernorm as k_ln  # noqa: E402
from zoi.backends.cuda.kernels import linear as k_lin  # noqa: E402
from zoi.backends.cuda.kernels import pool as k_pool  # noqa: E402
from zoi.backends.cuda.kernels import quantize as k_q  # noqa: E402
from zoi.numerics import primitives as qp  # noqa: E402
from zoi.numerics import reference as ref  # noqa: E402

DEV = (
    "cuda"
    if (torch.cuda.is_available() and __import__("os").environ.get("TRITON_INTERPRET") != "1")
    else "cpu"
)


def t(a, dtype=None):
    x = torch.from_numpy(np.ascontiguousarray(a))
    if dtype is not None:
        x = x.to(dtype)
    return x.to(DEV)


def poison(shape, dtype):
    return torch.full(shape, float("nan"), dtype=dtype, device=DEV)


def rel(out, want) -> float:
    out = np.asarray(out, np.float64)
    want = np.asarray(want, np.float64)
    assert np.isfinite(out).all(), "non-finite output (unwritten or NaN)"
    return float(np.linalg.norm(out - want) / max(np.linalg.norm(want), 1e-30))


def f16(a):
    return np.asarray(a, np.float32).astype(np.float16).astype(np.float64)


def _rand(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


QMODES = ["dynamic", "static", "dynamic_asym"]
TRANSFORMS = ["none", "mul", "shift+mul"]


def _transform(rng, K, tr):
    """Random act_shift / act_mul of a consumer (as zoi.quant writes them), numpy."""
    shift = (0.3 * rng.standard_normal(K)).astype(np.float32) if "shift" in tr else None
    mul = (0.5 + rng.random(K)).astype(np.float32) if "mul" in tr else None
    return shift, mul


def _qbufs(T, K):
    """Poisoned int8 copy / a_scale / zero point outputs."""
    return (
        torch.full((T, K), 99, dtype=torch.int8, device=DEV),
        poison((T,), torch.float32),
        torch.full((T,), -7, dtype=torch.int32, device=DEV),
    )


def _qargs(mode, shift, mul, static_amax, q, qs, qz, pre):
    return {
        f"{pre}q": q,
        f"{pre}q_scale": qs,
        f"{pre}q_zp": qz,
        "q_mode": mode,
        "q_shift": None if shift is None else t(shift),
        "q_mul": None if mul is None else t(mul),
        "q_static_amax": static_amax,
    }


def _assert_quant(x, mode, shift, mul, static_amax, q, qs, qz):
    """The int8 copy (asymmetric: q_u8 - 128), a_scale and zp bit-exact against
    zoi.numerics.primitives on x (float32, the values the kernel stored), after the transform."""
    xt = qp.act_transform(np.asarray(x, np.float32), shift, mul)
    q, qs, qz = q.cpu().numpy(), qs.cpu().numpy(), qz.cpu().numpy()
    assert np.isfinite(qs).all()
    if mode == "dynamic_asym":
        wq, ws, wz = qp.quantize_act_asym(xt)
        np.testing.assert_array_equal(q.astype(np.int32) + 128, wq.astype(np.int32))
        np.testing.assert_array_equal(qz, wz)
    else:
        wq, ws = qp.quantize_act(xt, static_amax if mode == "static" else None)
        np.testing.assert_array_equal(q, wq)
    np.testing.assert_array_equal(qs, ws)


def _awkward_rows(x):
    """Rows that stress the row statistics: all zero, all positive, all negative, one value."""
    T = x.shape[0]
    if T >= 4:
        x[1] = 0.0
        x[2] = np.abs(x[2]) + 0.01
        x[3] = -np.abs(x[3]) - 0.01
    if T >= 5:
        x[4] = 0.0
        x[4, -1] = -2.5
    return x


@pytest.mark.parametrize("T,K", [(1, 24), (13, 100), (37, 130)])
@pytest.mark.parametrize("mode", QMODES)
@pytest.mark.parametrize("tr", TRANSFORMS)
def test_quantize_kernel(T, K, mode, tr):
    rng = np.random.default_rng(T * 31 + K + len(tr) + QMODES.index(mode) * 7)
    x = _awkward_rows(_rand(rng, T, K, scale=2.0)).astype(np.float16)
    shift, mul = _transform(rng, K, tr)
    q, qs, qz = _qbufs(T, K)
    k_q.launch_quantize(
        t(x),
        None if shift is None else t(shift),
        None if mul is None else t(mul),
        q,
        qs,
        qz,
        T,
        K,
        mode=mode,
        static_amax=3.0,
    )
    _assert_quant(x, mode, shift, mul, 3.0, q, qs, qz)
    if mode != "dynamic_asym":
        assert (qz.cpu().numpy() == -7).all()  # no zero point written


@pytest.mark.parametrize("M,N,K", [(1, 40, 24), (7, 72, 100), (33, 130, 96)])
@pytest.mark.parametrize("act", ["none", "gelu", "gelu_tanh", "relu", "sigmoid"])
def test_linear_fp16(M, N, K, act):
    rng = np.random.default_rng(M * 1000 + N + K)
    x, w, b = _rand(rng, M, K), _rand(rng, N, K, scale=K**-0.5), _rand(rng, N, scale=0.1)
    r = _rand(rng, M, N)
    y = poison((M, N), torch.float16)
    k_lin.launch_linear(
        t(x, torch.float16),
        None,
        t(w, torch.float16),
        None,
        t(b),
        t(r, torch.float16),
        None,
        None,
        y,
        None,
        M,
        N,
        K,
        quant=0,
        act=act,
    )
    want = ref.linear(f16(x), f16(w), b.astype(np.float64), act, f16(r))
    assert rel(y.float().cpu().numpy(), want) < 3e-3


def _int8_want(x16, w_q, w_s, b, act, r=None, amax=None):
    """Emulated INT8 linear on the fp16-rounded input, float64 epilogue."""
    y = qp.linear_int8_emulated(x16.astype(np.float32), w_q, w_s, b, amax).astype(np.float64)
    y = ref.activation(y, act)
    return y if r is None else y + r


@pytest.mark.parametrize("M,N,K", [(1, 40, 24), (5, 72, 200), (37, 96, 130)])
@pytest.mark.parametrize("static", [False, True])
def test_linear_int8(M, N, K, static):
    rng = np.random.default_rng(M + N * 7 + K * 13 + static)
    x = _rand(rng, M, K, scale=2.0)
    if M > 1:
        x[M // 2] = 0.0  # amax 0 row: q = 0, scale 0
    w_q, w_s = qp.quantize_weight(_rand(rng, N, K))
    b = _rand(rng, N, scale=0.1)
    x16 = f16(x)
    amax_in = np.abs(x16).max(axis=1).astype(np.float32)
    static_amax = 3.0 if static else 0.0
    y = poison((M, N), torch.float16)
    amax_out = torch.zeros(M, dtype=torch.float32, device=DEV)
    k_lin.launch_linear(
        t(x16.astype(np.float16)),
        t(amax_in),
        t(w_q),
        t(w_s),
        t(b),
        None,
        None,
        None,
        y,
        amax_out,
        M,
        N,
        K,
        quant=2 if static else 1,
        act="gelu",
        static_amax=static_amax,
        amax_out_mode=1,
    )
    want = _int8_want(x16, w_q, w_s, b, "gelu", amax=static_amax if static else None)
    got = y.float().cpu().numpy()
    assert rel(got, want) < 2e-3
    np.testing.assert_allclose(amax_out.cpu().numpy(), np.abs(got).max(axis=1), rtol=0, atol=0)


def test_linear_int8_exact_accumulation():
    """Integer part bit-exact: w_scale = 1, a power-of-two amax, no bias -> y == the int sum."""
    rng = np.random.default_rng(5)
    M, N, K = 9, 24, 300
    q = rng.integers(-127, 128, size=(M, K)).astype(np.float32)
    q[:, 0] = 127.0  # amax = 127 -> inv = 1, a_scale = 1
    w_q = rng.integers(-127, 128, size=(N, K)).astype(np.int8)
    y = poison((M, N), torch.float32)
    k_lin.launch_linear(
        t(q, torch.float16),
        t(np.full(M, 127.0, np.float32)),
        t(w_q),
        t(np.ones(N, np.float32)),
        t(np.zeros(N, np.float32)),
        None,
        None,
        None,
        y,
        None,
        M,
        N,
        K,
        quant=1,
    )
    exact = qp.int8_matmul_exact(q.astype(np.int8), w_q).astype(np.float64)
    np.testing.assert_array_equal(y.cpu().numpy().astype(np.float64), exact)


def _launch_q4(a8, scale, zp, w_q, w_s, b, y, M, N, K, act="none", r=None):
    k_lin.launch_linear(
        t(a8),
        t(scale),
        t(w_q),
        t(w_s),
        t(b),
        r,
        None,
        None,
        y,
        None,
        M,
        N,
        K,
        quant=4,
        act=act,
        a_zp=None if zp is None else t(zp),
        colsum=None if zp is None else t(w_q.astype(np.int64).sum(1).astype(np.int32)),
    )


@pytest.mark.parametrize("M,N,K", [(1, 40, 24), (5, 72, 200), (37, 96, 130)])
@pytest.mark.parametrize("scheme", ["dynamic", "dynamic_asym"])
def test_linear_int8_prequantised(M, N, K, scheme):
    """QUANT 4: A is the int8 copy a producer wrote (asymmetric: q_u8 - 128, zp, colsum)."""
    rng = np.random.default_rng(M + N + K + len(scheme))
    x = _awkward_rows(_rand(rng, M, K, scale=2.0))
    w_q, w_s = qp.quantize_weight(_rand(rng, N, K))
    b, r = _rand(rng, N, scale=0.1), _rand(rng, M, N)
    if scheme == "dynamic_asym":
        q, scale, zp = qp.quantize_act_asym(x)
        a8 = (q.astype(np.int16) - 128).astype(np.int8)
        lin = qp.linear_int8_asym_emulated(x, w_q, w_s, b)
    else:
        (a8, scale), zp = qp.quantize_act(x), None
        lin = qp.linear_int8_emulated(x, w_q, w_s, b, None)
    y = poison((M, N), torch.float16)
    _launch_q4(a8, scale, zp, w_q, w_s, b, y, M, N, K, "gelu", t(r, torch.float16))
    want = ref.activation(lin.astype(np.float64), "gelu") + f16(r)
    assert rel(y.float().cpu().numpy(), want) < 2e-3


@pytest.mark.parametrize("a_kind", ["int8_asym", "fp16"])
@pytest.mark.parametrize(
    "M,N,K,bm,bn", [(1, 40, 24, 16, 16), (37, 200, 72, 16, 64), (19, 96, 130, 32, 32)]
)
@pytest.mark.parametrize(
    "qmode,tr",
    [
        ("dynamic_asym", "mul"),
        ("dynamic_asym", "shift+mul"),
        ("dynamic", "none"),
        ("static", "mul"),
    ],
)
def test_linear_rowq_writes_int8_copy(a_kind, M, N, K, bm, bn, qmode, tr):
    """ROWQ: a linear without LN writes the int8 copy of its (fp16-stored) output for the next
    INT8 linear (ffn1 -> ffn2): each program owns BLOCK_M whole rows, loops over the N tiles
    (N not a multiple of BLOCK_N here), then quantises the rows it stored. The copy must equal
    zoi.quant.primitives on the stored fp16 y bit for bit, exactly as the quantize launch does."""
    rng = np.random.default_rng(M * 7 + N + K + len(qmode) + len(tr) + len(a_kind))
    x = _awkward_rows(_rand(rng, M, K, scale=2.0))
    b = _rand(rng, N, scale=0.1)
    shift, mul = _transform(rng, N, tr)
    y = poison((M, N), torch.float16)
    yq, ys, yz = _qbufs(M, N)
    qa = _qargs(qmode, shift, mul, 3.0, yq, ys, yz, "y")
    cfg = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=32, GROUP_M=8, num_warps=4, num_stages=2)
    if a_kind == "fp16":
        w = _rand(rng, N, K, scale=K**-0.5)
        k_lin.launch_linear(
            t(x, torch.float16), None, t(w, torch.float16), None, t(b), None, None, None,
            y, None, M, N, K, quant=0, act="gelu", cfg=cfg, **qa,
        )  # fmt: skip
        want = ref.linear(f16(x), f16(w), b.astype(np.float64), "gelu")
        tol = 3e-3
    else:
        w_q, w_s = qp.quantize_weight(_rand(rng, N, K))
        q, scale, zp = qp.quantize_act_asym(x)
        a8 = (q.astype(np.int16) - 128).astype(np.int8)
        k_lin.launch_linear(
            t(a8), t(scale), t(w_q), t(w_s), t(b), None, None, None, y, None, M, N, K,
            quant=4, act="gelu", cfg=cfg, a_zp=t(zp),
            colsum=t(w_q.astype(np.int64).sum(1).astype(np.int32)), **qa,
        )  # fmt: skip
        want = ref.activation(
            qp.linear_int8_asym_emulated(x, w_q, w_s, b).astype(np.float64), "gelu"
        )
        tol = 2e-3
    got = y.float().cpu().numpy()
    assert rel(got, want) < tol
    _assert_quant(got, qmode, shift, mul, 3.0, yq, ys, yz)


def test_linear_rowq_default_config_covers_the_grid():
    """pick_config(rowq=True) gives one program per BLOCK_M rows (grid_size), any bucket."""
    for M in (16, 100, 4096, 32768):
        cfg = k_lin.pick_config(M, 1536, 384, True, False, rowq=True)
        assert k_lin.grid_size(M, 1536, cfg, rowq=True) == -(-M // cfg["BLOCK_M"])


@pytest.mark.parametrize("M,N,K", [(37, 40, 300), (16, 24, 128), (3, 17, 1)])
def test_linear_int8_asym_exact_accumulation(M, N, K):
    """Integer part bit-exact: a_scale = w_scale = 1, no bias, fp32 out -> y == the integer
    sum of primitives.int8_matmul_asym_exact (q_u8 - zp against the weights)."""
    rng = np.random.default_rng(M * N + K)
    q = rng.integers(0, 256, size=(M, K)).astype(np.uint8)
    q[0] = 255
    q[-1] = 0
    zp = rng.integers(0, 256, size=M).astype(np.int32)
    zp[0], zp[-1] = 0, 255
    w_q = rng.integers(-127, 128, size=(N, K)).astype(np.int8)
    y = poison((M, N), torch.float32)
    a8 = (q.astype(np.int16) - 128).astype(np.int8)
    _launch_q4(
        a8,
        np.ones(M, np.float32),
        zp,
        w_q,
        np.ones(N, np.float32),
        np.zeros(N, np.float32),
        y,
        M,
        N,
        K,
    )
    exact = qp.int8_matmul_asym_exact(q, zp, w_q).astype(np.float64)
    assert np.abs(exact).max() < 2**24
    np.testing.assert_array_equal(y.cpu().numpy().astype(np.float64), exact)


@pytest.mark.parametrize("quant", [0, 1])
@pytest.mark.parametrize("M,N,K", [(1, 48, 40), (19, 96, 72)])
@pytest.mark.parametrize(
    "qmode,tr", [("dynamic", "none"), ("dynamic_asym", "shift+mul"), ("static", "mul")]
)
def test_linear_residual_layernorm_epilogue(quant, M, N, K, qmode, tr):
    rng = np.random.default_rng(quant * 100 + M + len(tr))
    x, r = _rand(rng, M, K), _rand(rng, M, N)
    w, b = _rand(rng, N, K, scale=K**-0.5), _rand(rng, N, scale=0.1)
    lw, lb = (1 + _rand(rng, N, scale=0.1)), _rand(rng, N, scale=0.1)
    x16, r16 = f16(x), f16(r)
    y = poison((M, N), torch.float16)
    amax_out = poison((M,), torch.float32)
    shift, mul = _transform(rng, N, tr)
    yq, ys, yz = _qbufs(M, N)
    qa = _qargs(qmode, shift, mul, 2.0, yq, ys, yz, "y")
    cfg = k_lin.pick_config(M, N, K, quant != 0, True)
    if quant:
        w_q, w_s = qp.quantize_weight(w)
        amax_in = np.abs(x16).max(axis=1).astype(np.float32)
        k_lin.launch_linear(
            t(x16.astype(np.float16)),
            t(amax_in),
            t(w_q),
            t(w_s),
            t(b),
            t(r, torch.float16),
            t(lw),
            t(lb),
            y,
            amax_out,
            M,
            N,
            K,
            quant=1,
            eps=1e-12,
            ln=True,
            amax_out_mode=2,
            cfg=cfg,
            **qa,
        )
        lin = _int8_want(x16, w_q, w_s, b, "none", r16)
    else:
        k_lin.launch_linear(
            t(x, torch.float16),
            None,
            t(w, torch.float16),
            None,
            t(b),
            t(r, torch.float16),
            t(lw),
            t(lb),
            y,
            amax_out,
            M,
            N,
            K,
            quant=0,
            eps=1e-12,
            ln=True,
            amax_out_mode=2,
            cfg=cfg,
            **qa,
        )
        lin = ref.linear(x16, f16(w), b.astype(np.float64), "none", r16)
    want = ref.layernorm(lin, lw.astype(np.float64), lb.astype(np.float64), 1e-12)
    got = y.float().cpu().numpy()
    assert rel(got, want) < 3e-3
    np.testing.assert_array_equal(
        amax_out.cpu().numpy(), np.abs(got).max(axis=1).astype(np.float32)
    )
    _assert_quant(got, qmode, shift, mul, 2.0, yq, ys, yz)  # producer-side INT8 copy


@pytest.mark.parametrize("T,H", [(1, 24), (13, 100)])
@pytest.mark.parametrize("qmode", QMODES)
@pytest.mark.parametrize("tr", TRANSFORMS)
def test_add_layernorm(T, H, qmode, tr):
    rng = np.random.default_rng(T + H + len(tr))
    x, r = _rand(rng, T, H, scale=3.0), _rand(rng, T, H)
    w, b = 1 + _rand(rng, H, scale=0.1), _rand(rng, H, scale=0.1)
    y = poison((T, H), torch.float16)
    amax = poison((T,), torch.float32)
    shift, mul = _transform(rng, H, tr)
    yq, ys, yz = _qbufs(T, H)
    k_ln.launch_add_layernorm(
        t(x, torch.float16),
        t(r, torch.float16),
        t(w),
        t(b),
        y,
        amax,
        T,
        H,
        1e-5,
        **_qargs(qmode, shift, mul, 2.5, yq, ys, yz, "y"),
    )
    want = ref.add_layernorm(f16(x), f16(r), w.astype(np.float64), b.astype(np.float64), 1e-5)
    got = y.float().cpu().numpy()
    assert rel(got, want) < 2e-3
    np.testing.assert_array_equal(amax.cpu().numpy(), np.abs(got).max(axis=1).astype(np.float32))
    _assert_quant(got, qmode, shift, mul, 2.5, yq, ys, yz)


@pytest.mark.parametrize("word_q", [False, True])
@pytest.mark.parametrize("has_type", [False, True])
@pytest.mark.parametrize(
    "qmode,tr",
    [
        ("dynamic", "none"),
        ("dynamic_asym", "shift+mul"),
        ("dynamic_asym", "none"),
        ("static", "mul"),
    ],
)
def test_embed(word_q, has_type, qmode, tr):
    rng = np.random.default_rng(word_q * 2 + has_type + len(tr))
    V, P, H, T = 50, 20, 40, 11
    word, pos, typ = _rand(rng, V, H), _rand(rng, P, H, scale=0.3), _rand(rng, 2, H, scale=0.3)
    lw, lb = 1 + _rand(rng, H, scale=0.1), _rand(rng, H, scale=0.1)
    ids = rng.integers(0, V, T).astype(np.int32)
    positions = rng.integers(0, P, T).astype(np.int32)
    if word_q:
        wq, ws = qp.quantize_embedding(word)
        word_ref = qp.dequantize_weight(wq, ws)
        word_arg, ws_arg = t(wq), t(ws)
    else:
        word_ref = f16(word)
        word_arg, ws_arg = t(word, torch.float16), None
    x = poison((T, H), torch.float16)
    amax = poison((T,), torch.float32)
    zero = poison((3, T + 5), torch.float32)
    cu = np.array([0, 4, 5, T], np.int32)
    tcum = torch.full((4,), -1, dtype=torch.int32, device=DEV)
    shift, mul = _transform(rng, H, tr)
    xq, xs, xz = _qbufs(T, H)
    k_embed.launch_embed(
        t(ids),
        t(positions),
        word_arg,
        ws_arg,
        t(pos, torch.float16),
        t(typ[0], torch.float16) if has_type else None,
        t(lw),
        t(lb),
        x,
        amax,
        zero,
        T,
        H,
        3,
        T + 5,
        1e-12,
        tiles=(t(np.array([0, 3, T], np.int32)), t(cu), tcum, 4, 16),
        **_qargs(qmode, shift, mul, 2.0, xq, xs, xz, "x"),
    )
    np.testing.assert_array_equal(tcum.cpu().numpy(), [1, 2, 4, -1])
    want = ref.embed(
        ids,
        positions,
        word_ref.astype(np.float64),
        f16(pos),
        lw.astype(np.float64),
        lb.astype(np.float64),
        1e-12,
        f16(typ) if has_type else None,
        np.float64,
    )
    got = x.float().cpu().numpy()
    assert rel(got, want) < 2e-3
    np.testing.assert_array_equal(amax.cpu().numpy(), np.abs(got).max(axis=1).astype(np.float32))
    _assert_quant(got, qmode, shift, mul, 2.0, xq, xs, xz)
    z = zero.cpu().numpy()
    assert (z[:, :T] == 0).all() and np.isnan(z[:, T:]).all()


@pytest.mark.parametrize("lens", [[1], [5, 1, 17], [70, 3], [2] * 21])
@pytest.mark.parametrize("head_dim,heads", [(8, 3), (24, 2)])
def test_attention_varlen(lens, head_dim, heads):
    rng = np.random.default_rng(sum(lens) + head_dim)
    T, H, B = sum(lens), heads * head_dim, len(lens)
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    hdr = np.array([0, B, T, 0], np.int32)
    T_bucket = T + 3  # rows past T are not part of any sequence
    qkv = np.zeros((T_bucket, 3 * H), np.float32)
    qkv[:T] = _rand(rng, T, 3 * H, scale=1.5)
    o = poison((T_bucket, H), torch.float16)
    amax = torch.zeros(T_bucket, dtype=torch.float32, device=DEV)
    scale = 1.0 / math.sqrt(head_dim)
    cfg = k_attn.pick_config(T_bucket, head_dim)
    n_seq = B + 5
    tcum = torch.full((n_seq,), -1, dtype=torch.int32, device=DEV)
    if len(lens) > 4:  # exercise the chunked scans (BLOCK_B smaller than B)
        k_attn.attention_tiles_kernel[(1,)](t(hdr), t(cu), tcum, BLOCK_M=cfg["BLOCK_M"], BLOCK_B=16)
    else:
        k_attn.launch_tiles(t(hdr), t(cu), tcum, n_seq, cfg)
    want_t = np.cumsum([(n + cfg["BLOCK_M"] - 1) // cfg["BLOCK_M"] for n in lens])
    np.testing.assert_array_equal(tcum.cpu().numpy()[:B], want_t)
    k_attn.launch_attention(
        t(qkv, torch.float16),
        t(hdr),
        t(cu),
        tcum,
        o,
        amax,
        T_bucket,
        n_seq,
        heads,
        head_dim,
        scale,
        cfg=cfg,
    )
    want = ref.attention(f16(qkv[:T]), cu, heads, head_dim, scale)
    got = o.float().cpu().numpy()
    assert rel(got[:T], want) < 3e-3
    assert np.isnan(got[T:]).all(), "rows past T must not be written"
    np.testing.assert_array_equal(
        amax.cpu().numpy()[:T], np.abs(got[:T]).max(axis=1).astype(np.float32)
    )


@pytest.mark.parametrize("mode", ["mean", "cls", "max"])
@pytest.mark.parametrize("norm", [0, 1])
def test_pool(mode, norm):
    rng = np.random.default_rng(len(mode) + norm)
    lens = [3, 1, 40]
    T, H = sum(lens), 56
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    x = _rand(rng, T + 2, H)
    p = poison((5, H), torch.float32)
    k_pool.launch_pool(
        t(x, torch.float16), t(cu), t(np.array([norm, 3, T], np.int32)), p, 2, H, mode
    )
    want = ref.pool(f16(x), cu, mode)
    if norm:
        want = ref.normalize(want)
    got = p.cpu().numpy()
    assert rel(got[:3], want) < 1e-5
    assert np.isnan(got[3:]).all(), "slots past B must not be written"
