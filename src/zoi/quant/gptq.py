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

# 7-bit weights: |w_q| <= 63, the AVX2 / AVX-512BW kernels' cheaper exact K loop
# (csrc/kernels/gemm_int8.cc, GemmI8Args::w_bits); QMAX_OF[bits] is the largest integer
QMAX_OF = {8: QMAX, 7: 63}


def weight_scale(w: np.ndarray, qmax: int = QMAX) -> np.ndarray:
    amax = np.abs(w).max(axis=1)
    return np.where(amax > 0, amax / np.float32(qmax), np.float32(1.0)).astype(np.float32)


def round_weight(w: np.ndarray, bits: int = 8) -> tuple[np.ndarray, np.ndarray]:
    """Plain per-channel rounding to `bits` (8: zoi.numerics.primitives.quantize_weight's
    integers; 7: in [-63, 63], scale max|w| / 63): the rounding where no Gram exists."""
    qmax = QMAX_OF[bits]
    w = np.asarray(w, np.float32)
    scale = weight_scale(w, qmax)
    return np.clip(np.rint(w / scale[:, None]), -qmax, qmax).astype(np.int8), scale


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
    qmax: int = QMAX,
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
    used as scratch (no copy of it is made). qmax: the largest integer (127; 63 for 7-bit
    weights, QMAX_OF), the scale max|w| / qmax."""
    w = np.asarray(w, np.float32)
    scale = weight_scale(w, qmax)
    N, K = w.shape
    if overwrite and isinstance(gram, np.ndarray) and gram.dtype == np.float64:
        H = gram
    else:
        H = np.array(gram, np.float64, copy=True)
    del gram
    if act_order:
        perm = np.argsort(-np.diag(H), kind="stable")
        q, _ = gptq_quantize(w[:, perm], H[np.ix_(perm, perm)], damp, block, False, qmax=qmax)
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
        q = np.clip(np.rint(w / scale[:, None]), -qmax, qmax).astype(np.int8)
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
            np.clip(q, -qmax, qmax, out=q)
            d = D[j]
            np.multiply(q, s, out=d)
            np.subtract(WT[j], d, out=d)
            if j + 1 < i2:
                C[j + 1 - i1 :] += R[j, j + 1 : i2, None] * d[None, :]
    return np.ascontiguousarray(QT.T).astype(np.int8), scale


def weight_bits_option(extra: dict | None):
    """QuantConfig.extra["weight_bits"]: 8 (the default: every linear 8-bit), 7 (every INT8
    linear 7-bit) or "auto" (7 where the linear's output SQNR with 7-bit weights stays within
    extra["weight_bits_loss_db"] (default AUTO_LOSS_DB) of its 8-bit SQNR: choose_weight_bits)."""
    v = (extra or {}).get("weight_bits", 8)
    if isinstance(v, str) and v.strip().lower() == "auto":
        return "auto"
    try:
        b = int(v)
    except (TypeError, ValueError):
        b = None
    if b not in (7, 8):
        raise ValueError(f"weight_bits must be 8, 7 or 'auto', got {v!r}")
    return b


def with_weight_bits(quant_config, weight_bits):
    """quant_config (None, a dict of QuantConfig fields or a QuantConfig) with
    extra["weight_bits"] = weight_bits (8, 7 or "auto"; 8 leaves the config as it is, so its
    digest is unchanged)."""
    import dataclasses

    from zoi.quant.config import QuantConfig

    wb = weight_bits_option({"weight_bits": weight_bits})
    if wb == 8:
        return quant_config
    if isinstance(quant_config, QuantConfig):
        return dataclasses.replace(quant_config, extra={**quant_config.extra, "weight_bits": wb})
    d = dict(quant_config or {})
    d["extra"] = {**dict(d.get("extra") or {}), "weight_bits": wb}
    return d


# "auto": a linear takes 7-bit weights when its output SQNR (zoi.quant.sensitivity.layer_sqnr,
# worst calibration domain) loses at most this much against its 8-bit SQNR: the layers whose
# error is the activations' rather than the weights' (docs/QUANT.md "7-bit weights")
AUTO_LOSS_DB = 1.0


def choose_weight_bits(
    option, sqnr8: dict, sqnr7: dict, int8_linears, loss_db: float | None = None
) -> dict[str, int]:
    """{prefix: 7 or 8} of the INT8 linears (option: weight_bits_option's). "auto": 7 where
    sqnr8[p] - sqnr7[p] <= loss_db."""
    if option == 8:
        return {p: 8 for p in int8_linears}
    if option == 7:
        return {p: 7 for p in int8_linears}
    lim = AUTO_LOSS_DB if loss_db is None else float(loss_db)
    return {p: 7 if sqnr8[p] - sqnr7[p] <= lim else 8 for p in int8_linears}
