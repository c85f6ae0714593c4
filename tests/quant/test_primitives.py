"""INT8 numerics of zoi.numerics.primitives: exact integer accumulation, the documented rounding."""

from __future__ import annotations

import numpy as np
import pytest

from zoi.numerics import primitives as P


@pytest.mark.parametrize(
    "T,K,N", [(1, 1, 1), (1, 7, 3), (13, 97, 31), (5, 4096, 17), (3, 1536, 384)]
)
def test_int8_matmul_exact_and_fast_agree(T, K, N):
    r = np.random.default_rng(T * K + N)
    q = r.integers(-127, 128, (T, K)).astype(np.int8)
    w = r.integers(-127, 128, (N, K)).astype(np.int8)
    q[0, :] = 127  # the extreme: every product at its maximum
    w[0, :] = 127
    ref = q.astype(np.int64) @ w.astype(np.int64).T
    assert ref[0, 0] == 127 * 127 * K
    np.testing.assert_array_equal(P.int8_matmul_exact(q, w), ref)
    np.testing.assert_array_equal(P.int8_matmul_fast(q, w), ref)


def test_weight_quantisation_rule():
    r = np.random.default_rng(0)
    w = r.standard_normal((9, 33)).astype(np.float32)
    w[3] = 0.0
    q, s = P.quantize_weight(w)
    assert q.dtype == np.int8 and s.dtype == np.float32
    assert s[3] == 1.0 and not q[3].any()
    np.testing.assert_array_equal(
        s[:3], (np.abs(w[:3]).max(axis=1) / np.float32(127)).astype(np.float32)
    )
    np.testing.assert_array_equal(q, np.clip(np.rint(w / s[:, None]), -127, 127).astype(np.int8))
    assert np.abs(q).max(axis=1)[[0, 1, 2]].tolist() == [127, 127, 127]
    assert np.all(np.abs(P.dequantize_weight(q, s) - w) <= s[:, None] / 2 + 1e-7)


def test_dynamic_activation_rule_and_zero_rows():
    r = np.random.default_rng(1)
    x = r.standard_normal((6, 50)).astype(np.float32)
    x[2] = 0.0
    q, a = P.quantize_act(x)
    amax = np.abs(x).max(axis=1)
    assert a[2] == 0 and not q[2].any()
    inv = (np.float32(127) / amax[[0, 1, 3, 4, 5]]).astype(np.float32)
    np.testing.assert_array_equal(
        q[[0, 1, 3, 4, 5]],
        np.clip(np.rint(x[[0, 1, 3, 4, 5]] * inv[:, None]), -127, 127).astype(np.int8),
    )
    np.testing.assert_allclose(a, amax / 127, rtol=1e-7)


def test_static_activation_clips():
    x = np.array([[0.5, -3.0, 10.0]], np.float32)
    q, a = P.quantize_act(x, amax=2.0)
    assert q.tolist() == [[32, -127, 127]] and a[0] == np.float32(2.0 / 127)


@pytest.mark.parametrize("amax", [None, 2.0])  # dynamic, static
def test_nan_row_keeps_nan_in_both_modes(amax):
    """A row holding a NaN gets a NaN a_scale, dynamic and static alike (a static amax says
    nothing of the NaN: without the check its codes were finite and so was every output); the
    other rows are those of the NaN-free input; an inf saturates in static mode (finite scale)."""
    r = np.random.default_rng(7)
    x = r.standard_normal((5, 33)).astype(np.float32)
    q0, a0 = P.quantize_act(x, amax)
    xn = x.copy()
    xn[1, 4] = np.nan
    xn[3, 0] = -np.nan
    with np.errstate(invalid="ignore"):  # the NaN's int8 code (meaningless: its scale is NaN)
        q, a = P.quantize_act(xn, amax)
    assert np.isnan(a[[1, 3]]).all()
    ok = [0, 2, 4]
    np.testing.assert_array_equal(q[ok], q0[ok])
    np.testing.assert_array_equal(a[ok], a0[ok])
    wq, ws = P.quantize_weight(r.standard_normal((6, 33)).astype(np.float32))
    with np.errstate(invalid="ignore"):
        y = P.linear_int8_emulated(xn, wq, ws, None, amax)
    assert np.isnan(y[[1, 3]]).all() and np.isfinite(y[ok]).all()
    xi = x.copy()
    xi[2, 5] = np.inf
    with np.errstate(invalid="ignore"):  # dynamic: inf * 0 in the row's codes
        qi, ai = P.quantize_act(xi, amax)
    if amax is None:
        assert ai[2] == np.inf
    else:
        assert qi[2, 5] == 127 and ai[2] == a0[2] and np.isfinite(ai).all()


