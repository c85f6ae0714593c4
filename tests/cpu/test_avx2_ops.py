"""The row ops of the forward (LayerNorm + fused quantise, quantise, the INT8 epilogue's GELU) and the
FP32 GEMM's work orders, on every ISA this machine runs, at awkward widths: below, at and across one
vector (8 / 16 lanes), the 4-vector quantise block (32), numpy's pairwise-sum leaves (128) and
their splits; fresh random inputs, outputs poisoned; bit for bit against the float32 reference /
the INT8 emulation where the contract is exact; a NaN inside a row never leaves it finite."""

from __future__ import annotations

import math

import numpy as np
import pytest
from helpers import supported_isas

from zoi import _cpu
from zoi.numerics import primitives as qp
from zoi.numerics import reference as ref

ISAS = supported_isas()
WIDTHS = (1, 5, 8, 9, 31, 32, 33, 127, 128, 129, 136, 257, 383, 384, 1000, 1536, 3073)


def _rows(rng, M, H, loc=0.0, scale=1.0):
    x = (rng.standard_normal((M, H)) * scale + loc).astype(np.float32)
    if M >= 4:
        x[1] = np.abs(x[1])  # all positive
        x[2] = -np.abs(x[2])  # all negative
        x[3, rng.integers(0, H)] *= 40.0  # one outlier channel
    return x


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("H", WIDTHS)
def test_layernorm_bitwise_and_fused_quant(isa, H):
    rng = np.random.default_rng(1000 + H)
    M = 6
    x = _rows(rng, M, H, loc=3.0, scale=2.0)
    r = rng.standard_normal((M, H)).astype(np.float32)
    w = (1 + 0.1 * rng.standard_normal(H)).astype(np.float32)
    b = (0.1 * rng.standard_normal(H)).astype(np.float32)
    for res in (None, r):
        for static in (-1.0, 2.5):
            y = np.full((M, H), np.nan, np.float32)
            q = np.full((M, H), 999, np.int16)
            s = np.full(M, np.nan, np.float32)
            _cpu.k_layernorm(x, res, w, b, 1e-12, y, q, s, static, isa, 3)
            want = ref.layernorm(x if res is None else x + res, w, b, 1e-12)
            np.testing.assert_array_equal(y, want)
            q_ref, s_ref = qp.quantize_act(want, None if static < 0 else static)
            np.testing.assert_array_equal(q, q_ref)
            np.testing.assert_array_equal(s, s_ref)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("H", (9, 128, 384, 1000))
