"""Order-independent arithmetic for the quantiser's small reductions: results that depend on
the inputs only.

A compiled INT8 artifact is a chain of rounding decisions (integer weights, SmoothQuant
factors, the alpha and fallback choices), and a float reduction gives numbers that change
with the summation order (numpy's SIMD pairwise blocks, the BLAS kernel, its thread count).
The big reductions (calibration statistics, Grams, GPTQ) are plain numpy / BLAS with BLAS
single-threaded (zoi.quant.blas): the same bits on one machine. The small ones below (the
search's score, SmoothQuant's powers and its W z, the MSE observer) use this module, whose
results do not even depend on the machine.

Everything here is built from operations whose result IEEE 754 fixes exactly, whatever the
order or the vector width: elementwise + - * / sqrt (one rounding each, no fused multiply-
add, as numpy ufuncs do), max / min / abs, rint, frexp / ldexp, and sums of integers held
in float64 that stay below 2**53 (exact in any order, so BLAS may sum them as it likes).

- `fixed_sum`: a float sum on a fixed-point grid (2**-(52 - log2 n) of the largest |x|):
  every term is rounded to the grid first, then the integer sum is exact.
- `det_matmul`: a @ b.T with a and b rounded per row to fixed-point integers (about 21 bits
  each, so the products and their sum stay exact in float64 BLAS); dequantised per row.
  About float32 accuracy (relative error ~2**-21 of a row's largest entry).
- `det_exp`, `det_log`, `det_pow`: polynomial versions (elementwise only); numpy's own use
  SIMD code that differs by CPU and version.
"""

from __future__ import annotations

import math

import numpy as np

_LN2_HI = 6.93147180369123816490e-01  # Cody-Waite split of ln 2 (fdlibm)
_LN2_LO = 1.90821492927058770002e-10
_LOG2E = 1.44269504088896338700e00


def _bits(n: int) -> int:
    """ceil(log2(n)) for n >= 1 (0 for n == 1)."""
    return max(0, int(n - 1).bit_length())


def fixed_sum(x, axis: int | None = None, keepdims: bool = False) -> np.ndarray:
    """Sum of x (float64 result) independent of the summation order.

    Each term is rounded to a multiple of 2**(e - 52 + ceil(log2 n)) where 2**e bounds the
    largest |x| along the axis: integers whose partial sums are all below 2**52, so float64
    adds them exactly in any order. Error <= n * 2**-(53 - log2 n) * max|x|."""
    x = np.asarray(x, np.float64)
    if axis is None:
        x = x.reshape(-1)
        axis = 0
    n = x.shape[axis]
    if n == 0:
        return np.sum(x, axis=axis, keepdims=keepdims)
    m = np.max(np.abs(x), axis=axis, keepdims=True)
    _, e = np.frexp(m)  # m < 2**e (e = 0 for m = 0)
    shift = (52 - _bits(n)) - e.astype(np.int64)
    xi = np.rint(np.ldexp(x, shift))
    s = np.sum(xi, axis=axis, keepdims=True)
    out = np.ldexp(s, -shift)
    return out if keepdims else np.squeeze(out, axis=axis)


def fixed_mean(x, axis: int | None = None, keepdims: bool = False) -> np.ndarray:
    x = np.asarray(x)
    n = x.size if axis is None else x.shape[axis]
    return fixed_sum(x, axis, keepdims) / max(n, 1)