def test_emulated_linear_matches_manual():
    r = np.random.default_rng(2)
    x = r.standard_normal((7, 29)).astype(np.float32)
    w = r.standard_normal((11, 29)).astype(np.float32)
    b = r.standard_normal(11).astype(np.float32)
    wq, ws = P.quantize_weight(w)
    q, a = P.quantize_act(x)
    manual = (q.astype(np.int64) @ wq.astype(np.int64).T).astype(np.float32) * (
        a[:, None] * ws[None, :]
    ) + b
    np.testing.assert_array_equal(P.linear_int8_emulated(x, wq, ws, b), manual.astype(np.float32))
    # and it approximates the float product
    assert P.sqnr_db(x @ w.T + b, manual) > 30


def test_asym_activation_rule():
    r = np.random.default_rng(3)
    x = np.abs(r.standard_normal((8, 40))).astype(np.float32) - 0.17  # GELU-like: mostly >= -0.17
    x[1] = 0.0
    x[2] = np.linspace(0.1, 2.0, 40)  # all positive: lo = 0
    x[3, 0] = 0.0
    q, s, zp = P.quantize_act_asym(x)
    assert q.dtype == np.uint8 and zp.dtype == np.int32
    assert s[1] == 0 and zp[1] == 0 and not q[1].any()
    assert zp[2] == 0
    deq = (q.astype(np.float32) - zp[:, None]) * s[:, None]
    assert deq[3, 0] == 0.0  # zero is exact
    ok = s > 0
    assert np.all(np.abs(deq[ok] - x[ok]) <= s[ok][:, None] * 0.5 + 1e-6)


@pytest.mark.parametrize("T,K,N", [(1, 1, 1), (4, 97, 13), (3, 1536, 64)])
def test_asym_integer_accumulation_exact(T, K, N):
    r = np.random.default_rng(K)
    q = r.integers(0, 256, (T, K)).astype(np.uint8)
    zp = r.integers(0, 256, T).astype(np.int32)
    w = r.integers(-127, 128, (N, K)).astype(np.int8)
    q[0] = 255
    w[0] = 127
    ref = (
        q.astype(np.int64) @ w.astype(np.int64).T
        - zp.astype(np.int64)[:, None] * w.astype(np.int64).sum(1)[None, :]
    )
    np.testing.assert_array_equal(P.int8_matmul_asym_exact(q, zp, w), ref)
    # the signed form (q - 128, zp - 128) a kernel with s8 x s8 units uses gives the same integers
    qs = q.astype(np.int64) - 128
    ref2 = (
        qs @ w.astype(np.int64).T
        - (zp.astype(np.int64) - 128)[:, None] * w.astype(np.int64).sum(1)[None, :]
    )
    np.testing.assert_array_equal(ref, ref2)


def test_asym_beats_symmetric_on_one_sided_data():
    r = np.random.default_rng(4)
    h = r.standard_normal((64, 256)).astype(np.float32)
    x = (0.5 * h * (1 + np.tanh(0.8 * h))).astype(np.float32)  # GELU-shaped, one-sided
    w = r.standard_normal((32, 256)).astype(np.float32)
    wq, ws = P.quantize_weight(w)
    ref = x @ P.dequantize_weight(wq, ws).T
    sym = P.linear_int8_emulated(x, wq, ws, None)
    asym = P.linear_int8_asym_emulated(x, wq, ws, None)
    assert P.sqnr_db(ref, asym) > P.sqnr_db(ref, sym) + 3.0


def test_scheme_dispatch():
    r = np.random.default_rng(5)
    x = r.standard_normal((3, 8)).astype(np.float32)
    wq, ws = P.quantize_weight(r.standard_normal((4, 8)).astype(np.float32))
    np.testing.assert_array_equal(
        P.linear_int8_scheme(x, wq, ws, None, "dynamic"), P.linear_int8_emulated(x, wq, ws, None)
    )
    np.testing.assert_array_equal(
        P.linear_int8_scheme(x, wq, ws, None, "static", 1.5),
        P.linear_int8_emulated(x, wq, ws, None, 1.5),
    )
    np.testing.assert_array_equal(
        P.linear_int8_scheme(x, wq, ws, None, "dynamic_asym"),
        P.linear_int8_asym_emulated(x, wq, ws, None),
    )
    with pytest.raises(ValueError):
        P.linear_int8_scheme(x, wq, ws, None, "static")
    with pytest.raises(ValueError):
        P.linear_int8_scheme(x, wq, ws, None, "fp32")
