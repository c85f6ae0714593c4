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


def quantize_act(x: np.ndarray, amax: float | np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric INT8 activations.

    x: float32 [T, K]. amax None -> per token (dynamic): amax[t] = max|x[t, :]|.
    A scalar amax -> per tensor (static). Returns (q int8 [T, K], a_scale float32 [T]).
    Rows with amax 0 quantise to 0 with scale 0.
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
    return q, (am / np.float32(QMAX)).astype(np.float32)


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