def _to_fixed(a: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """Per row (last axis) of a: integers (float64) of at most `bits` bits, and the shift."""
    m = np.max(np.abs(a), axis=-1)
    _, e = np.frexp(m)
    sh = bits - e.astype(np.int64)
    return np.rint(np.ldexp(a, sh[..., None])), sh


def det_matmul(a, b=None, limbs: int = 1) -> np.ndarray:
    """a [..., R, K] @ b[..., C, K]^T -> float64 [..., R, C], identical on every BLAS, numpy
    version and thread count (b None: a @ a^T, through BLAS's symmetric product).

    Rows of a and b become integers of A and B bits (A + B + ceil(log2 K) <= 53), so every
    dot product BLAS forms is exact; the row scales are powers of two (exact). limbs=1:
    about 2**-21 of a row's largest entry (float32-like); limbs=2: each row also keeps the
    next A bits (a = hi + lo 2**-A), three exact products (hi hi, hi lo, lo hi), about
    2**-(2A) (float64-like)."""
    sym = b is None
    a = np.asarray(a, np.float64)
    b = a if sym else np.asarray(b, np.float64)
    K = a.shape[-1]
    if K != b.shape[-1]:
        raise ValueError(f"det_matmul: inner sizes differ ({a.shape} vs {b.shape})")
    if K == 0 or a.size == 0 or b.size == 0:
        return np.zeros(
            np.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (a.shape[-2], b.shape[-2])
        )
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        raise FloatingPointError(
            "det_matmul: non-finite input (the calibration forward overflowed)"
        )
    room = 53 - _bits(K)
    ba = room // 2
    bb = ba if sym else room - ba
    ai, sa = _to_fixed(a, ba)
    bi, sb = (ai, sa) if sym else _to_fixed(b, bb)
    bt = np.swapaxes(bi, -1, -2)
    acc = np.matmul(ai, bt)  # exact: integer partial sums below 2**53
    if limbs == 2:
        al = np.rint(np.ldexp(a, (sa + ba)[..., None]) - np.ldexp(ai, ba))  # next ba bits
        bl = al if sym else np.rint(np.ldexp(b, (sb + bb)[..., None]) - np.ldexp(bi, bb))
        m1 = np.matmul(ai, np.swapaxes(bl, -1, -2))
        m2 = np.swapaxes(m1, -1, -2) if sym else np.matmul(al, bt)
        # ba == bb whenever sym; else scale each cross term by its own limb width
        acc = acc + (np.ldexp(m1, -bb) + np.ldexp(m2, -ba))
    elif limbs != 1:
        raise ValueError("limbs must be 1 or 2")
    return np.ldexp(acc, -(sa[..., :, None] + sb[..., None, :]))


def det_exp(x) -> np.ndarray:
    """exp(x) in float64 from elementwise operations only (relative error ~2e-16)."""
    x = np.asarray(x, np.float64)
    xc = np.clip(x, -745.0, 709.0)
    n = np.rint(xc * _LOG2E)
    r = (xc - n * _LN2_HI) - n * _LN2_LO  # |r| <= ~0.347
    p = np.full_like(r, 1.0 / math.factorial(13))
    for k in range(12, -1, -1):
        p = p * r + 1.0 / math.factorial(k)
    out = np.ldexp(p, n.astype(np.int64))
    out = np.where(x < -745.0, 0.0, out)
    return np.where(np.isnan(x), np.nan, np.where(x > 709.0, np.inf, out))


def det_log(x) -> np.ndarray:
    """log(x) for x > 0 in float64 from elementwise operations (atanh series)."""
    x = np.asarray(x, np.float64)
    m, e = np.frexp(x)  # x = m 2**e, m in [0.5, 1)
    small = m < math.sqrt(0.5)
    m = np.where(small, m * 2.0, m)
    e = np.where(small, e - 1, e).astype(np.float64)
    s = (m - 1.0) / (m + 1.0)  # |s| <= 0.1716
    s2 = s * s
    p = np.full_like(s, 1.0 / 25.0)
    for k in range(23, 0, -2):
        p = p * s2 + 1.0 / k
    out = (2.0 * s * p + e * _LN2_LO) + e * _LN2_HI
    out = np.where(x == 0, -np.inf, out)
    return np.where(x < 0, np.nan, out)


def det_pow(a, p: float) -> np.ndarray:
    """a**p for a >= 0 (0**p = 0 for p > 0, 1 for p == 0), elementwise only."""
    a = np.asarray(a, np.float64)
    if p == 0:
        return np.ones_like(a)
    pos = a > 0
    out = det_exp(float(p) * det_log(np.where(pos, a, 1.0)))
    return np.where(pos, out, 0.0)
