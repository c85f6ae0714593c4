"""embed: x = LayerNorm(word[ids] + pos[positions] + type[0]) * w + b, one program per BLOCK_R rows
(posemb None: no position table, as ModernBERT; lnw None: no norm, x = word[ids], as the decoder
architectures, whose first RMSNorm is the first layer's).

Also writes, for the first INT8 linear, the per-row amax of x or its int8 copy (with a_scale /
zero point, after that linear's act_shift / act_mul: ``quantize.quant_rows``), and zeroes the rows of the
atomic amax buffers that later kernels of the same forward max into (one region
``[n_zero, zero_stride]``), so no separate memset node is needed in the graph.
"""

from __future__ import annotations

import triton
import triton.language as tl

from zoi.backends.cuda.kernels.attention import tile_table
from zoi.backends.cuda.kernels.common import amax_rows, layernorm_rows
from zoi.backends.cuda.kernels.pdl import pdl_begin
from zoi.backends.cuda.kernels.quantize import QMODES, first_row_seq, quant_rows


@triton.jit
def embed_kernel(
    ids_ptr,  # [T] int32 token ids
    pos_ptr,  # [T] int32 position ids (already offset)
    word_ptr,  # [V, H] fp16 (WORD_Q: int8)
    word_scale_ptr,  # [V] fp32 per-row scale (WORD_Q)
    posemb_ptr,  # [P, H] fp16
    type_ptr,  # [H] fp16, row 0 of the token-type table (HAS_TYPE)
    lnw_ptr,  # [H] fp32
    lnb_ptr,  # [H] fp32
    x_ptr,  # [T, H] output, row stride ldx
    amax_ptr,  # [T] fp32 per-row amax of x (AMAX_OUT)
    xq_ptr,  # [T, H] int8 per-token quantised x, row stride ldxq (Q_OUT)
    xqs_ptr,  # [T] fp32 a_scale of xq (Q_OUT)
    xqz_ptr,  # [T] int32 zero point of xq (Q_OUT 3)
    qshift_ptr,  # [H] fp32 act_shift of the consumer (Q_SHIFT)
    qmul_ptr,  # [H] fp32 act_mul of the consumer (Q_MUL)
    zero_ptr,  # [n_zero, zero_stride] fp32, rows < T zeroed
    hdr_ptr,  # [>=3] int32 call header [flag, B, T] (TILES)
    cu_ptr,  # [B + 1] int32 cu_seqlens (TILES)
    tcum_ptr,  # [B] int32 attention tile table, written by program 0 (TILES)
    fr_map_ptr,  # [T] int32 out: row -> the sequence it starts, or -1 (FR_MAP, with TILES)
    T,
    H,
    ldx,
    ldxq,
    n_zero,
    zero_stride,
    eps,
    q_static_amax,
    WORD_Q: tl.constexpr,
    HAS_TYPE: tl.constexpr,
    AMAX_OUT: tl.constexpr,
    Q_OUT: tl.constexpr,  # 0, or the quantize.QMODES mode of the int8 copy
    Q_SHIFT: tl.constexpr,
    Q_MUL: tl.constexpr,
    TILES: tl.constexpr,
    TILE_M: tl.constexpr,  # attention BLOCK_M
    BLOCK_B: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_H: tl.constexpr,
    PDL: tl.constexpr,
    HAS_POS: tl.constexpr = True,  # False: no position table (ModernBERT: RoPE in attention)
    HAS_LN: tl.constexpr = True,  # False: no embedding norm (decoder architectures)
    FR_MAP: tl.constexpr = False,  # the first-row residual's row map (linear.py FIRST_ROW)
):
    pdl_begin(PDL)  # programmatic dependent launch: wait for the previous kernel's writes
    pid = tl.program_id(0)
    if TILES:
        if pid == 0:
            tile_table(hdr_ptr, cu_ptr, tcum_ptr, TILE_M, BLOCK_B)
    rows = pid * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.arange(0, BLOCK_H)
    r_ok = rows < T
    c_ok = cols < H
    m2 = r_ok[:, None] & c_ok[None, :]
    if FR_MAP:  # with the call's header and cu_seqlens at hand: no launch of its own
        seq = first_row_seq(rows, tl.load(hdr_ptr + 1), cu_ptr, BLOCK_B)
        tl.store(fr_map_ptr + rows, seq, mask=r_ok)
    ids = tl.load(ids_ptr + rows, mask=r_ok, other=0).to(tl.int64)
    w = tl.load(word_ptr + ids[:, None] * H + cols[None, :], mask=m2, other=0).to(tl.float32)
    if WORD_Q:
        ws = tl.load(word_scale_ptr + ids, mask=r_ok, other=0.0)
        w = w * ws[:, None]
    x = w
    if HAS_POS:
        pos = tl.load(pos_ptr + rows, mask=r_ok, other=0).to(tl.int64)
        pe = tl.load(posemb_ptr + pos[:, None] * H + cols[None, :], mask=m2, other=0)
        x = w + pe.to(tl.float32)
    if HAS_TYPE:
        x = x + tl.load(type_ptr + cols, mask=c_ok, other=0).to(tl.float32)[None, :]
    if HAS_LN:
        lw = tl.load(lnw_ptr + cols, mask=c_ok, other=0.0)
        lb = tl.load(lnb_ptr + cols, mask=c_ok, other=0.0)
        y = layernorm_rows(x, c_ok, lw, lb, H, eps).to(x_ptr.dtype.element_ty)
    else:
        y = x.to(x_ptr.dtype.element_ty)
    tl.store(x_ptr + rows[:, None].to(tl.int64) * ldx + cols[None, :], y, mask=m2)
    if AMAX_OUT:
        am = amax_rows(tl.where(m2, y.to(tl.float32), 0.0))  # NaN-keeping
        tl.store(amax_ptr + rows, am, mask=r_ok)
    if Q_OUT != 0:
        q, qs, qz = quant_rows(
            y.to(tl.float32), cols, c_ok, qshift_ptr, qmul_ptr, q_static_amax, Q_OUT, Q_SHIFT, Q_MUL
        )
        tl.store(xq_ptr + rows[:, None].to(tl.int64) * ldxq + cols[None, :], q, mask=m2)
        tl.store(xqs_ptr + rows, qs, mask=r_ok)
        if Q_OUT == 3:
            tl.store(xqz_ptr + rows, qz, mask=r_ok)
    for z in range(0, n_zero):
        tl.store(zero_ptr + z * zero_stride + rows, tl.zeros((BLOCK_R,), tl.float32), mask=r_ok)