def test_layernorm_nan_row_stays_nan(isa, H):
    rng = np.random.default_rng(H)
    x = rng.standard_normal((4, H)).astype(np.float32)
    w, b = np.ones(H, np.float32), np.zeros(H, np.float32)
    x[1, H // 2] = np.nan
    x[2, H - 1] = np.nan
    y = np.zeros((4, H), np.float32)
    q = np.zeros((4, H), np.int16)
    s = np.zeros(4, np.float32)
    _cpu.k_layernorm(x, None, w, b, 1e-12, y, q, s, -1.0, isa, 2)
    assert np.isnan(y[1:3]).all()
    assert np.isnan(s[1:3]).all()
    keep = [0, 3]
    np.testing.assert_array_equal(y[keep], ref.layernorm(x[keep], w, b, 1e-12))
    np.testing.assert_array_equal(s[keep], qp.quantize_act(y[keep])[1])


def _gelu_close(isa, got, want, x):
    """GELU = (0.5 x)(1 + erf(x / sqrt 2)) to the contract's float32 formula (reference.erf_f32): an
    erf within 1 ulp of it (the reference emulates each FMA in float64: a double rounding can move
    the last bit), i.e. |got - want| <= 0.5 |x| 2^-23 + 2 ulp(want) (where 1 + erf cancels, in the
    negative tail, that is many ulp of the result); the scalar build does not fuse the fit's
    multiply-adds (no libm fma call): 1e-6 |x|"""
    x = np.abs(x.astype(np.float64))
    tol = 2 * np.spacing(np.abs(want).astype(np.float32)) + (
        1e-6 * x if isa == "scalar" else 0.5 * x * 2.0**-23
    )
    err = np.abs(got.astype(np.float64) - want)
    assert (err <= tol).all(), (err.max(), x[np.argmax(err - tol)])


def _quant(x, isa, asym=False, static=-1.0, shift=None, mul=None, nt=3):
    M, K = x.shape
    q = np.full((M, K), 999, np.int16)
    s, zp = np.full(M, np.nan, np.float32), np.full(M, -7, np.int32)
    _cpu.k_quantize(x, q, s, zp, static, asym, shift, mul, isa, nt)
    return q, s, zp


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("K", WIDTHS)
def test_quantize_bitwise(isa, K):
    rng = np.random.default_rng(2000 + K)
    M = 7
    x = _rows(rng, M, K, loc=0.3, scale=2.0)
    x[4] = 0.0  # scale 0
    x[5] = 1e-30
    x[6] = 3.0e30
    shift = (0.1 * rng.standard_normal(K)).astype(np.float32)
    mul = (0.5 + rng.random(K)).astype(np.float32)
    for tr in (False, True):
        xt = qp.act_transform(x, shift, mul) if tr else x
        sh, mu = (shift, mul) if tr else (None, None)
        q, s, zp = _quant(x, isa, False, -1.0, sh, mu)
        q_ref, s_ref = qp.quantize_act(xt)
        np.testing.assert_array_equal(q, q_ref)
        np.testing.assert_array_equal(s, s_ref)
        np.testing.assert_array_equal(zp, 0)
        q, s, zp = _quant(x, isa, True, -1.0, sh, mu)
        q_ref, s_ref, zp_ref = qp.quantize_act_asym(xt)
        np.testing.assert_array_equal(q, q_ref)
        np.testing.assert_array_equal(s, s_ref)
        np.testing.assert_array_equal(zp, zp_ref)
    q, s, _ = _quant(x, isa, False, 1.5)
    q_ref, s_ref = qp.quantize_act(x, 1.5)
    np.testing.assert_array_equal(q, q_ref)
    np.testing.assert_array_equal(s, s_ref)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("K", (8, 33, 384, 1537))
def test_quantize_nan_inside_a_row_is_not_dropped(isa, K):
    """maxps returns its second operand when one is NaN, so a running max can lose a NaN; the row's
    scale must still be NaN (np.max's answer), every position, both schemes; an infinity gives an
    infinite scale, as the reference."""
    rng = np.random.default_rng(K)
    pos = sorted({0, 1, 7, 8, 31, 32, K // 2, K - 2, K - 1} & set(range(K)))
    x = rng.standard_normal((len(pos) + 2, K)).astype(np.float32)
    for i, p in enumerate(pos):
        x[i, p] = np.nan
    x[-2, K // 3] = np.inf
    for asym in (False, True):
        q, s, _ = _quant(x, isa, asym)
        assert np.isnan(s[: len(pos)]).all(), (asym, s[: len(pos)])
        assert s[-2] == np.inf
        want = qp.quantize_act_asym(x[-1:]) if asym else qp.quantize_act(x[-1:])
        np.testing.assert_array_equal(q[-1:], want[0])
        np.testing.assert_array_equal(s[-1:], want[1])
    # static (a calibrated amax: no range pass over the row): a NaN row's scale is NaN too
    # (the reference's), an infinity saturates with the calibrated scale, other rows exact
    q, s, _ = _quant(x, isa, False, 1.5)
    q_ref, s_ref = qp.quantize_act(x, 1.5)
    assert np.isnan(s[: len(pos)]).all() and np.isnan(s_ref[: len(pos)]).all(), s[: len(pos)]
    np.testing.assert_array_equal(s[-2:], s_ref[-2:])
    np.testing.assert_array_equal(q[-2:], q_ref[-2:])


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("K", (31, 32, 33, 64, 97, 383, 1537))
def test_linear_i8_bitwise_awkward_k(isa, K):
    """The quantiser's stored rows (and the |a| copy of the sign-trick ISAs) feed the GEMM exactly."""
    rng = np.random.default_rng(3000 + K)
    M, N = 5, 19
    x = _rows(rng, M, K, loc=0.2, scale=1.5)
    w_q, w_s = qp.quantize_weight(rng.standard_normal((N, K)).astype(np.float32))
    b = rng.standard_normal(N).astype(np.float32)
    shift = (0.1 * rng.standard_normal(K)).astype(np.float32)
    mul = (0.5 + rng.random(K)).astype(np.float32)
    y = np.full((M, N), np.nan, np.float32)
    _cpu.k_linear_i8(x, w_q, w_s, b, "none", None, -1.0, y, isa, 2)
    np.testing.assert_array_equal(y, qp.linear_int8_emulated(x, w_q, w_s, b))
    y = np.full((M, N), np.nan, np.float32)
    _cpu.k_linear_i8(x, w_q, w_s, b, "none", None, -1.0, y, isa, 3, asym=True, shift=shift, mul=mul)
    np.testing.assert_array_equal(
        y, qp.linear_int8_asym_emulated(qp.act_transform(x, shift, mul), w_q, w_s, b)
    )
    # GELU epilogue: the float32 contract (reference.erf_f32), to 1 ulp (its FMAs are emulated in
    # float64 there: a double rounding may differ in the last bit)
    y = np.full((M, N), np.nan, np.float32)
    _cpu.k_linear_i8(x, w_q, w_s, b, "gelu", None, -1.0, y, isa, 2)
    lin = qp.linear_int8_emulated(x, w_q, w_s, b)
    _gelu_close(isa, y, ref.activation(lin, "gelu"), lin)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("asym", (False, True))
def test_linear_i8_nan_row_stays_nan(isa, asym):
    rng = np.random.default_rng(5)
    M, N, K = 6, 40, 384
    x = rng.standard_normal((M, K)).astype(np.float32)
    x[2, 100] = np.nan  # inside the row, where a running maxps drops it
    x[4, 0] = np.nan
    w_q, w_s = qp.quantize_weight(rng.standard_normal((N, K)).astype(np.float32))
    y = np.zeros((M, N), np.float32)
    _cpu.k_linear_i8(x, w_q, w_s, None, "gelu", None, -1.0, y, isa, 2, asym=asym)
    assert np.isnan(y[[2, 4]]).all()
    assert np.isfinite(y[[0, 1, 3, 5]]).all()
    if not asym:  # static (calibrated amax 3.0): the same
        y = np.zeros((M, N), np.float32)
        _cpu.k_linear_i8(x, w_q, w_s, None, "gelu", None, 3.0, y, isa, 2)
        assert np.isnan(y[[2, 4]]).all()
        assert np.isfinite(y[[0, 1, 3, 5]]).all()


@pytest.mark.parametrize("isa", ISAS)
def test_gelu_contract(isa):
    x = np.concatenate(
        [
            np.random.default_rng(0).standard_normal(1000) * 3,
            np.linspace(-6, 6, 997),
            [np.nan, np.inf, -0.0, 0.0],
        ]
    ).astype(np.float32)
    for n in (1, 7, 8, 9, 31, 32, 33, 63, 64, 65, len(x)):
        y = x[:n].copy()
        _cpu.k_activation(y, "gelu", isa)
        want = ref.activation(x[:n], "gelu")
        ok = np.isfinite(want)
        np.testing.assert_array_equal(
            y[~ok], want[~ok]
        )  # NaN stays NaN, inf as the formula gives it
        _gelu_close(isa, y[ok], want[ok], x[:n][ok])


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize(
    "M,N,K", [(97, 17, 384), (128, 389, 384), (128, 40, 1536), (193, 33, 129), (700, 21, 384)]
)
def test_f32_gemm_work_orders_agree(isa, M, N, K):
    """One M chunk and several (MC = 96), 1-3 threads (splits over chunks and panels): the same floats."""
    if isa == "scalar" and M * N * K > 2e7:
        pytest.skip("scalar build: the big shape is covered on the vector ISAs")
    rng = np.random.default_rng(M + N + K)
    x = rng.standard_normal((M, K)).astype(np.float32)
    w = (rng.standard_normal((N, K)) / math.sqrt(K)).astype(np.float32)
    b = rng.standard_normal(N).astype(np.float32)
    res = rng.standard_normal((M, N)).astype(np.float32)
    outs = []
    for nt in (1, 2, 3):
        y = np.full((M, N), np.nan, np.float32)
        _cpu.k_linear_f32(x, w, b, "gelu", res, y, isa, nt)
        outs.append(y)
    for y in outs[1:]:
        np.testing.assert_array_equal(y, outs[0])
    want = ref.linear(x.astype(np.float64), w.astype(np.float64), b, "gelu", res.astype(np.float64))
    np.testing.assert_allclose(outs[0], want, rtol=1e-5, atol=1e-5 * math.sqrt(K) / 8)
    x[M // 2, K // 2] = np.nan
    y = np.zeros((M, N), np.float32)
    _cpu.k_linear_f32(x, w, b, "none", None, y, isa, 2)
    assert np.isnan(y[M // 2]).all() and np.isfinite(np.delete(y, M // 2, axis=0)).all()
