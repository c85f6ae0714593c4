"""The INT8 GEMM on every ISA this machine runs, at awkward M / N / K (1, 3, 17, 129, 383, 1537:
below, at and across the register blocks, panels, k-groups and M chunks of every ISA), on
adversarial integers, against the exact integer products; 1-3 threads.

The sign-trick ISAs (avx2, avx512) bound each s16 pair of vpmaddubsw by 2 * 128 * 127 = 32512:
rows of all -128 (stored, asymmetric q = 0), 127, 255 against weights of all +-127 reach it, so
a saturating or wrapping kernel fails here. The FP32 GEMM runs the same shapes (float64 check)."""

from __future__ import annotations

import zlib

import numpy as np
import pytest
from helpers import supported_isas

from zoi import _cpu
from zoi.numerics import primitives as qp

ISAS = supported_isas()
SIZES = (1, 3, 17, 129, 383, 1537)
# every size on every axis at least once, the big ones not all together (the scalar ISA)
SHAPES = [
    (1, 1, 1),
    (1, 1537, 383),
    (3, 17, 1537),
    (17, 383, 129),
    (129, 129, 17),
    (129, 3, 383),
    (383, 17, 3),
    (17, 1, 1537),
    (3, 383, 1),
    (129, 1537, 3),
    (383, 129, 129),
]


def _w(N, K, rng):
    w = rng.integers(-127, 128, (N, K)).astype(np.int8)
    k = np.arange(K)
    pats = [np.full(K, 127), np.full(K, -127), np.where(k % 2 == 0, 127, -127)]
    for r, pat in zip(sorted({0, N // 2, N - 1}), pats, strict=False):  # first, middle, last column
        w[r] = pat
    return w


def _exact(q, w, zp=None):
    acc = q.astype(np.float64) @ w.astype(np.float64).T  # exact: |sum| < 2**53
    if zp is not None:
        acc -= zp.astype(np.float64)[:, None] * w.astype(np.float64).sum(1)[None, :]
    return acc.astype(np.int64)


def _rng(*key):
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("M,N,K", SHAPES)
def test_gemm_i8_awkward_adversarial(isa, M, N, K):
    rng = _rng(isa, M, N, K)
    w = _w(N, K, rng)
    k = np.arange(K)
    # symmetric: rows of 127, -127, alternating, 0, then random in [-127, 127]
    q = rng.integers(-127, 128, (M, K)).astype(np.int16)
    for i, r in enumerate([np.full(K, 127), np.full(K, -127), np.where(k % 2 == 0, 127, -127)]):
        if i < M:
            q[M - 1 - i if i else 0] = r
    want = _exact(q, w)
    assert np.abs(want).max() < 2**31
    for nt in (1, 3):
        out = np.full((M, N), -(2**31), np.int32)
        _cpu.k_gemm_s32(q, None, w, out, isa, nt)
        np.testing.assert_array_equal(out, want, err_msg=f"{isa} sym nt={nt}")
    # asymmetric u8 with zero points: rows of all 0 (stored -128 on avx2 / avx512), 255, 128,
    # alternating 0 / 255, against zero points 0, 255, 128
    qa = rng.integers(0, 256, (M, K)).astype(np.int16)
    zp = rng.integers(0, 256, M).astype(np.int32)
    cases = [(0, 255), (255, 0), (0, 0), (255, 255), (128, 128)]
    for i, (v, z) in enumerate(cases):
        if i < M:
            qa[i], zp[i] = v, z
    if M > len(cases):
        qa[M - 1], zp[M - 1] = np.where(k % 2 == 0, 0, 255), 255
    want = _exact(qa, w, zp)
    for nt in (1, 2):
        out = np.full((M, N), -(2**31), np.int32)
        _cpu.k_gemm_s32(qa, zp, w, out, isa, nt)
        np.testing.assert_array_equal(out, want, err_msg=f"{isa} asym nt={nt}")
    # the extremes were reached: |q - zp| = 255 x 127 over all of K
    assert np.abs(want).max() >= 127 * 127 * K


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("M,N,K", SHAPES)
def test_gemm_f32_awkward(isa, M, N, K):
    rng = _rng("f32", isa, M, N, K)
    x = rng.standard_normal((M, K)).astype(np.float32)
    w = rng.standard_normal((N, K)).astype(np.float32)
    b = rng.standard_normal(N).astype(np.float32)
    res = rng.standard_normal((M, N)).astype(np.float32)
    want = x.astype(np.float64) @ w.astype(np.float64).T + b + res
    for nt in (1, 2):
        y = np.full((M, N), np.nan, np.float32)  # poisoned: an unwritten element fails
        _cpu.k_linear_f32(x, w, b, "none", res, y, isa, nt)
        assert np.isfinite(y).all(), (isa, nt)
        err = np.abs(y - want).max() / (np.sqrt(K) * 4 + 1)
        assert err < 1e-5, (isa, nt, err)


def test_sign_trick_bound_is_tight():
    """The bound the sign-trick kernels rely on (gemm_int8.cc): |a| <= 128, |w| <= 127 -> every
    s16 pair sum <= 32512 < 32767; with w = -128 allowed it would be 32768 (refused at pack)."""
    assert 2 * 128 * 127 == 32512 < 32767 < 2 * 128 * 128
    w = np.zeros((1, 4), np.int8)
    w[0, 1] = -128
    with pytest.raises(ValueError, match=r"\[-127, 127\]"):
        _cpu.k_gemm_s32(np.zeros((1, 4), np.int16), None, w, np.zeros((1, 1), np.int32), "", 1)
    assert (
        qp.int8_matmul_exact(np.full((1, 2), -127, np.int8), np.full((1, 2), 127, np.int8))[0, 0]
        == -32258
    )
