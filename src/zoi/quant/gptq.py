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


def weight_scale(w: np.ndarray) -> np.ndarray:
    amax = np.abs(w).max(axis=1)
    return np.where(amax > 0, amax / np.float32(QMAX), np.float32(1.0)).astype(np.float32)


def _reversed_cholesky(box: list) -> np.ndarray:
    """R (upper, contiguous) with box[0] = R R^T, emptying the box first so that at most two
    K x K arrays live at once (a 3072-wide Gram is 75 MB in float64); the reversals are
    sequential copies (a transposed copy of that size costs more than the factorisation)."""
    rev = np.ascontiguousarray(box.pop()[::-1, ::-1])
    L = np.linalg.cholesky(rev)
    del rev
    return np.ascontiguousarray(L[::-1, ::-1])


def gptq_quantize(
    w: np.ndarray,
    gram: np.ndarray,
    damp: float = 0.01,
    block: int = 64,
    act_order: bool = False,
    overwrite: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """w: float [N, K]; gram: x^T x [K, K] of the calibration inputs. -> (int8 [N, K], f32 [N]).

    GPTQ's column-by-column rounding in its nearest-plane form (Babai; Chen et al. 2025, "GPTQ
    as Babai's nearest plane"): with H = R R^T (R upper, `_reversed_cholesky`) the output
    error of one row is |R^T d|**2 for d = w - q * s, so column i, once columns < i are rounded, is
    rounded at its optimal continuous value w_i + sum_{k<i} R[k, i] d_k / R[i, i] (what GPTQ's
    update with the Cholesky factor of H^-1 reaches): one factorisation, no inverse. The
    corrections from earlier blocks of columns come in one BLAS product per block, those within
    a block by elementwise updates, in float64. Same bits for the same inputs under one BLAS
    kernel and thread count (the quantiser runs BLAS single-threaded: zoi.quant.blas).

    act_order: round the input channels in decreasing order of the Gram's diagonal (GPTQ's
    "act-order": the channels with the largest activations first, while the most columns are
    left to absorb their error); a stable sort, ties by index. The integers are returned in
    the original column order: same format, same scales. overwrite: gram (float64) may be
    used as scratch (no copy of it is made)."""
    w = np.asarray(w, np.float32)
    scale = weight_scale(w)
    N, K = w.shape
    if overwrite and isinstance(gram, np.ndarray) and gram.dtype == np.float64:
        H = gram
    else:
        H = np.array(gram, np.float64, copy=True)
    del gram
    if act_order:
        perm = np.argsort(-np.diag(H), kind="stable")
        q, _ = gptq_quantize(w[:, perm], H[np.ix_(perm, perm)], damp, block, False)
        out = np.empty_like(q)
        out[:, perm] = q
        return out, scale
    dead = np.diag(H) <= 0
    H[dead, dead] = 1.0
    mean_diag = float(np.mean(np.diag(H)))
    H[np.diag_indices(K)] += damp * (mean_diag if mean_diag > 0 else 1.0)
    box = [H]
    del H
    try:  # H = R R^T: column i's correction reads R[:i, i]
        R = _reversed_cholesky(box)
    except np.linalg.LinAlgError:  # not positive definite even with damping: plain rounding
        q = np.clip(np.rint(w / scale[:, None]), -QMAX, QMAX).astype(np.int8)
        return q, scale
    # work on W^T [K, N]: column k of W is row k, contiguous
    s = scale.astype(np.float64)
    WT = np.ascontiguousarray(w.astype(np.float64).T)
    D = np.empty((K, N), np.float64)  # d_k = w_k - q_k s of the rounded columns
    QT = np.empty((K, N), np.float64)
    t = np.empty(N, np.float64)
    for i1 in range(0, K, block):
        i2 = min(i1 + block, K)
        # C[j - i1] = sum_{k < i1} R[k, j] d_k: the earlier blocks' share, one product
        C = R[:i1, i1:i2].T @ D[:i1] if i1 else np.zeros((i2 - i1, N))
        for j in range(i1, i2):
            c = C[j - i1]
            np.divide(c, R[j, j], out=t)
            t += WT[j]
            t /= s
            q = QT[j]
            np.rint(t, out=q)
            np.clip(q, -QMAX, QMAX, out=q)
            d = D[j]
            np.multiply(q, s, out=d)
            np.subtract(WT[j], d, out=d)
            if j + 1 < i2:
                C[j + 1 - i1 :] += R[j, j + 1 : i2, None] * d[None, :]
    return np.ascontiguousarray(QT.T).astype(np.int8), scale
