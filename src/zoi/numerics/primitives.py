"""INT8 primitives: the numerics every INT8 kernel in zoi reproduces (docs/ARCHITECTURE.md).

Weights are symmetric per output channel; activations symmetric per token (dynamic) or per
tensor (static, calibrated amax). The emulated linear accumulates integers exactly (int64
in numpy) and dequantises in float32, so a native kernel's s32 accumulation must match it
bit for bit and its float epilogue to rounding.
"""

from __future__ import annotations

import numpy as np

QMAX = 127


def quantize_weight(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-row symmetric INT8. w: float [N, K] -> (w_q int8 [N, K], w_scale float32 [N])."""
    w = np.asarray(w, dtype=np.float32)
    amax = np.abs(w).max(axis=1)
    scale = np.where(amax > 0, amax / np.float32(QMAX), np.float32(1.0)).astype(np.float32)
    q = np.clip(np.rint(w / scale[:, None]), -QMAX, QMAX).astype(np.int8)
    return q, scale


def dequantize_weight(w_q: np.ndarray, w_scale: np.ndarray) -> np.ndarray:
    return w_q.astype(np.float32) * w_scale[:, None]


def quantize_act(
    x: np.ndarray, amax: float | np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric INT8 activations.

    x: float32 [T, K]. amax None -> per token (dynamic): amax[t] = max|x[t, :]|.
    A scalar amax -> per tensor (static). Returns (q int8 [T, K], a_scale float32 [T]).
    Rows with amax 0 quantise to 0 with scale 0. A row holding a NaN gets a NaN a_scale in
    both modes (dynamic: its amax is NaN; static: the calibrated amax says nothing of it, so
    the row is checked), so everything computed from the row is NaN (its int8 codes cannot
    hold the NaN); the kernels do the same (kernels/quantize.py q_params).
    """
    x = np.asarray(x, dtype=np.float32)
    if amax is None:
        am = np.abs(x).max(axis=1) if x.shape[1] else np.zeros(x.shape[0], np.float32)
    else:
        am = np.full(x.shape[0], np.float32(amax), dtype=np.float32)
    am = am.astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(am > 0, np.float32(QMAX) / np.where(am > 0, am, 1), 0).astype(np.float32)
    q = np.clip(np.rint(x * inv[:, None]), -QMAX, QMAX).astype(np.int8)
    scale = (am / np.float32(QMAX)).astype(np.float32)
    if amax is not None and x.shape[1]:  # static: a NaN in the row makes its scale NaN
        scale[np.isnan(x).any(axis=1)] = np.float32(np.nan)
    return q, scale


def int8_matmul_exact(q: np.ndarray, w_q: np.ndarray) -> np.ndarray:
    """Exact integer product: int8 [T, K] x int8 [N, K]^T -> int32 [T, N]."""
    acc = q.astype(np.int64) @ w_q.astype(np.int64).T
    return acc.astype(np.int32)


def linear_int8_emulated(
    x: np.ndarray,
    w_q: np.ndarray,
    w_scale: np.ndarray,
    b: np.ndarray | None,
    amax: float | None = None,
) -> np.ndarray:
    """The emulated INT8 linear (before activation/residual): float32 [T, N]."""
    q, a_scale = quantize_act(x, amax)
    acc = int8_matmul_exact(q, w_q).astype(np.float32)
    y = acc * (a_scale[:, None] * w_scale[None, :])
    if b is not None:
        y = y + np.asarray(b, np.float32)[None, :]
    return y.astype(np.float32)


def quantize_embedding(table: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-row INT8 embedding table: [V, H] -> (int8 [V, H], float32 [V])."""
    return quantize_weight(table)


def sqnr_db(ref: np.ndarray, approx: np.ndarray) -> float:
    """Signal-to-quantisation-noise ratio in dB (inf when identical)."""
    ref = np.asarray(ref, np.float64)
    noise = float(np.sum((ref - np.asarray(approx, np.float64)) ** 2))
    sig = float(np.sum(ref**2))
    if noise == 0:
        return float("inf")
    return 10.0 * np.log10(max(sig, 1e-300) / noise)


def int8_matmul_fast(q: np.ndarray, w_q: np.ndarray) -> np.ndarray:
    """Same result as `int8_matmul_exact`, through float64 BLAS.

    Every product is at most 127**2 and a row sum at most K * 127**2 < 2**53 for any K
    below 5e11, so float64 accumulation is exact in any order; much faster than int64.
    """
    acc = q.astype(np.float64) @ w_q.astype(np.float64).T
    return acc.astype(np.int32)


# ---- per-token asymmetric (unsigned) activations: scheme "dynamic_asym" -------------------
#
# The range of each token always includes 0 (so 0.0 is represented exactly):
#   lo[t] = min(min_k x[t,k], 0), hi[t] = max(max_k x[t,k], 0), r[t] = hi[t] - lo[t]
#   inv[t] = 255 / r[t] (float32; r 0 -> q = 0, zp = 0, scale 0)
#   zp[t] = clip(rint(-lo[t] * inv[t]), 0, 255)                       (int)
#   q[t,k] = clip(rint(x[t,k] * inv[t]) + zp[t], 0, 255)               (uint8)
#   a_scale[t] = r[t] / 255
#   acc[t,n] = sum_k q[t,k] * w_q[n,k] - zp[t] * colsum[n], colsum[n] = sum_k w_q[n,k]  (exact)
#   y[t,n] = float(acc[t,n]) * (a_scale[t] * w_scale[n]) + b[n]
# u8 x s8 is what VNNI's vpdpbusd multiplies; a kernel with s8 x s8 units uses q - 128 and
# zp - 128 instead, the integer result is the same.

UQMAX = 255


def quantize_act_asym(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-token asymmetric UINT8. x: float32 [T, K] -> (q uint8 [T, K], a_scale f32 [T], zp int32 [T])."""
    x = np.asarray(x, dtype=np.float32)
    if x.shape[1] == 0:
        z = np.zeros(x.shape[0], np.float32)
        return np.zeros(x.shape, np.uint8), z, z.astype(np.int32)
    lo = np.minimum(x.min(axis=1), np.float32(0)).astype(np.float32)
    hi = np.maximum(x.max(axis=1), np.float32(0)).astype(np.float32)
    r = (hi - lo).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(r > 0, np.float32(UQMAX) / np.where(r > 0, r, 1), 0).astype(np.float32)
    zp = np.clip(np.rint(-lo * inv), 0, UQMAX).astype(np.int32)
    q = np.clip(np.rint(x * inv[:, None]) + zp[:, None], 0, UQMAX).astype(np.uint8)
    return q, (r / np.float32(UQMAX)).astype(np.float32), zp


def weight_colsum(w_q: np.ndarray) -> np.ndarray:
    """colsum[n] = sum_k w_q[n, k] (int64, exact): the zero-point term of the asymmetric sum."""
    return np.asarray(w_q).astype(np.int64).sum(axis=1)


def int8_matmul_asym_exact(q: np.ndarray, zp: np.ndarray, w_q: np.ndarray) -> np.ndarray:
    """sum_k q[t,k] w_q[n,k] - zp[t] colsum[n]: uint8 [T, K], int32 [T], int8 [N, K] -> int32 [T, N]."""
    acc = q.astype(np.float64) @ w_q.astype(np.float64).T  # exact: |sum| < 2**53
    colsum = weight_colsum(w_q)
    return (acc.astype(np.int64) - zp.astype(np.int64)[:, None] * colsum[None, :]).astype(np.int32)


def linear_int8_asym_emulated(
    x: np.ndarray, w_q: np.ndarray, w_scale: np.ndarray, b: np.ndarray | None
) -> np.ndarray:
    """The emulated INT8 linear with per-token asymmetric UINT8 activations: float32 [T, N]."""
    q, a_scale, zp = quantize_act_asym(x)
    acc = int8_matmul_asym_exact(q, zp, w_q).astype(np.float32)
    y = acc * (a_scale[:, None] * w_scale[None, :])
    if b is not None:
        y = y + np.asarray(b, np.float32)[None, :]
    return y.astype(np.float32)


def linear_int8_scheme(
    x: np.ndarray,
    w_q: np.ndarray,
    w_scale: np.ndarray,
    b: np.ndarray | None,
    scheme: str = "dynamic",
    amax: float | None = None,
) -> np.ndarray:
    """The emulated INT8 linear for a LinearQuant scheme: "dynamic", "static" or "dynamic_asym"."""
    if scheme == "dynamic_asym":
        return linear_int8_asym_emulated(x, w_q, w_scale, b)
    if scheme == "dynamic":
        return linear_int8_emulated(x, w_q, w_scale, b, None)
    if scheme == "static":
        if amax is None:
            raise ValueError("scheme 'static' needs the calibrated amax")
        return linear_int8_emulated(x, w_q, w_scale, b, amax)
    raise ValueError(f"not an INT8 scheme: {scheme!r}")


def fold_act_transform(
    w: np.ndarray,
    b: np.ndarray | None,
    act_shift: np.ndarray | None = None,
    act_mul: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """A float linear's weights with its input transform folded in, exactly in real
    arithmetic: ((x - s) * m) W^T + b = x (W m)^T + (b - (W m) s). float64 [N, K], [N]."""
    w64 = np.asarray(w, np.float64)
    b64 = np.zeros(w64.shape[0]) if b is None else np.asarray(b, np.float64)
    if act_mul is not None:
        w64 = w64 * np.asarray(act_mul, np.float64)[None, :]
    if act_shift is not None:
        b64 = b64 - w64 @ np.asarray(act_shift, np.float64)
    return w64, b64


def act_transform(
    x: np.ndarray, act_shift: np.ndarray | None = None, act_mul: np.ndarray | None = None
) -> np.ndarray:
    """The per-channel transform of a linear's input before its activation is quantised
    (SmoothQuant where it cannot fold): x' = (x - act_shift) * act_mul, in float32, two
    roundings (subtract, then multiply: not a fused multiply-add). Either may be absent."""
    x = np.asarray(x, np.float32)
    if act_shift is not None:
        x = (x - np.asarray(act_shift, np.float32)[None, :]).astype(np.float32)
    if act_mul is not None:
        x = (x * np.asarray(act_mul, np.float32)[None, :]).astype(np.float32)
    return x


# ---- the first row of each sequence quantised twice (LinearQuant.first_row) ----------------
#
# The first row of a sequence (the [CLS] / attention-sink row: its massive channels take the
# per-token scale) also gets its residual quantised, symmetric, with a step fixed by the first
# quantisation whatever the row's own mode (dynamic, static amax, asymmetric):
#   r  = x' - float32(q - zp) * a_scale        (float32: the product rounded, then the difference)
#   s2 = a_scale * 2**-8                       (|r| <= a_scale / 2 where q is not clamped)
#   q2 = clamp(rint(r / s2), -127, 127)        (IEEE division; 0 where s2 is not finite and > 0)
#   y[row] = (acc * (a_scale * w_scale) + b) + float(q2 . w_q) * (s2 * w_scale)
# (the bias before the second term: the kernels add it to the finished first-row tile)


def first_rows(cu_seqlens, n_rows: int) -> np.ndarray:
    """Row index of each sequence's first row: cu_seqlens[:-1] (rows of a token batch)."""
    cu = np.asarray(cu_seqlens, np.int64)
    if cu.ndim != 1 or len(cu) < 2 or cu[0] != 0 or cu[-1] != n_rows:
        raise ValueError(
            f"the first-row residual needs cu_seqlens [B + 1] from 0 to the {n_rows} rows, got {cu}"
        )
    return cu[:-1]


def first_row_residual(
    x: np.ndarray, q: np.ndarray, a_scale: np.ndarray, zp: np.ndarray | None, rows: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The second quantisation of rows `rows` of x (float32 [T, K], the transformed input)
    quantised as q (int8 or uint8 [T, K]), a_scale [T], zp [T] (None: symmetric):
    (q2 int8 [B, K], s2 float32 [B]).

    The residual r = x' - d, d = float32(float32(q - zp) * a_scale) (the product rounded
    before the subtract: no fused multiply-add), is quantised with the fixed step
    s2 = a_scale * 2**-8 (a power-of-two scaling: exact in float32 down to the subnormals):
    q2 = clamp(rint(r / s2), -127, 127) with a correctly rounded float32 division and ties to
    even, and q2 = 0 on a row whose s2 is not finite and > 0 (a zero row: s2 = 0; a row with a
    NaN or an infinity: s2 NaN or infinite, so its output is NaN whatever q2 holds).

    Why a fixed step: where q is not clamped |r| <= a_scale / 2 (to the rounding of the
    reciprocal the first quantisation multiplies by), so 2**-8 a_scale covers that half step
    with the 255 codes (an element right at the edge, 128 steps, clamps to 127); an element the
    first quantisation clamped (a static amax below the row's) saturates at +-127. Each q2 then depends only on its own element, x' and a_scale: a GEMM computes it
    while it reads the row, with no pass over the residual for an amax and no extra launch.
    """
    xr = np.asarray(x, np.float32)[rows]
    qr = q[rows].astype(np.float32)
    if zp is not None:
        qr = qr - np.asarray(zp, np.float32)[rows][:, None]
    s2 = (np.asarray(a_scale, np.float32)[rows] * np.float32(2.0**-8)).astype(np.float32)
    ok = np.isfinite(s2) & (s2 > 0)
    with np.errstate(invalid="ignore", over="ignore"):  # NaN / infinite rows: codes 0 below
        d = (qr * np.asarray(a_scale, np.float32)[rows][:, None]).astype(np.float32)
        r = (xr - d).astype(np.float32)
        t = (r / np.where(ok, s2, np.float32(1))[:, None]).astype(np.float32)
        t = np.clip(np.rint(t), -QMAX, QMAX)
    # r is finite where s2 is: every scheme gives a row holding a NaN or an infinity a NaN or
    # infinite a_scale (an infinity clamped by a static amax leaves r infinite: +-127 above)
    q2 = np.where(ok[:, None] & ~np.isnan(t), t, 0).astype(np.int8)
    return q2, s2


def add_first_row_term(
    y: np.ndarray, q2: np.ndarray, s2: np.ndarray, w_q: np.ndarray, w_scale: np.ndarray, rows
) -> np.ndarray:
    """y[rows] += float(q2 w_q^T) * (s2 * w_scale), in float32 (y: the linear's output, bias in)."""
    acc = int8_matmul_fast(q2, w_q).astype(np.float32)
    y = np.array(y, np.float32)
    y[rows] = y[rows] + acc * (s2[:, None] * np.asarray(w_scale, np.float32)[None, :])
    return y
