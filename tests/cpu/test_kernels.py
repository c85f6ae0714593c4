"""Every native kernel, every ISA this CPU supports, against zoi.numerics.reference / zoi.numerics.primitives.

Outputs are poisoned (NaN / sentinel) before each call and must come back fully written.
Shapes are awkward on purpose: 1 token, primes, K not a multiple of the block, N odd.
`nt` > 1 runs every thread share of the partition (one after the other) to test the split.
"""

from __future__ import annotations

import math
import zlib

import numpy as np
import pytest
from helpers import supported_isas

from zoi import _cpu
from zoi.numerics import primitives as qp
from zoi.numerics import reference as ref

ISAS = supported_isas()
ACTS = ["none", "gelu", "gelu_tanh", "relu", "sigmoid"]
GEMM_SHAPES = [
    (1, 1, 1),
    (1, 7, 5),
    (3, 13, 9),
    (7, 64, 64),
    (17, 131, 67),
    (33, 97, 1031),
    (100, 384, 130),
    (6, 385, 129),
    (13, 1536, 65),
]


def nanlike(shape, dtype=np.float32):
    return np.full(shape, np.nan, dtype)


def close(got, want, rtol, atol):
    want = np.asarray(want, np.float64)
    err = np.abs(np.asarray(got, np.float64) - want)
    bound = atol + rtol * np.abs(want)
    assert np.isfinite(got).all(), "output not fully written"
    worst = float((err - bound).max()) if err.size else 0.0
    assert worst <= 0, f"max err {err.max():.3g} exceeds tolerance (rtol={rtol}, atol={atol})"


@pytest.fixture
def rng(request):
    return np.random.default_rng(zlib.crc32(request.node.name.encode()))


def test_isa_dispatch():
    assert _cpu.active_isa() in ISAS
    assert "scalar" in ISAS
    for isa in ISAS:
        lay = _cpu.kernel_layout(isa)
        assert lay["isa"] == isa and lay["i8_kgroup"] == 4
    with pytest.raises(ValueError):
        _cpu.kernel_layout("sse9")


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("M,N,K", GEMM_SHAPES)
def test_gemm_s32_bit_exact(isa, M, N, K, rng):
    q = rng.integers(-127, 128, (M, K)).astype(np.int8)
    w = rng.integers(-127, 128, (N, K)).astype(np.int8)
    q[0, :] = 127  # extremes: saturation would show here
    w[0, :] = -127
    out = np.full((M, N), -(2**31), np.int32)
    _cpu.k_gemm_s32(q.astype(np.int16), None, w, out, isa, 3)
    np.testing.assert_array_equal(out, qp.int8_matmul_exact(q, w))
    # asymmetric: u8 activations with a per-row zero point
    qa = rng.integers(0, 256, (M, K)).astype(np.uint8)
    qa[0, :] = 255
    zp = rng.integers(0, 256, M).astype(np.int32)
    out = np.full((M, N), -(2**31), np.int32)
    _cpu.k_gemm_s32(qa.astype(np.int16), zp, w, out, isa, 2)
    np.testing.assert_array_equal(out, qp.int8_matmul_asym_exact(qa, zp, w))


