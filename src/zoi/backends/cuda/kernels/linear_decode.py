"""The decoder's linear: out[M, N] = epilogue(x[M, K] @ W[N, K]^T). Two kernels with the same
arguments, epilogues and split-K; the config's ``kind`` (picked per call site in linear_table.py)
says which and how:

* ``gemv_kernel`` ("gemv"): decode at M <= 4: no tl.dot; W tiles [BLOCK_N, BLOCK_K]
  with K contiguous (16-byte loads of the checkpoint layout), fp32 FMA and a tl.sum over K.
* ``mma_kernel`` ("mma"): decode at M <= 32: tl.dot on W tiles loaded K-contiguous and
  transposed in registers (or W the left operand: ``swap``); ("dot"): the prefill (M = packed
  tokens), the same kernel with W tiles read as [BLOCK_K, BLOCK_N] through strides (``W_KN``).

INT8 weights reach the gemv / mma arithmetic through exponent-bit tricks (an integer add and a
float add per weight: _w_f32 / _w_op), not I2F, whose 16 per clock per SM is below what the HBM
delivers to an SM at batch 1.

Weights stay in the checkpoint's [N, K] layout: INT8 weight-only (symmetric, one fp32 scale per
output channel, dequantised in the epilogue: acc * scale[n]), FP16, or FP32 (tests: exact IEEE
dot). Activations enter ``tl.dot`` as FP16 (FP32 when IEEE), accumulation is FP32.

Fusions, chosen per call site by constexpr flags:

* ``RMS``: the input is the FP32 residual stream and the RMSNorm in front of the linear is fused:
  the norm's gain is folded into W's columns at upload, the row's sum of squares is accumulated
  from the very x tiles the dot reads and the accumulator is scaled by rsqrt(ss / K + eps) at the
  end ((x * r) @ W^T = r * (x @ W^T)).
* ``HAS_BIAS`` (Qwen2's qkv), ``RESIDUAL`` (out = res + acc; res may alias out: h += o(x)),
  ``SWIGLU`` (W is gate rows then up rows, [2N, K]; out = silu(x W_g^T) * (x W_u^T)),
  ``GATHER`` (x row m is rows[m]: lm_head over the last token of each packed prompt).
* ``SPLIT_K`` > 1 (decode, where N / BLOCK_N tiles alone leave SMs idle): each K slice writes its
  partial tile to a workspace and bumps the tile's counter; the program that arrives last sums
  the partials in slice order (deterministic, whoever arrives last), runs the epilogue and resets
  the counter to 0 (so a captured graph can replay it). One launch, no memset.
"""

from __future__ import annotations

import triton
import triton.language as tl

from zoi.backends.cuda.kernels.linear_table import (  # noqa: F401 - re-exported: kl.pick_config, ...
    SMEM_BUDGET,
    LinearConfig,
    counters,
    pick_config,
    workspace_floats,
)
from zoi.backends.cuda.kernels.pdl import can_prefetch, pdl_begin, prefetch_l2


