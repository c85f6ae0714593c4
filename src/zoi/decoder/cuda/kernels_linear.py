"""The decoder's linear: out[M, N] = epilogue(x[M, K] @ W[N, K]^T), one Triton kernel for decode
(M = batch, 1..32: a GEMV padded to a 16-row tile) and prefill (M = packed tokens).

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

from dataclasses import dataclass

import triton
import triton.language as tl


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
    SPLIT_K: tl.constexpr,
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
        for s in range(SPLIT_K):
            p = base + s * TILE
            acc += tl.load(p + loc, cache_modifier=".cg")
            if SWIGLU:
                acc_u += tl.load(p + BLOCK_M * BLOCK_N + loc, cache_modifier=".cg")
            ss += tl.load(p + BLOCK_M * BLOCK_N * NACC + lm, cache_modifier=".cg")
        tl.store(cnt_ptr + tile, 0)
    return acc, acc_u, ss, last


@triton.jit
def linear_kernel(
    x_ptr,  # [*, K] activations (fp16 / fp32), row stride ldx
    rows_ptr,  # [M] int32 (GATHER)
    w_ptr,  # [N (2N with SWIGLU), K] int8 / fp16 / fp32
    s_ptr,  # [N (2N)] fp32 per-channel scales (W_INT8)
    b_ptr,  # [N] fp32 bias (HAS_BIAS)
    res_ptr,  # [M, N] residual, row stride ldo (RESIDUAL)
    out_ptr,  # [M, N], row stride ldo
    ws_ptr,  # fp32 split-K workspace
    cnt_ptr,  # int32 split-K tile counters (zero, and left zero)
    M,
    N,
    K,
    ldx,
    ldo,
    k_split,  # K columns per split (a multiple of BLOCK_K)
    eps,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr,
    W_INT8: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    RMS: tl.constexpr,
    GATHER: tl.constexpr,
    SWIGLU: tl.constexpr,
    RESIDUAL: tl.constexpr,
    IEEE: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    m_ok = rm < M
    n_ok = rn < N
    if GATHER:
        xrow = tl.load(rows_ptr + rm, mask=m_ok, other=0)
    else:
        xrow = rm
    x_base = x_ptr + xrow[:, None].to(tl.int64) * ldx
    w_base = w_ptr + rn[None, :].to(tl.int64) * K
    wu_base = w_ptr + (rn + N)[None, :].to(tl.int64) * K
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_u = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    ss = tl.zeros([BLOCK_M], dtype=tl.float32)
    k_lo = pid_k * k_split
    k_hi = tl.minimum(k_lo + k_split, K)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        k = k0 + rk
        k_ok = k < k_hi
        x = tl.load(x_base + k[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        x = x.to(tl.float32)
        if RMS:
            ss += tl.sum(x * x, 1)
        wmask = k_ok[:, None] & n_ok[None, :]
        acc = _dot(x, tl.load(w_base + k[:, None], mask=wmask, other=0), acc, IEEE)
        if SWIGLU:  # the up rows: the same dot on the second half of W
            acc_u = _dot(x, tl.load(wu_base + k[:, None], mask=wmask, other=0), acc_u, IEEE)
    # the program that runs the epilogue: every one without split-K, the last K slice in with it
    last = True
    if SPLIT_K > 1:
        acc, acc_u, ss, last = _split_k_reduce(
            acc, acc_u, ss, pid_m, pid_n, pid_k, ws_ptr, cnt_ptr, BLOCK_M, BLOCK_N, SPLIT_K, SWIGLU
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


@dataclass(frozen=True)
class LinearConfig:
    block_m: int
    block_n: int
    block_k: int
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 3


SMEM_BUDGET = 160 * 1024  # bytes of pipelined tiles per program (H100 / H200: 227 KB per block)


def pick_config(
    M: int, N: int, K: int, sms: int, interpret: bool = False, wbytes: int = 1, swiglu: bool = False
) -> LinearConfig:
    """Tiles for one call site: decode (M <= 32) gets narrow N tiles and split-K until the grid
    covers ~2 programs per SM; prefill gets 64x64 tiles. The pipeline depth is what fits the
    shared-memory budget (x is staged as fp32 at the RMS sites; wbytes: weight element size)."""
    if interpret:  # the interpreter runs programs one by one: few, big programs
        bm = 16 if M <= 16 else 32 if M <= 32 else 64
        return LinearConfig(bm, 32 if N <= 32 else 64, 64 if K >= 64 else 32, 1, 4, 1)
    nw = 2 if swiglu else 1
    if M <= 32:
        bm, bn = (16 if M <= 16 else 32), 32
        bk = 256 if K >= 256 else 64
        while bk > 64 and 2 * (bm * bk * 4 + bk * bn * wbytes * nw) > SMEM_BUDGET:
            bk //= 2
        stages = int(max(2, min(4, SMEM_BUDGET // (bm * bk * 4 + bk * bn * wbytes * nw))))
        tiles = triton.cdiv(M, bm) * triton.cdiv(N, bn)
        kblocks = triton.cdiv(K, bk)
        split = max(1, min(kblocks, triton.cdiv(2 * sms, tiles), 16))
        return LinearConfig(bm, bn, bk, split, 4, stages)
    per = 64 * 64 * 4 + 64 * 64 * wbytes * nw
    return LinearConfig(64, 64, 64, 1, 4, int(max(2, min(3, SMEM_BUDGET // per))))


def workspace_floats(M: int, N: int, cfg: LinearConfig, swiglu: bool = False) -> int:
    if cfg.split_k == 1:
        return 0
    tiles = triton.cdiv(M, cfg.block_m) * triton.cdiv(N, cfg.block_n)
    return tiles * cfg.split_k * (cfg.block_m * cfg.block_n * (2 if swiglu else 1) + cfg.block_m)


def counters(M: int, N: int, cfg: LinearConfig) -> int:
    return triton.cdiv(M, cfg.block_m) * triton.cdiv(N, cfg.block_n)


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
):
    """Launch one linear. x, w, out, ... are device tensors (torch, CPU ones under the
    interpreter); N is the output width (the gate width with swiglu)."""
    if cfg.split_k > 1 and (ws is None or cnt is None):
        raise ValueError("split-K needs a workspace and counters")
    kb = triton.cdiv(triton.cdiv(K, cfg.block_k), cfg.split_k) * cfg.block_k
    split = triton.cdiv(K, kb)
    dummy = out
    grid = (triton.cdiv(M, cfg.block_m), triton.cdiv(N, cfg.block_n), split)
    linear_kernel[grid](
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
        float(rms_eps or 0.0),
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k,
        SPLIT_K=split,
        W_INT8=scale is not None,
        HAS_BIAS=bias is not None,
        RMS=rms_eps is not None,
        GATHER=rows is not None,
        SWIGLU=swiglu,
        RESIDUAL=res is not None,
        IEEE=ieee,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )
