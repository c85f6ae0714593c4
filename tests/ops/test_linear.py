"""INT8 and float linears (s32 GEMM, quantising prologue, every epilogue), per backend."""

from __future__ import annotations

import math

import numpy as np
import pytest
from tests.ops.helpers import (
    DEV,
    ISAS,
    _awkward_rows,
    _rand,
    close,
    cuda,
    f16,
    k_lin,
    nanlike,
    poison,
    rel,
    t,
    torch,
)

from zoi import _cpu
from zoi.numerics import primitives as qp
from zoi.numerics import reference as ref

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
    assert offs == ((128, 0) if isa in ("vnni", "avxvnni", "amx") else (0, -128))


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
    if isa == "amx":  # vnni's epilogue on exact sums: bit-identical to vnni (checked vs scalar)
        y_n = nanlike((M, N))
        _cpu.k_linear_i8(x, w_q, w_s, b, "gelu", None, -1.0, y_n, "vnni", 2)
        np.testing.assert_array_equal(y_v, y_n)
    else:
        close(y_v, y_s, 1e-6, 1e-6)
    qkv = rng.standard_normal((40, 3 * 64)).astype(np.float32)
    cu = np.array([0, 11, 40], np.int32)
    a_v, a_s = nanlike((40, 64)), nanlike((40, 64))
    _cpu.k_attention(qkv, cu, 4, 16, 0.25, a_v, isa, 2)
    _cpu.k_attention(qkv, cu, 4, 16, 0.25, a_s, "scalar", 1)
    close(a_v, a_s, 1e-5, 1e-6)


@cuda
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


@cuda
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
        y,
        amax_out,
        M,
        N,
        K,
        quant=2 if static else 1,
        act="gelu",
        static_amax=static_amax,
    )
    want = _int8_want(x16, w_q, w_s, b, "gelu", amax=static_amax if static else None)
    got = y.float().cpu().numpy()
    assert rel(got, want) < 2e-3
    np.testing.assert_allclose(amax_out.cpu().numpy(), np.abs(got).max(axis=1), rtol=0, atol=0)


@cuda
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


@cuda
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


@cuda
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