def pick_config(H: int) -> dict:
    bh = triton.next_power_of_2(H)
    return dict(BLOCK_R=max(1, min(16, 4096 // bh)), BLOCK_H=bh, num_warps=4 if bh <= 1024 else 8)


def launch_embed(
    ids,
    pos,
    word,
    word_scale,
    posemb,
    type0,
    lnw,
    lnb,
    x,
    amax,
    zero,
    T,
    H,
    n_zero,
    zero_stride,
    eps,
    tiles=None,
    cfg=None,
    pdl=False,
    xq=None,
    xq_scale=None,
    xq_zp=None,
    q_mode="dynamic",
    q_shift=None,
    q_mul=None,
    q_static_amax=0.0,
    first_row_map=None,
):
    """tiles: None, or (hdr, cu, tcum, attention BLOCK_M, BLOCK_B) to build the tile table.
    first_row_map: also write int32 [T] row -> the sequence it starts, or -1 (needs tiles: the
    header's B and cu_seqlens), for the linears' first-row term.
    xq: also write the int8 copy of x for the first linear (quantize.quant_rows, q_mode).
    lnw / lnb None: no embedding norm."""
    if (lnw is None) != (lnb is None):
        raise ValueError("embed: the norm needs both its weight and its bias")
    has_ln = lnw is not None
    if not has_ln:  # a stand-in for the unused pointers (never read: HAS_LN off)
        lnw = lnb = x
    cfg = cfg or pick_config(H)
    qmode = (QMODES[q_mode] if isinstance(q_mode, str) else int(q_mode)) if xq is not None else 0
    assert qmode == 0 or xq_scale is not None
    assert qmode != 3 or xq_zp is not None
    hdr, cu, tcum, tile_m, block_b = tiles if tiles is not None else (lnw, lnw, lnw, 16, 16)
    assert first_row_map is None or tiles is not None, "the first-row map needs tiles (cu)"
    embed_kernel[(triton.cdiv(T, cfg["BLOCK_R"]),)](
        ids,
        pos,
        word,
        word_scale if word_scale is not None else lnw,
        posemb if posemb is not None else lnw,
        type0 if type0 is not None else lnw,
        lnw,
        lnb,
        x,
        amax if amax is not None else lnw,
        xq if xq is not None else x,
        xq_scale if xq_scale is not None else lnw,
        xq_zp if xq_zp is not None else lnw,
        q_shift if q_shift is not None else lnw,
        q_mul if q_mul is not None else lnw,
        zero if zero is not None else lnw,
        hdr,
        cu,
        tcum,
        first_row_map if first_row_map is not None else tcum,
        T,
        H,
        x.stride(0),
        xq.stride(0) if xq is not None else 0,
        n_zero,
        zero_stride,
        float(eps),
        float(q_static_amax),
        WORD_Q=word_scale is not None,
        HAS_TYPE=type0 is not None,
        AMAX_OUT=amax is not None,
        Q_OUT=qmode,
        Q_SHIFT=q_shift is not None,
        Q_MUL=q_mul is not None,
        TILES=tiles is not None,
        HAS_POS=posemb is not None,
        HAS_LN=has_ln,
        FR_MAP=first_row_map is not None,
        TILE_M=tile_m,
        BLOCK_B=block_b,
        PDL=pdl,
        launch_pdl=pdl,
        **cfg,
    )