@triton.jit
def _epilogue(
    acc,
    acc_u,
    ss,
    rm,
    rn,
    M,
    N,
    K,
    eps,
    s_ptr,
    b_ptr,
    res_ptr,
    out_ptr,
    ldo,
    W_INT8: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    RMS: tl.constexpr,
    SWIGLU: tl.constexpr,
    RESIDUAL: tl.constexpr,
):
    m_ok = rm < M
    n_ok = rn < N
    if W_INT8:
        acc = acc * tl.load(s_ptr + rn, mask=n_ok, other=0.0)[None, :]
        if SWIGLU:
            acc_u = acc_u * tl.load(s_ptr + N + rn, mask=n_ok, other=0.0)[None, :]
    if RMS:
        r = 1.0 / tl.sqrt(ss / K + eps)
        acc = acc * r[:, None]
        if SWIGLU:
            acc_u = acc_u * r[:, None]
    if HAS_BIAS:
        acc = acc + tl.load(b_ptr + rn, mask=n_ok, other=0.0)[None, :]
    if SWIGLU:
        acc = acc * tl.sigmoid(acc) * acc_u
    mask = m_ok[:, None] & n_ok[None, :]
    offs = rm[:, None].to(tl.int64) * ldo + rn[None, :]
    if RESIDUAL:
        acc = acc + tl.load(res_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + offs, acc.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _quant_rows(x):
    """W8A8: x [BM, BK] fp32 as int8 per (row, K tile): q = floor(x / s + 0.5), s = amax / 127
    (1 for a zero row); returns (q, s [BM])."""
    a = tl.max(tl.abs(x), 1)
    sx = tl.where(a > 0, a / 127.0, 1.0)
    q = tl.floor(x / sx[:, None] + 0.5)
    return tl.minimum(tl.maximum(q, -127.0), 127.0).to(tl.int8), sx


@triton.jit
def _dot(x, w, acc, IEEE: tl.constexpr):
    """acc + x @ w (x fp32 [BM, BK], w [BK, BN] of the weight dtype): exact IEEE fp32 or fp16 in."""
    if IEEE:
        acc = tl.dot(x, w.to(tl.float32), acc, input_precision="ieee")
    else:
        acc = tl.dot(x.to(tl.float16), w.to(tl.float16), acc)
    return acc


@triton.jit
def _split_k_reduce(
    acc,
    acc_u,
    ss,
    pid_m,
    pid_n,
    pid_k,
    ws_ptr,
    cnt_ptr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SPLIT_K,  # slices (a runtime int: one compile serves every split)
    SWIGLU: tl.constexpr,
):
    """Write this K slice's partial tile (acc, acc_u, ss) and bump the tile's counter; the last
    slice in sums every partial in slice order and resets the counter. Returns the sums (this
    slice's own partials elsewhere) and whether this program is the last."""
    NACC: tl.constexpr = 2 if SWIGLU else 1
    TILE: tl.constexpr = BLOCK_M * BLOCK_N * NACC + BLOCK_M
    tile = pid_m * tl.num_programs(1) + pid_n
    lm = tl.arange(0, BLOCK_M)
    ln = tl.arange(0, BLOCK_N)
    loc = lm[:, None] * BLOCK_N + ln[None, :]
    base = ws_ptr + tile.to(tl.int64) * (SPLIT_K * TILE)
    mine = base + pid_k * TILE
    tl.store(mine + loc, acc)
    if SWIGLU:
        tl.store(mine + BLOCK_M * BLOCK_N + loc, acc_u)
    tl.store(mine + BLOCK_M * BLOCK_N * NACC + lm, ss)
    tl.debug_barrier()  # every thread's partial is written before the counter moves
    seen = tl.atomic_add(cnt_ptr + tile, 1)  # acq_rel, gpu scope
    last = seen == SPLIT_K - 1
    if last:  # the last slice in: reduce in slice order
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        acc_u = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        ss = tl.zeros([BLOCK_M], dtype=tl.float32)
        # four slices per trip, unrolled: their loads go out together (one L2 round trip per
        # four slices, not per slice); the sums stay in slice order (masked slices add 0)
        for s0 in range(0, SPLIT_K, 4):
            for u in tl.static_range(4):
                ok = s0 + u < SPLIT_K
                p = base + (s0 + u) * TILE
                acc += tl.load(p + loc, mask=ok, other=0.0, cache_modifier=".cg")
                if SWIGLU:
                    acc_u += tl.load(
                        p + BLOCK_M * BLOCK_N + loc, mask=ok, other=0.0, cache_modifier=".cg"
                    )
                ss += tl.load(
                    p + BLOCK_M * BLOCK_N * NACC + lm, mask=ok, other=0.0, cache_modifier=".cg"
                )
        tl.store(cnt_ptr + tile, 0)
    return acc, acc_u, ss, last


@triton.jit
def _kn_step(x, w_cols, wu_cols, k, k_ok, n_ok, acc, acc_u, A8: tl.constexpr, SWIGLU: tl.constexpr,
             IEEE: tl.constexpr):  # fmt: skip
    """One K tile of the prefill ("dot" configs): W read as [BLOCK_K, BLOCK_N] through its
    strides, straight into tl.dot (no register transpose)."""
    wmask = k_ok[:, None] & n_ok[None, :]
    if A8:  # int8 x int8 -> int32 per K tile, scaled by the tile's row scales
        xq, sx = _quant_rows(x)
        d = tl.dot(xq, tl.load(w_cols + k[:, None], mask=wmask, other=0))
        acc += d.to(tl.float32) * sx[:, None]
        if SWIGLU:
            d = tl.dot(xq, tl.load(wu_cols + k[:, None], mask=wmask, other=0))
            acc_u += d.to(tl.float32) * sx[:, None]
    else:
        acc = _dot(x, tl.load(w_cols + k[:, None], mask=wmask, other=0), acc, IEEE)
        if SWIGLU:  # the up rows: the same dot on the second half of W
            acc_u = _dot(x, tl.load(wu_cols + k[:, None], mask=wmask, other=0), acc_u, IEEE)
    return acc, acc_u


# ---------------------------------------------------------------------------------------- decode
# gemv_kernel (M <= 4) and mma_kernel (M <= 32): W tiles loaded [BLOCK_N, BLOCK_K] with K
# contiguous (the checkpoint's [N, K]: 16-byte loads along K), the same epilogues and split-K
# reduce, the split count a runtime argument (one compile serves every split).


@triton.jit
def _w_f32(w, W_INT8: tl.constexpr, FAST_CVT: tl.constexpr):
    """A weight tile as fp32. INT8 with FAST_CVT: the bits 0x4B000080 + q are the float
    2**23 + 128 + q (exact for |q| <= 128), so q = that - 8388736: an integer add and a float add
    instead of I2F, which issues 16 per clock per SM on sm_90 (HBM feeds ~18 bytes per clock)."""
    if W_INT8 and FAST_CVT:
        v = (w.to(tl.int32) + 0x4B000080).to(tl.float32, bitcast=True) - 8388736.0
    else:
        v = w.to(tl.float32)
    return v


@triton.jit
def _w_op(w, W_INT8: tl.constexpr, FAST_CVT: tl.constexpr, IEEE: tl.constexpr):
    """A weight tile as a dot operand: fp32 when IEEE, else fp16; INT8 with FAST_CVT by the half
    trick: the bits 0x6480 + q are the half 1152 + q (exact), so q = that - 1152."""
    if IEEE:
        v = w.to(tl.float32)
    elif W_INT8 and FAST_CVT:
        v = (w.to(tl.int16) + 0x6480).to(tl.int16).to(tl.float16, bitcast=True) - 1152.0
    else:
        v = w.to(tl.float16)
    return v


@triton.jit
def _row_ptr(x_ptr, rows_ptr, m, M, ldx, GATHER: tl.constexpr):
    """Row m's x (rows[m] with GATHER; row 0 when m >= M, whose loads are masked off)."""
    if GATHER:
        r = tl.load(rows_ptr + m, mask=m < M, other=0)
    else:
        r = m
    return x_ptr + r.to(tl.int64) * ldx


@triton.jit
def _gemv_row(w, wu, xp, ok, k, k_ok, acc, acc_u, ssv, SWIGLU: tl.constexpr, RMS: tl.constexpr):
    """One row's step: acc[n] += sum_k w[n, k] x[k] (fp32 FMA); x*x kept per lane for the RMS."""
    x = tl.load(xp + k, mask=k_ok & ok, other=0.0, eviction_policy="evict_last").to(tl.float32)
    acc = acc + tl.sum(w * x[None, :], 1)
    if SWIGLU:
        acc_u = acc_u + tl.sum(wu * x[None, :], 1)
    if RMS:
        ssv = ssv + x * x
    return acc, acc_u, ssv


@triton.jit
def _put(acc, acc_u, ss, rmi, i, a, u, s):
    """Row i of the [BLOCK_M, BLOCK_N] tiles from the per-row vectors (after the K loop)."""
    sel = rmi == i
    acc = tl.where(sel[:, None], a[None, :], acc)
    acc_u = tl.where(sel[:, None], u[None, :], acc_u)
    ss = tl.where(sel, tl.sum(s, 0), ss)
    return acc, acc_u, ss


@triton.jit
def _prefetch_w(w_ptr, rn, N, K, k_lo, k_split, SWIGLU: tl.constexpr):
    """The rows rn (clamped to N) of W, columns [k_lo, k_lo + k_split), and the up rows with SWIGLU."""
    n = tl.minimum(rn, N - 1)
    nb = (tl.minimum(k_lo + k_split, K) - k_lo) * (w_ptr.dtype.element_ty.primitive_bitwidth // 8)
    prefetch_l2(w_ptr + (n.to(tl.int64) * K + k_lo), nb)
    if SWIGLU:
        prefetch_l2(w_ptr + ((n + N).to(tl.int64) * K + k_lo), nb)


@triton.jit
def gemv_kernel(
    x_ptr,  # [*, K] activations (fp16 / fp32), row stride ldx
    rows_ptr,  # [M] int32 (GATHER)
    w_ptr,  # [N (2N with SWIGLU), K] int8 / fp16 / fp32
    s_ptr,  # [N (2N)] fp32 per-channel scales (W_INT8)
    b_ptr,  # [N] fp32 bias (HAS_BIAS)
    res_ptr,  # [M, N] residual, row stride ldo (RESIDUAL; may alias out)
    out_ptr,  # [M, N], row stride ldo
    ws_ptr,  # fp32 split-K workspace (HAS_SPLIT)
    cnt_ptr,  # int32 split-K tile counters (zero, and left zero)
    M,
    N,
    K,
    ldx,
    ldo,
    k_split,  # K columns per split (a multiple of BLOCK_K)
    n_split,  # K slices (grid dim 2)
    eps,
    BLOCK_M: tl.constexpr,  # rows per program: 1, 2 or 4 (each W tile feeds all of them)
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    HAS_SPLIT: tl.constexpr,
    FAST_CVT: tl.constexpr,
    W_INT8: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    RMS: tl.constexpr,
    GATHER: tl.constexpr,
    SWIGLU: tl.constexpr,
    RESIDUAL: tl.constexpr,
    PDL: tl.constexpr,
    PREFETCH: tl.constexpr,
):
    """Decode GEMV without tl.dot: fp32 products of the exact weight (INT8 q, FP16, FP32) and the
    exact x, fp32 sums (per K step: a tree over the tile's K lanes, then into the row's acc)."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    if PREFETCH:  # this program's W slice into L2 while the previous kernel finishes (pdl.py)
        _prefetch_w(w_ptr, rn, N, K, pid_k * k_split, k_split, SWIGLU)
    pdl_begin(PDL)
    rk = tl.arange(0, BLOCK_K)
    n_ok = rn < N
    m0 = pid_m * BLOCK_M
    xp0 = _row_ptr(x_ptr, rows_ptr, m0, M, ldx, GATHER)
    if BLOCK_M > 1:
        xp1 = _row_ptr(x_ptr, rows_ptr, m0 + 1, M, ldx, GATHER)
    if BLOCK_M > 2:
        xp2 = _row_ptr(x_ptr, rows_ptr, m0 + 2, M, ldx, GATHER)
        xp3 = _row_ptr(x_ptr, rows_ptr, m0 + 3, M, ldx, GATHER)
    a0 = tl.zeros([BLOCK_N], dtype=tl.float32)  # row i's sums: a (gate), u (up), s (x*x lanes)
    a1 = tl.zeros([BLOCK_N], dtype=tl.float32)
    a2 = tl.zeros([BLOCK_N], dtype=tl.float32)
    a3 = tl.zeros([BLOCK_N], dtype=tl.float32)
    u0 = tl.zeros([BLOCK_N], dtype=tl.float32)
    u1 = tl.zeros([BLOCK_N], dtype=tl.float32)
    u2 = tl.zeros([BLOCK_N], dtype=tl.float32)
    u3 = tl.zeros([BLOCK_N], dtype=tl.float32)
    s0 = tl.zeros([BLOCK_K], dtype=tl.float32)
    s1 = tl.zeros([BLOCK_K], dtype=tl.float32)
    s2 = tl.zeros([BLOCK_K], dtype=tl.float32)
    s3 = tl.zeros([BLOCK_K], dtype=tl.float32)
    w_rows = w_ptr + rn[:, None].to(tl.int64) * K
    wu_rows = w_ptr + (rn + N)[:, None].to(tl.int64) * K
    k_lo = pid_k * k_split
    k_hi = tl.minimum(k_lo + k_split, K)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        k = k0 + rk
        k_ok = k < k_hi
        wm = n_ok[:, None] & k_ok[None, :]
        wt = tl.load(w_rows + k[None, :], mask=wm, other=0, eviction_policy="evict_first")
        w = _w_f32(wt, W_INT8, FAST_CVT)
        wu = w
        if SWIGLU:  # the up rows: the same products on the second half of W
            wt = tl.load(wu_rows + k[None, :], mask=wm, other=0, eviction_policy="evict_first")
            wu = _w_f32(wt, W_INT8, FAST_CVT)
        a0, u0, s0 = _gemv_row(w, wu, xp0, m0 < M, k, k_ok, a0, u0, s0, SWIGLU, RMS)
        if BLOCK_M > 1:
            a1, u1, s1 = _gemv_row(w, wu, xp1, m0 + 1 < M, k, k_ok, a1, u1, s1, SWIGLU, RMS)
        if BLOCK_M > 2:
            a2, u2, s2 = _gemv_row(w, wu, xp2, m0 + 2 < M, k, k_ok, a2, u2, s2, SWIGLU, RMS)
            a3, u3, s3 = _gemv_row(w, wu, xp3, m0 + 3 < M, k, k_ok, a3, u3, s3, SWIGLU, RMS)
    rmi = tl.arange(0, BLOCK_M)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_u = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    ss = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc, acc_u, ss = _put(acc, acc_u, ss, rmi, 0, a0, u0, s0)
    if BLOCK_M > 1:
        acc, acc_u, ss = _put(acc, acc_u, ss, rmi, 1, a1, u1, s1)
    if BLOCK_M > 2:
        acc, acc_u, ss = _put(acc, acc_u, ss, rmi, 2, a2, u2, s2)
        acc, acc_u, ss = _put(acc, acc_u, ss, rmi, 3, a3, u3, s3)
    last = True
    if HAS_SPLIT:
        acc, acc_u, ss, last = _split_k_reduce(
            acc, acc_u, ss, pid_m, pid_n, pid_k, ws_ptr, cnt_ptr, BLOCK_M, BLOCK_N, n_split, SWIGLU
        )
    if last:
        _epilogue(
            acc,
            acc_u,
            ss,
            m0 + rmi,
            rn,
            M,
            N,
            K,
            eps,
            s_ptr,
            b_ptr,
            res_ptr,
            out_ptr,
            ldo,
            W_INT8,
            HAS_BIAS,
            RMS,
            SWIGLU,
            RESIDUAL,
        )


@triton.jit
def mma_kernel(
    x_ptr,  # [*, K] activations (fp16 / fp32), row stride ldx
    rows_ptr,  # [M] int32 (GATHER)
    w_ptr,  # [N (2N with SWIGLU), K] int8 / fp16 / fp32
    s_ptr,  # [N (2N)] fp32 per-channel scales (W_INT8)
    b_ptr,  # [N] fp32 bias (HAS_BIAS)
    res_ptr,  # [M, N] residual, row stride ldo (RESIDUAL; may alias out)
    out_ptr,  # [M, N], row stride ldo
    ws_ptr,  # fp32 split-K workspace (HAS_SPLIT)
    cnt_ptr,  # int32 split-K tile counters (zero, and left zero)
    M,
    N,
    K,
    ldx,
    ldo,
    k_split,  # K columns per split (a multiple of BLOCK_K)
    n_split,  # K slices (grid dim 2)
    eps,
    BLOCK_M: tl.constexpr,  # >= 16 (tl.dot)
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    HAS_SPLIT: tl.constexpr,
    SWAP: tl.constexpr,  # acc^T = W x^T: BLOCK_N is the MMA's M (wgmma wants 64)
    FAST_CVT: tl.constexpr,
    W_INT8: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    RMS: tl.constexpr,
    GATHER: tl.constexpr,
    SWIGLU: tl.constexpr,
    RESIDUAL: tl.constexpr,
    IEEE: tl.constexpr,
    PDL: tl.constexpr,
    PREFETCH: tl.constexpr,
    A8: tl.constexpr,
    W_KN: tl.constexpr,  # prefill ("dot" configs): W tiles read [BLOCK_K, BLOCK_N] (_kn_step)
):
    """GEMM on tl.dot, fp16 operands (fp32 IEEE), fp32 accumulation. Decode ("mma" configs,
    M <= 32): W read as stored (K contiguous) and transposed in registers, or (SWAP) W the left
    operand; prefill ("dot" configs, W_KN): W tiles read [BLOCK_K, BLOCK_N] through strides."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    if PREFETCH:  # this program's W slice into L2 while the previous kernel finishes (pdl.py)
        _prefetch_w(w_ptr, rn, N, K, pid_k * k_split, k_split, SWIGLU)
    pdl_begin(PDL)
    rk = tl.arange(0, BLOCK_K)
    m_ok = rm < M
    n_ok = rn < N
    if GATHER:
        xrow = tl.load(rows_ptr + rm, mask=m_ok, other=0)
    else:
        xrow = rm
    x_rows = x_ptr + xrow[:, None].to(tl.int64) * ldx
    w_rows = w_ptr + rn[:, None].to(tl.int64) * K
    wu_rows = w_ptr + (rn + N)[:, None].to(tl.int64) * K
    w_rows_t = w_ptr + rn[None, :].to(tl.int64) * K  # W_KN
    wu_rows_t = w_ptr + (rn + N)[None, :].to(tl.int64) * K
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_u = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_t = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    acc_tu = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    ss = tl.zeros([BLOCK_M], dtype=tl.float32)
    k_lo = pid_k * k_split
    k_hi = tl.minimum(k_lo + k_split, K)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        k = k0 + rk
        k_ok = k < k_hi
        x = tl.load(x_rows + k[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        x = x.to(tl.float32)
        if RMS:
            ss += tl.sum(x * x, 1)
        wm = n_ok[:, None] & k_ok[None, :]
        if W_KN:
            acc, acc_u = _kn_step(
                x, w_rows_t, wu_rows_t, k, k_ok, n_ok, acc, acc_u, A8, SWIGLU, IEEE
            )
        elif A8:  # W8A8: int8 x int8 -> int32 per K tile, scaled by the tile's row scales
            xq, sx = _quant_rows(x)
            wq = tl.load(w_rows + k[None, :], mask=wm, other=0)
            if SWAP:
                acc_t += tl.dot(wq, tl.trans(xq)).to(tl.float32) * sx[None, :]
            else:
                acc += tl.dot(xq, tl.trans(wq)).to(tl.float32) * sx[:, None]
            if SWIGLU:
                wq = tl.load(wu_rows + k[None, :], mask=wm, other=0)
                if SWAP:
                    acc_tu += tl.dot(wq, tl.trans(xq)).to(tl.float32) * sx[None, :]
                else:
                    acc_u += tl.dot(xq, tl.trans(wq)).to(tl.float32) * sx[:, None]
        else:
            if not IEEE:
                x = x.to(tl.float16)
            w = _w_op(tl.load(w_rows + k[None, :], mask=wm, other=0), W_INT8, FAST_CVT, IEEE)
            if SWAP:
                acc_t = _dot(w, tl.trans(x), acc_t, IEEE)
            else:
                acc = _dot(x, tl.trans(w), acc, IEEE)
            if SWIGLU:
                wu = _w_op(tl.load(wu_rows + k[None, :], mask=wm, other=0), W_INT8, FAST_CVT, IEEE)
                if SWAP:
                    acc_tu = _dot(wu, tl.trans(x), acc_tu, IEEE)
                else:
                    acc_u = _dot(x, tl.trans(wu), acc_u, IEEE)
    if SWAP:
        acc = tl.trans(acc_t)
        if SWIGLU:
            acc_u = tl.trans(acc_tu)
    last = True
    if HAS_SPLIT:
        acc, acc_u, ss, last = _split_k_reduce(
            acc, acc_u, ss, pid_m, pid_n, pid_k, ws_ptr, cnt_ptr, BLOCK_M, BLOCK_N, n_split, SWIGLU
        )
    if last:
        _epilogue(
            acc,
            acc_u,
            ss,
            rm,
            rn,
            M,
            N,
            K,
            eps,
            s_ptr,
            b_ptr,
            res_ptr,
            out_ptr,
            ldo,
            W_INT8,
            HAS_BIAS,
            RMS,
            SWIGLU,
            RESIDUAL,
        )


def linear(
    x,
    w,
    out,
    M: int,
    N: int,
    K: int,
    cfg: LinearConfig,
    *,
    scale=None,
    bias=None,
    res=None,
    rows=None,
    rms_eps: float | None = None,
    swiglu: bool = False,
    ws=None,
    cnt=None,
    ieee: bool = False,
    ldx: int | None = None,
    pdl: bool = False,
    prefetch: bool = False,
    a8: bool = False,
):
    """Launch one linear. x, w, out, ... are device tensors (torch, CPU ones under the
    interpreter); N is the output width (the gate width with swiglu). a8 (W8A8, INT8 weights
    only): the dot and mma kernels quantise x per (row, K tile) and run int8 x int8 dots; the
    gemv kernel (M <= 4) stays weight-only (at batch 1 W's bytes, not the dot, bound it)."""
    if a8 and (scale is None or ieee):
        raise ValueError("a8 (W8A8) needs INT8 weights (a scale) and ieee=False")
    if cfg.split_k > 1 and (ws is None or cnt is None):
        raise ValueError("split-K needs a workspace and counters")
    kb = triton.cdiv(triton.cdiv(K, cfg.block_k), cfg.split_k) * cfg.block_k
    split = triton.cdiv(K, kb)
    if split > 1 and (
        ws.numel() < workspace_floats(M, N, cfg, swiglu) or cnt.numel() < counters(M, N, cfg)
    ):
        raise ValueError(
            f"split-K workspace {ws.numel()} floats / {cnt.numel()} counters is under what {cfg} "
            f"needs at M={M} N={N}: size them with workspace_floats() / counters()"
        )
    grid = (triton.cdiv(M, cfg.block_m), triton.cdiv(N, cfg.block_n), split)
    _launch_decode(
        x, w, out, M, N, K, cfg, grid, kb, split, scale, bias, res, rows, rms_eps, swiglu,
        ws, cnt, ieee, ldx, pdl, pdl and prefetch and can_prefetch(w, K), a8,
    )  # fmt: skip


def _launch_decode(
    x, w, out, M, N, K, cfg, grid, kb, split, scale, bias, res, rows, rms_eps, swiglu, ws, cnt,
    ieee, ldx, pdl, prefetch, a8,
):  # fmt: skip
    if cfg.kind == "gemv":
        if cfg.block_m not in (1, 2, 4):
            raise ValueError(f"gemv config {cfg}: block_m must be 1, 2 or 4")
        kern, extra = gemv_kernel, {}
    elif cfg.kind in ("mma", "dot"):
        if min(cfg.block_m, cfg.block_n, cfg.block_k) < 16:
            raise ValueError(f"{cfg.kind} config {cfg}: tl.dot needs block_m/n/k >= 16")
        kn = cfg.kind == "dot"
        kern, extra = mma_kernel, dict(SWAP=cfg.swap and not kn, IEEE=ieee, A8=a8, W_KN=kn)
        prefetch = prefetch and not kn  # the prefill's W is read once per M tile: no L2 prefetch
    else:
        raise ValueError(f"config kind {cfg.kind!r}: use dot, gemv or mma")
    dummy = out
    kern[grid](
        x,
        rows if rows is not None else dummy,
        w,
        scale if scale is not None else dummy,
        bias if bias is not None else dummy,
        res if res is not None else dummy,
        out,
        ws if ws is not None else dummy,
        cnt if cnt is not None else dummy,
        M,
        N,
        K,
        x.stride(0) if ldx is None else ldx,
        out.stride(0),
        kb,
        split,
        float(rms_eps or 0.0),
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k,
        HAS_SPLIT=split > 1,
        FAST_CVT=cfg.fast_cvt,
        W_INT8=scale is not None,
        HAS_BIAS=bias is not None,
        RMS=rms_eps is not None,
        GATHER=rows is not None,
        SWIGLU=swiglu,
        RESIDUAL=res is not None,
        PDL=pdl,
        PREFETCH=prefetch,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
        launch_pdl=pdl,
        **extra,
    )