def _adversarial_weights(N, K, rng):
    """Rows of all 127, all -127, alternating +-127, alternating 127/-127 pairs, then random."""
    w = rng.integers(-127, 128, (N, K)).astype(np.int8)
    k = np.arange(K)
    rows = [
        np.full(K, 127),
        np.full(K, -127),
        np.where(k % 2 == 0, 127, -127),
        np.where((k // 2) % 2 == 0, 127, -127),
        np.where(k % 4 == 3, -127, 127),
    ]
    for i, r in enumerate(rows[: max(0, N - 1)]):
        w[i] = r
    return w


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize(
    "M,N,K", [(9, 23, 1), (9, 23, 3), (9, 23, 5), (7, 50, 383), (11, 37, 3073)]
)
def test_gemm_s32_adversarial_integers(isa, M, N, K, rng):
    """The extremes of every A format against the exact integer matmuls: symmetric rows of all
    127 / -127 (and alternating), asymmetric rows of all 0 (stored -128 by the sign-trick ISAs),
    255, 128 and alternating 0/255 with zero points 0, 255 and 128 (the largest |s16 pair| of
    vpmaddubsw is |-128 x -127| x 2 = 32512), K odd and long (3073: sums near 5e7)."""
    w = _adversarial_weights(N, K, rng)
    k = np.arange(K)
    q = rng.integers(-127, 128, (M, K)).astype(np.int8)
    for i, r in enumerate(
        [np.full(K, 127), np.full(K, -127), np.where(k % 2 == 0, 127, -127), np.zeros(K)]
    ):
        q[i] = r
    out = np.full((M, N), -(2**31), np.int32)
    _cpu.k_gemm_s32(q.astype(np.int16), None, w, out, isa, 2)
    np.testing.assert_array_equal(out, qp.int8_matmul_exact(q, w))
    qa = rng.integers(0, 256, (M, K)).astype(np.uint8)
    zp = rng.integers(0, 256, M).astype(np.int32)
    cases = [(0, 0), (0, 255), (255, 0), (255, 255), (128, 128), (0, 128)]
    for i, (v, z) in enumerate(cases[: M - 1]):
        qa[i], zp[i] = v, z
    qa[M - 1] = np.where(k % 2 == 0, 0, 255)
    zp[M - 1] = 255
    out = np.full((M, N), -(2**31), np.int32)
    _cpu.k_gemm_s32(qa.astype(np.int16), zp, w, out, isa, 3)
    want = qp.int8_matmul_asym_exact(qa, zp, w)
    np.testing.assert_array_equal(out, want)
    assert np.abs(want.astype(np.int64)).max() >= 127 * 127 * K  # the extremes were exercised


@pytest.mark.parametrize("isa", ISAS)
def test_linear_int8_asym_extreme_rows(isa, rng):
    """Through the quantiser: rows whose asymmetric q is all 255 (all positive, equal: zp 0), all 0
    (all negative: zp 255), 0/255 alternating, and symmetric rows at +-amax; weights all +-127."""
    M, N, K = 8, 29, 3073
    x = rng.standard_normal((M, K)).astype(np.float32)
    x[0] = 3.0
    x[1] = -2.0
    x[2] = np.where(np.arange(K) % 2 == 0, -1.5, 4.0)
    x[3] = 0.0
    x[4] = np.where(np.arange(K) % 3 == 0, -7.0, 7.0)
    w_q = _adversarial_weights(N, K, rng)
    w_s = (0.01 + rng.random(N)).astype(np.float32)
    b = rng.standard_normal(N).astype(np.float32)
    q, _, zp = qp.quantize_act_asym(x)
    assert q[0].min() == 255 and q[1].max() == 0 and zp[0] == 0 and zp[1] == 255
    y = nanlike((M, N))
    _cpu.k_linear_i8(x, w_q, w_s, b, "none", None, -1.0, y, isa, 2, asym=True)
    np.testing.assert_array_equal(y, qp.linear_int8_asym_emulated(x, w_q, w_s, b))
    y = nanlike((M, N))
    _cpu.k_linear_i8(x, w_q, w_s, b, "none", None, -1.0, y, isa, 2)
    np.testing.assert_array_equal(y, qp.linear_int8_emulated(x, w_q, w_s, b))


@pytest.mark.parametrize("isa", ISAS)
def test_int8_weight_minus_128_is_refused(isa):
    """-128 is outside zoi's symmetric weights (and would break the sign trick): a clear error."""
    w = np.zeros((5, 7), np.int8)
    w[3, 2] = -128
    out = np.zeros((2, 5), np.int32)
    with pytest.raises(ValueError, match=r"row 3, column 2.*\[-127, 127\]"):
        _cpu.k_gemm_s32(np.ones((2, 7), np.int16), None, w, out, isa, 1)


@pytest.mark.parametrize("isa", ISAS)
def test_int8_a_format(isa):
    """A rows are 8-bit on every ISA (plus the |a| copy of the sign-trick ISAs): u8 q + 128 /
    q on vnni, s8 q / q - 128 elsewhere (weight bytes: test_backend's memory test per ISA)."""
    lay = _cpu.kernel_layout(isa)
    assert lay["i8_kgroup"] == 4
    assert lay["i8_a_bytes"] == (2 if isa in ("avx2", "avx512") else 1)
    offs = (lay["i8_a_off_sym"], lay["i8_a_off_asym"])
    assert offs == ((128, 0) if isa == "vnni" else (0, -128))


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("static", [None, 0.7, 0.0])
def test_quantize_matches_primitives(isa, static, rng):
    x = (rng.standard_normal((37, 131)) * 2).astype(np.float32)
    x[3] = 0  # zero row -> q 0, scale 0
    x[5, 7] = 1e-30
    q = np.full(x.shape, 999, np.int16)
    s, zp = nanlike(37), np.full(37, -1, np.int32)
    _cpu.k_quantize(x, q, s, zp, -1.0 if static is None else static, False, None, None, isa, 4)
    q_ref, s_ref = qp.quantize_act(x, static)
    np.testing.assert_array_equal(q, q_ref)
    np.testing.assert_array_equal(s, s_ref)
    np.testing.assert_array_equal(zp, 0)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("transform", [False, True])
def test_quantize_asym_and_transform(isa, transform, rng):
    x = (rng.standard_normal((29, 97)) * 2 + 0.5).astype(np.float32)
    x[3] = 0
    x[4] = np.abs(x[4])  # all positive: lo = 0
    x[5] = -np.abs(x[5])  # all negative: hi = 0
    shift = rng.standard_normal(97).astype(np.float32) if transform else None
    mul = (0.5 + rng.random(97)).astype(np.float32) if transform else None
    xt = qp.act_transform(x, shift, mul) if transform else x
    for asym in (True, False):
        q = np.full(x.shape, 999, np.int16)
        s, zp = nanlike(29), np.full(29, -1, np.int32)
        _cpu.k_quantize(x, q, s, zp, -1.0, asym, shift, mul, isa, 3)
        if asym:
            q_ref, s_ref, zp_ref = qp.quantize_act_asym(xt)
        else:
            (q_ref, s_ref), zp_ref = qp.quantize_act(xt), 0
        np.testing.assert_array_equal(q, q_ref)
        np.testing.assert_array_equal(s, s_ref)
        np.testing.assert_array_equal(zp, zp_ref)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("M,N,K", GEMM_SHAPES)
def test_linear_int8_vs_emulation(isa, M, N, K, rng):
    x = rng.standard_normal((M, K)).astype(np.float32)
    w_q, w_s = qp.quantize_weight(rng.standard_normal((N, K)).astype(np.float32) * 0.1)
    b = rng.standard_normal(N).astype(np.float32) * 0.1
    res = rng.standard_normal((M, N)).astype(np.float32)
    for act, r, amax in [("none", None, None), ("gelu", res, None), ("relu", None, 2.0)]:
        y = nanlike((M, N))
        _cpu.k_linear_i8(x, w_q, w_s, b, act, r, -1.0 if amax is None else amax, y, isa, 2)
        want = ref.activation(qp.linear_int8_emulated(x, w_q, w_s, b, amax), act)
        if r is not None:
            want = want + r
        close(y, want, 2e-6, 2e-6)
    # the epilogue without activation is the emulation's float arithmetic exactly
    y = nanlike((M, N))
    _cpu.k_linear_i8(x, w_q, w_s, b, "none", None, -1.0, y, isa, 1)
    np.testing.assert_array_equal(y, qp.linear_int8_emulated(x, w_q, w_s, b))
    y = nanlike((M, N))
    _cpu.k_linear_i8(x, w_q, w_s, b, "none", None, -1.0, y, isa, 2, asym=True)
    np.testing.assert_array_equal(y, qp.linear_int8_asym_emulated(x, w_q, w_s, b))
    shift, mul = rng.standard_normal(K).astype(np.float32), (0.5 + rng.random(K)).astype(np.float32)
    y = nanlike((M, N))
    _cpu.k_linear_i8(x, w_q, w_s, b, "none", None, -1.0, y, isa, 2, asym=True, shift=shift, mul=mul)
    np.testing.assert_array_equal(
        y, qp.linear_int8_asym_emulated(qp.act_transform(x, shift, mul), w_q, w_s, b)
    )


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("M,N,K", GEMM_SHAPES)
def test_linear_f32(isa, M, N, K, rng):
    x = rng.standard_normal((M, K)).astype(np.float32)
    w = (rng.standard_normal((N, K)) / math.sqrt(K)).astype(np.float32)
    b = rng.standard_normal(N).astype(np.float32)
    res = rng.standard_normal((M, N)).astype(np.float32)
    for act, r in [("none", None), ("gelu", res), ("gelu_tanh", None), ("sigmoid", res)]:
        y = nanlike((M, N))
        _cpu.k_linear_f32(x, w, b, act, r, y, isa, 3)
        want = ref.linear(
            x.astype(np.float64),
            w.astype(np.float64),
            b,
            act,
            None if r is None else r.astype(np.float64),
        )
        close(y, want, 1e-5, 1e-5 * math.sqrt(K) / 8)
    y = nanlike((M, N))
    _cpu.k_linear_f32(x, w, None, "none", None, y, isa, 1)
    close(y, x.astype(np.float64) @ w.T.astype(np.float64), 1e-5, 1e-5 * math.sqrt(K) / 8)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("act", ACTS)
def test_activation(isa, act):
    x = np.concatenate(
        [np.linspace(-12, 12, 2001), [0.0, -0.0, 1e-8, -1e-8, 30, -30, -90, 90]]
    ).astype(np.float32)
    y = x.copy()
    _cpu.k_activation(y, act, isa)
    want = ref.activation(x.astype(np.float64), act)
    if act == "gelu_tanh":  # 0.5 x (1 + tanh u) cancels in the negative tail even in float64
        x64 = x.astype(np.float64)
        want = x64 / (1 + np.exp(-2 * math.sqrt(2 / math.pi) * (x64 + 0.044715 * x64**3)))
    with np.errstate(over="ignore"):
        naive = ref.activation(x, act)  # the float32 reference itself
    assert np.isfinite(y).all()
    err, err_naive = np.abs(y - want), np.abs(naive.astype(np.float64) - want)
    # at most ~2x the error of the float32 reference, elementwise, up to a few ulp; the GELU's
    # fast erf (rational fit, a few ulp of erf) costs up to ~7e-7 absolute in the negative tail
    # (and 1e-20 where the float64 formula itself cancels to 0 but the true value is ~1e-30)
    tail = 1e-6 if act == "gelu" else 1e-20

    assert (err <= 2 * err_naive + 4 * np.spacing(np.abs(want).astype(np.float32)) + tail).all(), (
        err.max()
    )


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("M,H", [(1, 1), (1, 384), (7, 60), (13, 97), (40, 768)])
def test_layernorm(isa, M, H, rng):
    x = (rng.standard_normal((M, H)) * 3 + 1).astype(np.float32)
    r = rng.standard_normal((M, H)).astype(np.float32)
    w = (1 + 0.1 * rng.standard_normal(H)).astype(np.float32)
    b = (0.1 * rng.standard_normal(H)).astype(np.float32)
    for res in (None, r):
        y = nanlike((M, H))
        q = np.full((M, H), 999, np.int16)
        s = nanlike(M)
        _cpu.k_layernorm(x, res, w, b, 1e-5, y, q, s, -1.0, isa, 3)
        xin = x.astype(np.float64) + (0 if res is None else res)
        close(y, ref.layernorm(xin, w.astype(np.float64), b.astype(np.float64), 1e-5), 1e-5, 3e-6)
        # and bit for bit the float32 reference (numpy's pairwise sums, same op order), so
        # that the fused quantisation rounds exactly as the emulation
        np.testing.assert_array_equal(y, ref.layernorm(x if res is None else x + res, w, b, 1e-5))
        q_ref, s_ref = qp.quantize_act(y)  # the fused quantisation of the kernel's own output
        np.testing.assert_array_equal(q, q_ref)
        np.testing.assert_array_equal(s, s_ref)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("int8_table", [False, True])
@pytest.mark.parametrize("H,with_type", [(60, True), (384, False), (7, True)])
def test_embed(isa, int8_table, H, with_type, rng):
    V, P, T = 53, 41, 29
    word = rng.standard_normal((V, H)).astype(np.float32)
    pos = rng.standard_normal((P, H)).astype(np.float32)
    typ = rng.standard_normal((2, H)).astype(np.float32) if with_type else None
    lw = (1 + 0.1 * rng.standard_normal(H)).astype(np.float32)
    lb = (0.1 * rng.standard_normal(H)).astype(np.float32)
    ids = rng.integers(0, V, T).astype(np.int32)
    positions = rng.integers(0, P, T).astype(np.int32)
    y = nanlike((T, H))
    if int8_table:
        wq, ws = qp.quantize_embedding(word)
        _cpu.k_embed(
            ids,
            positions,
            None,
            wq,
            ws,
            pos,
            None if typ is None else typ[0].copy(),
            lw,
            lb,
            1e-12,
            y,
            isa,
            2,
        )
        table = qp.dequantize_weight(wq, ws)
    else:
        _cpu.k_embed(
            ids,
            positions,
            word,
            None,
            None,
            pos,
            None if typ is None else typ[0].copy(),
            lw,
            lb,
            1e-12,
            y,
            isa,
            2,
        )
        table = word
    want = ref.embed(ids, positions, table, pos, lw, lb, 1e-12, typ, dtype=np.float64)
    close(y, want, 1e-5, 3e-6)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("heads,d", [(5, 12), (2, 64), (12, 32), (3, 7), (1, 1)])
@pytest.mark.parametrize("lengths", [[1], [5, 1, 17, 33], [130]])
def test_attention(isa, heads, d, lengths, rng):
    T, H = sum(lengths), heads * d
    qkv = (rng.standard_normal((T, 3 * H)) * 1.5).astype(np.float32)
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    out = nanlike((T, H))
    scale = 1 / math.sqrt(d)
    _cpu.k_attention(qkv, cu, heads, d, scale, out, isa, 3)
    want = ref.attention(qkv.astype(np.float64), cu, heads, d, scale)
    naive = ref.attention(qkv, cu, heads, d, scale)  # the float32 reference (numpy + BLAS)
    assert np.isfinite(out).all()
    # The kernel sums in numpy/BLAS's order where BLAS uses one FMA chain per output (then it is
    # bit-identical to `naive`), one chain elsewhere; a single chain over up to 130 keys has up
    # to ~3x the error of BLAS's blocked sums against float64.
    assert np.abs(out - want).max() <= 4 * np.abs(naive - want).max() + 1e-6


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("mode", ["mean", "cls", "max"])
def test_pool_and_normalize(isa, mode, rng):
    lengths = [1, 7, 30, 2]
    H = 45
    x = rng.standard_normal((sum(lengths), H)).astype(np.float32)
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    out = nanlike((len(lengths), H))
    _cpu.k_pool(x, cu, mode, out, isa, 3)
    want = ref.pool(x, cu, mode)
    np.testing.assert_array_equal(out, want)  # same float32 order as numpy's axis-0 reduction
    p = out.copy()
    p[1] = 0  # zero row stays zero
    want = ref.normalize(p)
    _cpu.k_normalize(p, isa)
    np.testing.assert_array_equal(p, want)


@pytest.mark.parametrize("isa", [i for i in ISAS if i != "scalar"])
def test_isa_matches_scalar(isa, rng):
    """Each vector ISA against the portable scalar build on one mid-size linear + attention."""
    M, N, K = 45, 203, 301
    x = rng.standard_normal((M, K)).astype(np.float32)
    w_q, w_s = qp.quantize_weight(rng.standard_normal((N, K)).astype(np.float32))
    b = rng.standard_normal(N).astype(np.float32)
    y_v, y_s = nanlike((M, N)), nanlike((M, N))
    _cpu.k_linear_i8(x, w_q, w_s, b, "gelu", None, -1.0, y_v, isa, 2)
    _cpu.k_linear_i8(x, w_q, w_s, b, "gelu", None, -1.0, y_s, "scalar", 1)
    close(y_v, y_s, 1e-6, 1e-6)
    qkv = rng.standard_normal((40, 3 * 64)).astype(np.float32)
    cu = np.array([0, 11, 40], np.int32)
    a_v, a_s = nanlike((40, 64)), nanlike((40, 64))
    _cpu.k_attention(qkv, cu, 4, 16, 0.25, a_v, isa, 2)
    _cpu.k_attention(qkv, cu, 4, 16, 0.25, a_s, "scalar", 1)
    close(a_v, a_s, 1e-5, 1e-6)


def test_unsupported_isa_is_refused():
    missing = [i for i in ("vnni", "avx512", "avx2") if not _cpu.isa_supported(i)]
    for isa in missing:
        with pytest.raises(ValueError):
            _cpu.kernel_layout(isa)
    with pytest.raises(ValueError):
        _cpu.k_activation(np.zeros(3, np.float32), "swish", "")
