"""Decoder attention on the GPU: RoPE + paged KV write, flash-decoding over the paged cache,
causal varlen prefill attention over packed prompts.

Layouts. qkv: [T, (H + 2 KVH) * D] (q heads | k heads | v heads, the fused projection's output).
KV pool, per layer: k_cache / v_cache [num_blocks + 1, KVH, BS, D] (block ``num_blocks`` is the
trash block the padded rows of a decode bucket write to and read from). A token's cache slot is
``block * BS + offset`` (host-computed: the slot mapping). Block tables: [max_batch,
max_blocks_per_seq] int32 on the device.

* ``rope_kv_kernel`` (grid T): per token, Qwen3's per-head q/k RMSNorm (optional), RoPE on q and
  k from the fp32 cos/sin table (rotate-half convention, transformers'), q and k written back in
  place, k and v written into the cache slot.
* ``decode_attn_kernel`` (grid B, KVH, SPLITS): one program is one sequence, one KV head (all G
  query heads of its GQA group, padded to a 16-row dot) and one slice of the sequence's blocks
  (flash-decoding). Slices write (acc, max, sum) partials; the last one in (a counter per
  (sequence, KV head), reset after) merges them in slice order: deterministic, one launch.
* ``prefill_attn_kernel`` (grid tiles, H): BLOCK_M query rows of one prompt (the host's tile
  table), keys of the same prompt up to the diagonal, online softmax in fp32 with exp2.
"""

from __future__ import annotations

import math

import numpy as np
import triton
import triton.language as tl

from zoi.backends.cuda.kernels.pdl import pdl_begin

LOG2E = 1.4426950408889634


@triton.jit
def _rope_heads(
    base,
    n_heads,
    pos_cs,
    cos_ptr,
    sin_ptr,
    nw_ptr,
    eps,
    D: tl.constexpr,
    HALF: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    BLOCK_H: tl.constexpr,
    NORM: tl.constexpr,
):
    """Load n_heads heads of D at base (row-major), qk-norm (NORM) + RoPE; -> two halves fp32."""
    h = tl.arange(0, BLOCK_H)
    i = tl.arange(0, BLOCK_HALF)
    msk = (h < n_heads)[:, None] & (i < HALF)[None, :]
    p1 = base + h[:, None] * D + i[None, :]
    x1 = tl.load(p1, mask=msk, other=0.0).to(tl.float32)
    x2 = tl.load(p1 + HALF, mask=msk, other=0.0).to(tl.float32)
    if NORM:
        r = 1.0 / tl.sqrt((tl.sum(x1 * x1, 1) + tl.sum(x2 * x2, 1)) / D + eps)
        x1 = x1 * r[:, None] * tl.load(nw_ptr + i, mask=i < HALF, other=0.0)[None, :]
        x2 = x2 * r[:, None] * tl.load(nw_ptr + HALF + i, mask=i < HALF, other=0.0)[None, :]
    c = tl.load(cos_ptr + pos_cs + i, mask=i < HALF, other=0.0)[None, :]
    s = tl.load(sin_ptr + pos_cs + i, mask=i < HALF, other=0.0)[None, :]
    return x1 * c - x2 * s, x2 * c + x1 * s, p1, msk


