"""Error-compensating INT8 weight rounding (GPTQ, Frantar et al. 2022) in the contract's format.

The scale stays the contract's `w_scale[n] = max|w[n, :]| / 127`; only the choice of each
integer changes: columns are rounded one at a time and the rounding error of column k is
spread over the columns not yet rounded, weighted by the inverse Gram matrix of the
calibration inputs, so that `x @ w_q.T * w_scale` tracks `x @ w.T` on real activations
rather than `w_q * w_scale` tracking `w` entrywise. Kernels see the same int8 [N, K] + f32 [N].
"""

from __future__ import annotations

import numpy as np

from zoi.numerics.primitives import QMAX
from zoi.quant.detmath import det_cholesky_upper_inv, det_matmul, fixed_mean


def weight_scale(w: np.ndarray) -> np.ndarray:
    amax = np.abs(w).max(axis=1)
    return np.where(amax > 0, amax / np.float32(QMAX), np.float32(1.0)).astype(np.float32)


def gptq_quantize(
    w: np.ndarray, gram: np.ndarray, damp: float = 0.01, block: int = 64, act_order: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """w: float [N, K]; gram: x^T x [K, K] of the calibration inputs. -> (int8 [N, K], f32 [N]).

    Deterministic (zoi.quant.detmath): the factor U (U^T U = H^-1) comes from a Cholesky and
    a triangular inverse without LAPACK, the rounding errors of a block of columns reach the
    columns not yet rounded through elementwise updates (inside the block, in one fixed
    order) and one exact two-limb product (past it), so the integers depend on w and gram
    only, not on the BLAS, numpy version or thread count.

    act_order: round the input channels in decreasing order of the Gram's diagonal (GPTQ's
    "act-order": the channels with the largest activations first, while the most columns are
    left to absorb their error); a stable sort, ties by index. The integers are returned in
    the original column order: same format, same scales."""
    w = np.asarray(w, np.float32)
    scale = weight_scale(w)
    N, K = w.shape
    H = np.array(gram, np.float64, copy=True)
    if act_order:
        perm = np.argsort(-np.diag(H), kind="stable")
        q, _ = gptq_quantize(w[:, perm], H[np.ix_(perm, perm)], damp, block, False)
        out = np.empty_like(q)
        out[:, perm] = q
        return out, scale
    dead = np.diag(H) <= 0
    H[dead, dead] = 1.0
    mean_diag = float(fixed_mean(np.diag(H)))
    H[np.diag_indices(K)] += damp * (mean_diag if mean_diag > 0 else 1.0)
    try:
        hinv = det_cholesky_upper_inv(H)  # upper triangular, hinv^T hinv = H^-1
    except np.linalg.LinAlgError:  # not positive definite even with damping: plain rounding
        q = np.clip(np.rint(w / scale[:, None]), -QMAX, QMAX).astype(np.int8)
        return q, scale
    # work on W^T [K, N]: column k of W is row k, contiguous
    s = scale.astype(np.float64)
    WT = np.ascontiguousarray(w.astype(np.float64).T)
    QT = np.empty((K, N), np.float64)
    for i1 in range(0, K, block):
        i2 = min(i1 + block, K)
        W1 = WT[i1:i2].copy()
        E1 = np.empty_like(W1)
        Hi = hinv[i1:i2, i1:i2]
        for j in range(i2 - i1):
            row = W1[j]
            q = np.clip(np.rint(row / s), -QMAX, QMAX)
            QT[i1 + j] = q
            e = (row - q * s) / Hi[j, j]
            E1[j] = e
            if j + 1 < i2 - i1:
                W1[j + 1 :] -= Hi[j, j + 1 :, None] * e[None, :]
        if i2 < K:  # WT[i2:] -= hinv[i1:i2, i2:]^T @ E1, exactly rounded products
            WT[i2:] -= det_matmul(
                np.ascontiguousarray(hinv[i1:i2, i2:].T), np.ascontiguousarray(E1.T), limbs=2
            )
    return np.ascontiguousarray(QT.T).astype(np.int8), scale