@triton.jit
def rope_kv_kernel(
    qkv_ptr,  # [T, (H + 2 KVH) D], row stride ldq; q and k rewritten in place
    pos_ptr,  # [T] int32 positions
    slot_ptr,  # [T] int32 cache slots
    cos_ptr,  # [max_seq_len, D / 2] fp32
    sin_ptr,
    qn_ptr,  # [D] fp32 q_norm weight (NORM)
    kn_ptr,  # [D] fp32 k_norm weight (NORM)
    kc_ptr,  # [NB + 1, KVH, BS, D] this layer's k cache
    vc_ptr,
    ldq,
    H,
    KVH,
    eps,
    D: tl.constexpr,
    BS: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_KV: tl.constexpr,
    NORM: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_begin(PDL)
    t = tl.program_id(0)
    HALF: tl.constexpr = D // 2
    pos = tl.load(pos_ptr + t)
    slot = tl.load(slot_ptr + t)
    row = qkv_ptr + t.to(tl.int64) * ldq
    pcs = pos * HALF
    q1, q2, qp, qm = _rope_heads(
        row, H, pcs, cos_ptr, sin_ptr, qn_ptr, eps, D, HALF, BLOCK_HALF, BLOCK_H, NORM
    )
    dt = qkv_ptr.dtype.element_ty
    tl.store(qp, q1.to(dt), mask=qm)
    tl.store(qp + HALF, q2.to(dt), mask=qm)
    k1, k2, kp, km = _rope_heads(
        row + H * D, KVH, pcs, cos_ptr, sin_ptr, kn_ptr, eps, D, HALF, BLOCK_HALF, BLOCK_KV, NORM
    )
    tl.store(kp, k1.to(dt), mask=km)
    tl.store(kp + HALF, k2.to(dt), mask=km)
    blk = slot // BS
    off = slot % BS
    h = tl.arange(0, BLOCK_KV)
    i = tl.arange(0, BLOCK_HALF)
    cache = ((blk.to(tl.int64) * KVH + h[:, None]) * BS + off) * D + i[None, :]
    ct = kc_ptr.dtype.element_ty
    tl.store(kc_ptr + cache, k1.to(ct), mask=km)
    tl.store(kc_ptr + cache + HALF, k2.to(ct), mask=km)
    vp = row + (H + KVH) * D + h[:, None] * D + i[None, :]
    tl.store(vc_ptr + cache, tl.load(vp, mask=km, other=0.0).to(ct), mask=km)
    tl.store(vc_ptr + cache + HALF, tl.load(vp + HALF, mask=km, other=0.0).to(ct), mask=km)


@triton.jit
def _dot(a, b, IEEE: tl.constexpr):
    if IEEE:
        return tl.dot(a, b, input_precision="ieee")
    return tl.dot(a.to(tl.float16), b.to(tl.float16))


@triton.jit
def decode_attn_kernel(
    q_ptr,  # [B, *] the qkv buffer (q | k | v), row stride ldq: roped q, or raw q k v (ROPE)
    kc_ptr,  # [NB + 1, KVH, BS, D]
    vc_ptr,
    tab_ptr,  # [*, max_blocks] int32 block tables, row stride max_blocks
    rix_ptr,  # [B] int32 the block-table row of each batch entry
    ctx_ptr,  # [B] int32 tokens in the cache (the current one included)
    o_ptr,  # [B, H D], row stride ldo
    ws_ptr,  # fp32 [B, KVH, SPLITS, BLOCK_G, BLOCK_D + 2] (SPLITS > 1)
    cnt_ptr,  # int32 [B, KVH] (SPLITS > 1), zero and left zero
    pos_ptr,  # ROPE: [B] int32 positions, slots, the cos / sin table, q / k norm weights
    slot_ptr,
    cos_ptr,
    sin_ptr,
    qn_ptr,
    kn_ptr,
    eps,
    ldq,
    ldo,
    max_blocks,
    H,
    KVH,
    G,
    qk_scale,  # 1/sqrt(D) * log2(e)
    D: tl.constexpr,
    BS: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    SPLITS: tl.constexpr,
    MIN_PER: tl.constexpr,
    ROPE: tl.constexpr,
    NORM: tl.constexpr,
    IEEE: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_begin(PDL)
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    sp = tl.program_id(2)
    HALF: tl.constexpr = D // 2
    ctx = tl.load(ctx_ptr + b)
    trow = tl.load(rix_ptr + b).to(tl.int64)
    nblk = tl.cdiv(ctx, BS)
    # slices of at least MIN_PER blocks: at short context fewer slices work and fewer partials
    # are merged; the slices past `active` have nothing to do
    per = tl.maximum(tl.cdiv(nblk, SPLITS), MIN_PER)
    active = tl.maximum(tl.cdiv(nblk, per), 1)
    if sp < active:
        j0 = sp * per
        j1 = tl.minimum(j0 + per, nblk)
        g = tl.arange(0, BLOCK_G)
        d = tl.arange(0, BLOCK_D)
        i = tl.arange(0, BLOCK_HALF)
        g_ok = g < G
        d_ok = d < D
        i_ok = i < HALF
        qh = kvh * G + g
        row = q_ptr + b.to(tl.int64) * ldq
        dt = q_ptr.dtype.element_ty
        if ROPE:  # RoPE (and Qwen3's q/k norm) here instead of a launch of rope_kv_kernel
            pcs = tl.load(pos_ptr + b) * HALF
            q1, q2, qp_, qm_ = _rope_heads(
                row + kvh * G * D, G, pcs, cos_ptr, sin_ptr, qn_ptr, eps, D, HALF, BLOCK_HALF,
                BLOCK_G, NORM,
            )  # fmt: skip
            q1 = q1.to(dt).to(tl.float32)  # rounded as rope_kv stores it: the same scores
            q2 = q2.to(dt).to(tl.float32)
            if sp == active - 1:  # the slice holding the current token writes its k and v
                kr1, kr2, kp_, km = _rope_heads(
                    row + (H + kvh) * D, 1, pcs, cos_ptr, sin_ptr, kn_ptr, eps, D, HALF,
                    BLOCK_HALF, 2, NORM,
                )  # fmt: skip
                slot = tl.load(slot_ptr + b)
                one = tl.zeros([2, 1], tl.int64)  # row 1 of the pair is masked off
                cache = one + (((slot // BS).to(tl.int64) * KVH + kvh) * BS + slot % BS) * D
                cache = cache + i[None, :]
                ct = kc_ptr.dtype.element_ty
                tl.store(kc_ptr + cache, kr1.to(ct), mask=km)
                tl.store(kc_ptr + cache + HALF, kr2.to(ct), mask=km)
                vp = row + (one + (H + KVH + kvh) * D + i[None, :])
                tl.store(vc_ptr + cache, tl.load(vp, mask=km, other=0.0).to(ct), mask=km)
                tl.store(
                    vc_ptr + cache + HALF, tl.load(vp + HALF, mask=km, other=0.0).to(ct), mask=km
                )
                tl.debug_barrier()  # the block's own reads below see the writes
        else:
            qm = g_ok[:, None] & i_ok[None, :]
            qp = row + qh[:, None] * D + i[None, :]
            q1 = tl.load(qp, mask=qm, other=0.0).to(tl.float32)
            q2 = tl.load(qp + HALF, mask=qm, other=0.0).to(tl.float32)
        q1 = q1 * qk_scale
        q2 = q2 * qk_scale
        t = tl.arange(0, BS)
        m = tl.full([BLOCK_G], float("-inf"), tl.float32)
        lsum = tl.zeros([BLOCK_G], tl.float32)
        acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
        for j in range(j0, j1):
            blk = tl.load(tab_ptr + trow * max_blocks + j)
            t_ok = (j * BS + t) < ctx
            tb = ((blk.to(tl.int64) * KVH + kvh) * BS + t)[:, None] * D
            km2 = t_ok[:, None] & i_ok[None, :]
            k1 = tl.load(kc_ptr + tb + i[None, :], mask=km2, other=0.0).to(tl.float32)
            k2 = tl.load(kc_ptr + tb + HALF + i[None, :], mask=km2, other=0.0).to(tl.float32)
            v = tl.load(vc_ptr + tb + d[None, :], mask=t_ok[:, None] & d_ok[None, :], other=0.0)
            s = _dot(q1, tl.trans(k1), IEEE) + _dot(q2, tl.trans(k2), IEEE)
            s = tl.where(t_ok[None, :], s, float("-inf"))
            m_new = tl.maximum(m, tl.max(s, 1))
            p = tl.exp2(s - m_new[:, None])
            alpha = tl.exp2(m - m_new)
            lsum = lsum * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + _dot(p, v.to(tl.float32), IEEE)
            m = m_new
        omask = g_ok[:, None] & d_ok[None, :]
        optr = o_ptr + b.to(tl.int64) * ldo + qh[:, None] * D + d[None, :]
        if SPLITS == 1:
            tl.store(optr, (acc / lsum[:, None]).to(o_ptr.dtype.element_ty), mask=omask)
        else:
            W: tl.constexpr = BLOCK_D + 2
            pair = b * KVH + kvh
            base = ws_ptr + pair.to(tl.int64) * (SPLITS * BLOCK_G * W)
            mine = base + sp * (BLOCK_G * W)
            tl.store(mine + g[:, None] * W + d[None, :], acc, mask=g_ok[:, None])
            tl.store(mine + g * W + BLOCK_D, m, mask=g_ok)
            tl.store(mine + g * W + BLOCK_D + 1, lsum, mask=g_ok)
            tl.debug_barrier()
            seen = tl.atomic_add(cnt_ptr + pair, 1)
            if seen == active - 1:
                # unrolled: the slices' loads are independent, so they go out together instead
                # of one L2 round trip after another; the G real rows of active slices only
                mx = tl.full([BLOCK_G], float("-inf"), tl.float32)
                for s in tl.static_range(SPLITS):
                    ok = g_ok & (s < active)
                    ms = tl.load(
                        base + s * (BLOCK_G * W) + g * W + BLOCK_D,
                        mask=ok,
                        other=float("-inf"),
                        cache_modifier=".cg",
                    )
                    mx = tl.maximum(mx, ms)
                tot = tl.zeros([BLOCK_G], tl.float32)
                out = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
                for s in tl.static_range(SPLITS):
                    p = base + s * (BLOCK_G * W)
                    ok = g_ok & (s < active)
                    ms = tl.load(p + g * W + BLOCK_D, mask=ok, other=0.0, cache_modifier=".cg")
                    ls = tl.load(p + g * W + BLOCK_D + 1, mask=ok, other=0.0, cache_modifier=".cg")
                    a = tl.load(
                        p + g[:, None] * W + d[None, :],
                        mask=ok[:, None],
                        other=0.0,
                        cache_modifier=".cg",
                    )
                    f = tl.where(ls > 0, tl.exp2(ms - mx), 0.0)  # empty slices: l = 0
                    tot += ls * f
                    out += a * f[:, None]
                tl.store(cnt_ptr + pair, 0)
                tl.store(optr, (out / tot[:, None]).to(o_ptr.dtype.element_ty), mask=omask)


@triton.jit
def prefill_attn_kernel(
    qkv_ptr,  # [T, (H + 2 KVH) D] roped q | k | v, row stride ldq
    tq_ptr,  # [tiles] int32 first packed row of the tile
    ts_ptr,  # [tiles] int32 first row of its prompt
    te_ptr,  # [tiles] int32 end row of its prompt
    o_ptr,  # [T, H D], row stride ldo
    ldq,
    ldo,
    H,
    KVH,
    G,
    qk_scale,
    D: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    IEEE: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_begin(PDL)
    tile = tl.program_id(0)
    h = tl.program_id(1)
    kvh = h // G
    q0 = tl.load(tq_ptr + tile)
    s0 = tl.load(ts_ptr + tile)
    s1 = tl.load(te_ptr + tile)
    rq = q0 + tl.arange(0, BLOCK_M)
    d = tl.arange(0, BLOCK_D)
    q_ok = rq < s1
    d_ok = d < D
    q = (
        tl.load(
            qkv_ptr + rq[:, None].to(tl.int64) * ldq + h * D + d[None, :],
            mask=q_ok[:, None] & d_ok[None, :],
            other=0.0,
        ).to(tl.float32)
        * qk_scale
    )
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    lsum = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    hi = tl.minimum(q0 + BLOCK_M, s1)
    kcol = H * D + kvh * D
    vcol = (H + KVH) * D + kvh * D
    for n0 in range(s0, hi, BLOCK_N):
        rn = n0 + tl.arange(0, BLOCK_N)
        n_ok = rn < hi
        kvm = n_ok[:, None] & d_ok[None, :]
        rows = rn[:, None].to(tl.int64) * ldq + d[None, :]
        k = tl.load(qkv_ptr + rows + kcol, mask=kvm, other=0.0).to(tl.float32)
        s = _dot(q, tl.trans(k), IEEE)
        s = tl.where(n_ok[None, :] & (rn[None, :] <= rq[:, None]), s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m - m_new)
        v = tl.load(qkv_ptr + rows + vcol, mask=kvm, other=0.0).to(tl.float32)
        lsum = lsum * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + _dot(p, v, IEEE)
        m = m_new
    tl.store(
        o_ptr + rq[:, None].to(tl.int64) * ldo + h * D + d[None, :],
        (acc / lsum[:, None]).to(o_ptr.dtype.element_ty),
        mask=q_ok[:, None] & d_ok[None, :],
    )


# ---------------------------------------------------------------------------- host wrappers
def _p2(n: int, lo: int = 1) -> int:
    return max(lo, triton.next_power_of_2(int(n)))


def rope_kv(
    qkv,
    pos,
    slots,
    cos,
    sin,
    kc,
    vc,
    T: int,
    H: int,
    KVH: int,
    D: int,
    BS: int,
    qn=None,
    kn=None,
    eps: float = 1e-6,
    pdl: bool = False,
):
    if D % 2:
        raise ValueError(f"head_dim {D}: RoPE needs an even head_dim")
    rope_kv_kernel[(T,)](
        qkv,
        pos,
        slots,
        cos,
        sin,
        qn if qn is not None else cos,
        kn if kn is not None else cos,
        kc,
        vc,
        qkv.stride(0),
        H,
        KVH,
        float(eps),
        D=D,
        BS=BS,
        BLOCK_HALF=_p2(D // 2),
        BLOCK_H=_p2(H),
        BLOCK_KV=_p2(KVH),
        NORM=qn is not None,
        PDL=pdl,
        num_warps=4,
        launch_pdl=pdl,
    )


def decode_splits(B: int, KVH: int, max_blocks: int, sms: int) -> int:
    """Slices of the sequence per (sequence, KV head): enough programs for ~2 per SM."""
    return int(max(1, min(max_blocks, triton.cdiv(2 * sms, B * KVH), 64)))


def decode_ws_floats(B: int, KVH: int, G: int, D: int, splits: int) -> int:
    return B * KVH * splits * _p2(G, 16) * (_p2(D, 16) + 2) if splits > 1 else 0


def decode_attention(
    q,
    kc,
    vc,
    tables,
    rix,
    ctx,
    out,
    B: int,
    H: int,
    KVH: int,
    D: int,
    BS: int,
    splits: int,
    ws=None,
    cnt=None,
    ieee: bool = False,
    pdl: bool = False,
    min_per: int = 1,
    rope=None,
):
    """Flash-decoding over the paged cache. ``rope``: None (q already roped, k / v already in the
    cache: rope_kv ran), or (pos, slots, cos, sin, qn, kn, eps) to rope q and the current k here
    and write its k / v into the cache (one launch less per layer). ``min_per``: the fewest
    blocks a slice takes (at short context fewer slices, a smaller merge)."""
    G = H // KVH
    if D % 2:
        raise ValueError(f"head_dim {D}: decode attention needs an even head_dim")
    if splits > 1 and (ws is None or cnt is None):
        raise ValueError("split decode attention needs a workspace and counters")
    pos, slots, cos, sin, qn, kn, eps = rope if rope is not None else (ctx,) * 6 + (0.0,)
    decode_attn_kernel[(B, KVH, splits)](
        q,
        kc,
        vc,
        tables,
        rix,
        ctx,
        out,
        ws if ws is not None else out,
        cnt if cnt is not None else ctx,
        pos,
        slots,
        cos,
        sin,
        qn if qn is not None else cos,
        kn if kn is not None else cos,
        float(eps),
        q.stride(0),
        out.stride(0),
        tables.stride(0),
        H,
        KVH,
        G,
        LOG2E / math.sqrt(D),
        D=D,
        BS=BS,
        BLOCK_G=_p2(G, 16),
        BLOCK_D=_p2(D, 16),
        BLOCK_HALF=_p2(D // 2, 16),
        SPLITS=splits,
        MIN_PER=max(1, int(min_per)),
        ROPE=rope is not None,
        NORM=rope is not None and qn is not None,
        IEEE=ieee,
        PDL=pdl,
        num_warps=4,
        launch_pdl=pdl,
    )


def prefill_tiles(cu_seqlens: np.ndarray, block_m: int) -> np.ndarray:
    """[3, tiles] int32: (first row, prompt start, prompt end) of every BLOCK_M tile."""
    out = []
    for a, b in zip(cu_seqlens[:-1], cu_seqlens[1:], strict=True):
        out += [(q0, a, b) for q0 in range(int(a), int(b), block_m)]
    return np.array(out, np.int32).T.reshape(3, -1)


def prefill_attention(
    qkv,
    tiles,
    n_tiles: int,
    out,
    H: int,
    KVH: int,
    D: int,
    block_m: int,
    block_n: int,
    ieee: bool = False,
    pdl: bool = False,
):
    """tiles: a device int32 [3, >= n_tiles] (prefill_tiles)."""
    prefill_attn_kernel[(n_tiles, H)](
        qkv,
        tiles[0],
        tiles[1],
        tiles[2],
        out,
        qkv.stride(0),
        out.stride(0),
        H,
        KVH,
        H // KVH,
        LOG2E / math.sqrt(D),
        D=D,
        BLOCK_D=_p2(D, 16),
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        IEEE=ieee,
        PDL=pdl,
        num_warps=4,
        num_stages=2,
        launch_pdl=pdl,
    )
