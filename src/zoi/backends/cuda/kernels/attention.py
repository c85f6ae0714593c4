"""attention: varlen softmax(q k^T * scale [+ bias]) v over packed sequences, one kernel, with
the extras of MPNet, ModernBERT and the decoder architectures run as encoders (Qwen3, Gemma3,
Llama, Qwen2, Mistral) as constexpr switches of the same kernel (off: the plain BERT attention,
unchanged):

* ``REL_BIAS``: an additive relative-position bias gathered per head from the model's table
  ``bias[h, j - i + P - 1]`` (fp32 [heads, 2P-1], MPNet's bucketed bias computed once at load
  time by zoi.frontend.archs), added to the scores before the softmax;
* ``ROPE``: q and k rotated in the prologue (transformers' rotate_half form, at the position
  of the token in its sequence), from fp32 cos / sin tables [P, d/2]: each head is loaded as
  its two halves, rotated in fp32, and the scores are the sum of the two half dots;
* ``WINDOW`` > 0: key j is seen by query i only when |i - j| <= WINDOW (ModernBERT's local
  layers, Gemma3's sliding layers); the key loop runs over the window's blocks only;
* ``CAUSAL``: key j is seen by query i only when j <= i (with WINDOW: 0 <= i - j <= WINDOW,
  Mistral's sliding window); the key loop stops at the tile's last query;
* ``QK_NORM``: each q / k head RMS-normalised (fp32 [D] weights, eps ``qk_eps``) before RoPE
  (Qwen3, Gemma3).

Grouped KV heads (not a switch: runtime sizes, GROUP 1 is the plain layout): a qkv row is
q [H = heads D] | k [KVW = kv_heads D] | v [KVW], and query head h reads KV head h // GROUP.

A tile is BLOCK_M query rows of one sequence. The tile table (inclusive cumsum of tiles
per sequence, ``tcum``) is built on the device once per forward, by ``tile_table`` (run by
the embed kernel's first program), from ``cu_seqlens`` and the batch size B in the call
header, so one captured graph serves any split of T tokens into sequences. Grid:
(programs, heads); programs stride over the tiles (a grid-stride loop bounded by the real
tile count, read from device memory), and each finds its sequence by counting tcum <= j.

Online softmax (flash attention) in fp32 with exp2; q/k/v and p enter ``tl.dot`` as fp16.
Rows of the output are written only for real tokens; with ``AMAX_OUT`` each program maxes
|ctx| of its head slice into ``amax_ptr`` (zeroed earlier in the same forward; NaN-keeping:
``common.amax_rows``) for the INT8 projection that follows. The numpy reference is
zoi.numerics.reference.attention. The extras (relative-position bias, RoPE, local window,
causal mask, grouped KV heads, q/k RMSNorm) are arguments of ``launch_attention``.
"""

from __future__ import annotations

import math

import triton
import triton.language as tl

from zoi.backends.cuda.kernels.common import amax_rows, softmax_step, softmax_step2
from zoi.backends.cuda.kernels.pdl import pdl_begin


@triton.jit
def tile_table(
    hdr_ptr,  # [>=3] int32 call header: [normalize flag, B, T]
    cu_ptr,  # [B + 1] int32 cu_seqlens
    tcum_ptr,  # [>= B] int32 out: inclusive cumsum of ceil(len_b / BLOCK_M)
    BLOCK_M: tl.constexpr,
    BLOCK_B: tl.constexpr,
):
    """One program's work (called by the embed kernel's program 0): the attention tile table."""
    B = tl.load(hdr_ptr + 1)
    sb = tl.arange(0, BLOCK_B)
    carry = 0
    for c0 in range(0, B, BLOCK_B):
        ok = (c0 + sb) < B
        s = tl.load(cu_ptr + c0 + sb, mask=ok, other=0)
        e = tl.load(cu_ptr + c0 + sb + 1, mask=ok, other=0)
        nt = tl.where(ok, (e - s + BLOCK_M - 1) // BLOCK_M, 0)
        tl.store(tcum_ptr + c0 + sb, tl.cumsum(nt, 0) + carry, mask=ok)
        carry += tl.sum(nt, 0)


@triton.jit
def attention_tiles_kernel(hdr_ptr, cu_ptr, tcum_ptr, BLOCK_M: tl.constexpr, BLOCK_B: tl.constexpr):
    tile_table(hdr_ptr, cu_ptr, tcum_ptr, BLOCK_M, BLOCK_B)


@triton.jit
def _rot(x1, x2, c, s):
    """rotate_half RoPE of the two halves: (x1 c - x2 s, x2 c + x1 s), fp32 in, fp16 out."""
    return (x1 * c - x2 * s).to(tl.float16), (x2 * c + x1 * s).to(tl.float16)


@triton.jit
def _rms_head(x, w, D: tl.constexpr, eps):
    """RMSNorm of each row of one head, x [R, BLOCK_D] fp32 (columns >= D zero), w [BLOCK_D]."""
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, 1) / D + eps)
    return x * rstd[:, None] * w[None, :]


@triton.jit
def _rms_halves(x1, x2, w1, w2, D: tl.constexpr, eps):
    """_rms_head of a head loaded as its two halves (RoPE): one statistic over both."""
    rstd = 1.0 / tl.sqrt((tl.sum(x1 * x1, 1) + tl.sum(x2 * x2, 1)) / D + eps)
    return x1 * rstd[:, None] * w1[None, :], x2 * rstd[:, None] * w2[None, :]


@triton.jit
def attention_kernel(
    qkv_ptr,  # [T, (heads + 2 kv_heads) D] fp16: q | k | v, head h at cols [h*D, (h+1)*D) of q
    hdr_ptr,  # [>=3] int32 call header: [normalize flag, B, T]
    cu_ptr,  # [B + 1] int32 cu_seqlens
    tcum_ptr,  # [B] int32 tile table (tile_table)
    o_ptr,  # [T, H] fp16 context, row stride ldo
    amax_ptr,  # [T] fp32 (AMAX_OUT)
    bias_ptr,  # [heads, 2P-1] fp32 relative bias (REL_BIAS)
    cos_ptr,  # [P, D/2] fp32 (ROPE)
    sin_ptr,  # [P, D/2] fp32 (ROPE)
    qn_ptr,  # [D] fp32 RMSNorm weight of each q head (QK_NORM)
    kn_ptr,  # [D] fp32 RMSNorm weight of each k head (QK_NORM)
    H,  # heads * D: the width of q (and of the context), where k starts
    KVW,  # kv_heads * D: the width of k and of v
    GROUP,  # heads // kv_heads: query head h reads KV head h // GROUP
    ldq,
    ldo,
    qk_scale,  # scale * log2(e)
    qk_eps,  # QK_NORM
    P,  # rows of the bias / RoPE tables (max positions; REL_BIAS, ROPE)
    D: tl.constexpr,  # head dim
    BLOCK_D: tl.constexpr,  # >= D (no RoPE) / >= D/2 (RoPE: the halves)
    BLOCK_B: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    AMAX_OUT: tl.constexpr,
    PDL: tl.constexpr,
    REL_BIAS: tl.constexpr = False,
    ROPE: tl.constexpr = False,
    WINDOW: tl.constexpr = 0,  # 0: global
    CAUSAL: tl.constexpr = False,
    QK_NORM: tl.constexpr = False,
):
    pdl_begin(PDL)  # programmatic dependent launch: wait for the previous kernel's writes
    pid = tl.program_id(0)
    h = tl.program_id(1)
    G = tl.num_programs(0)
    B = tl.load(hdr_ptr + 1)
    n_tiles = tl.load(tcum_ptr + B - 1)
    sb = tl.arange(0, BLOCK_B)
    rd = tl.arange(0, BLOCK_D)
    HALF: tl.constexpr = D // 2
    if ROPE:
        d_ok = rd < HALF
    else:
        d_ok = rd < D
    k_col = H + (h // GROUP) * D  # this head's K (and V, KVW further) in a qkv row
    v_col = k_col + KVW
    if QK_NORM:  # the norm weights, per column (RoPE: per half)
        if ROPE:
            wq1 = tl.load(qn_ptr + rd, mask=d_ok, other=0.0)
            wq2 = tl.load(qn_ptr + HALF + rd, mask=d_ok, other=0.0)
            wk1 = tl.load(kn_ptr + rd, mask=d_ok, other=0.0)
            wk2 = tl.load(kn_ptr + HALF + rd, mask=d_ok, other=0.0)
        else:
            wq = tl.load(qn_ptr + rd, mask=d_ok, other=0.0)
            wk = tl.load(kn_ptr + rd, mask=d_ok, other=0.0)
    rn = tl.arange(0, BLOCK_N)
    for j in range(pid, n_tiles, G):
        # my sequence: b = #{c : tcum[c] <= j}
        b = 0
        for c0 in range(0, B, BLOCK_B):
            cum = tl.load(tcum_ptr + c0 + sb, mask=(c0 + sb) < B, other=2147483647)
            b += tl.sum((cum <= j).to(tl.int32), 0)
        prev = tl.load(tcum_ptr + tl.maximum(b - 1, 0))
        prev = tl.where(b > 0, prev, 0)
        seq_start = tl.load(cu_ptr + b)
        seq_end = tl.load(cu_ptr + b + 1)
        q0 = seq_start + (j - prev) * BLOCK_M

        rm = q0 + tl.arange(0, BLOCK_M)
        m_ok = rm < seq_end
        rm_c = tl.where(m_ok, rm, 0)
        qm = m_ok[:, None] & d_ok[None, :]
        q_off = rm_c[:, None].to(tl.int64) * ldq + h * D + rd[None, :]
        if ROPE:  # the two halves, rotated at the query's position in its sequence
            ipos = tl.minimum(rm_c - seq_start, P - 1)
            q1 = tl.load(qkv_ptr + q_off, mask=qm, other=0.0).to(tl.float32)
            q2 = tl.load(qkv_ptr + q_off + HALF, mask=qm, other=0.0).to(tl.float32)
            if QK_NORM:  # before the rotation, as transformers' Qwen3 / Gemma3
                q1, q2 = _rms_halves(q1, q2, wq1, wq2, D, qk_eps)
            cs_off = ipos[:, None] * HALF + rd[None, :]
            cq = tl.load(cos_ptr + cs_off, mask=qm, other=0.0)
            sq = tl.load(sin_ptr + cs_off, mask=qm, other=0.0)
            q1, q2 = _rot(q1, q2, cq, sq)
            acc1 = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
            acc2 = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
        else:
            q = tl.load(qkv_ptr + q_off, mask=qm, other=0.0)
            if QK_NORM:
                q = _rms_head(q.to(tl.float32), wq, D, qk_eps).to(tl.float16)
            acc = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
        m_i = tl.zeros((BLOCK_M,), tl.float32) - float("inf")
        l_i = tl.zeros((BLOCK_M,), tl.float32)
        lo = seq_start
        hi = seq_end
        if CAUSAL:  # keys up to the tile's last query
            hi = tl.minimum(seq_end, q0 + BLOCK_M)
        if WINDOW > 0:  # only the key blocks that meet the window of some query of the tile
            lo = tl.maximum(seq_start, q0 - WINDOW)
            hi = tl.minimum(hi, q0 + BLOCK_M + WINDOW)
        for n0 in range(lo, hi, BLOCK_N):
            kn = n0 + rn
            if WINDOW > 0 or CAUSAL:
                n_ok = (kn < hi) & (kn >= lo)
            else:
                n_ok = kn < seq_end
            kn_c = tl.where(n_ok, kn, 0)
            kv_off = kn_c[:, None].to(tl.int64) * ldq + rd[None, :]
            kv_m = n_ok[:, None] & d_ok[None, :]
            if ROPE:
                k1 = tl.load(qkv_ptr + kv_off + k_col, mask=kv_m, other=0.0).to(tl.float32)
                k2 = tl.load(qkv_ptr + kv_off + k_col + HALF, mask=kv_m, other=0.0).to(tl.float32)
                if QK_NORM:
                    k1, k2 = _rms_halves(k1, k2, wk1, wk2, D, qk_eps)
                ck_off = tl.minimum(kn_c - seq_start, P - 1)[:, None] * HALF + rd[None, :]
                ck = tl.load(cos_ptr + ck_off, mask=kv_m, other=0.0)
                sk = tl.load(sin_ptr + ck_off, mask=kv_m, other=0.0)
                k1, k2 = _rot(k1, k2, ck, sk)
                s = (tl.dot(q1, tl.trans(k1)) + tl.dot(q2, tl.trans(k2))) * qk_scale
            else:
                k = tl.load(qkv_ptr + kv_off + k_col, mask=kv_m, other=0.0)
                if QK_NORM:
                    k = _rms_head(k.to(tl.float32), wk, D, qk_eps).to(tl.float16)
                s = tl.dot(q, tl.trans(k)) * qk_scale
            if REL_BIAS or WINDOW > 0 or CAUSAL:
                rel = kn_c[None, :] - rm_c[:, None]  # j - i
                ok2 = m_ok[:, None] & n_ok[None, :]
                if REL_BIAS:
                    bm = ok2 & (rel > -P) & (rel < P)
                    bv = tl.load(bias_ptr + h * (2 * P - 1) + rel + P - 1, mask=bm, other=0.0)
                    s = s + bv * 1.4426950408889634
                if WINDOW > 0:
                    ok2 = ok2 & (rel <= WINDOW) & (rel >= -WINDOW)
                if CAUSAL:
                    ok2 = ok2 & (rel <= 0)
                s = tl.where(ok2, s, float("-inf"))
            else:
                s = tl.where(n_ok[None, :], s, float("-inf"))
            if ROPE:
                v1 = tl.load(qkv_ptr + kv_off + v_col, mask=kv_m, other=0.0)
                v2 = tl.load(qkv_ptr + kv_off + v_col + HALF, mask=kv_m, other=0.0)
                m_i, l_i, acc1, acc2 = softmax_step2(m_i, l_i, acc1, acc2, s, v1, v2)
            else:
                v = tl.load(qkv_ptr + kv_off + v_col, mask=kv_m, other=0.0)
                m_i, l_i, acc = softmax_step(m_i, l_i, acc, s, v)
        l_safe = tl.where(l_i > 0.0, l_i, 1.0)
        om = m_ok[:, None] & d_ok[None, :]
        o_off = rm_c[:, None].to(tl.int64) * ldo + h * D + rd[None, :]
        if ROPE:
            out1 = (acc1 / l_safe[:, None]).to(o_ptr.dtype.element_ty)
            out2 = (acc2 / l_safe[:, None]).to(o_ptr.dtype.element_ty)
            tl.store(o_ptr + o_off, out1, mask=om)
            tl.store(o_ptr + o_off + HALF, out2, mask=om)
            if AMAX_OUT:
                a1 = amax_rows(tl.where(om, out1.to(tl.float32), 0.0))
                a2 = amax_rows(tl.where(om, out2.to(tl.float32), 0.0))
                am = tl.maximum(a1, a2, propagate_nan=tl.PropagateNan.ALL)
                tl.atomic_max(amax_ptr + rm_c, am, mask=m_ok)
        else:
            out = (acc / l_safe[:, None]).to(o_ptr.dtype.element_ty)
            tl.store(o_ptr + o_off, out, mask=om)
            if AMAX_OUT:  # NaN-keeping: a positive NaN wins the float atomic max
                am = amax_rows(tl.where(om, out.to(tl.float32), 0.0))
                tl.atomic_max(amax_ptr + rm_c, am, mask=m_ok)


# lab/gpu/sweep_linear.py on the H200 (bench/results/gpu_sweep_20261201T0959Z.json), 128-token
# sequences, 12 heads: (BLOCK_M, BLOCK_N, num_warps, num_stages) per (head_dim, bucket); us per
# launch, the pick before the sweep -> the winner. head_dim 32 at 32768 tokens: 74.1 -> 58.3;
# 4096: 9.4 -> 8.9; 1024: 5.8 -> 5.5; 128: 4.7 -> 4.6. head_dim 64: the old pick won (within 1%).
_TUNED = {
    32: {128: (64, 128, 4, 2), 1024: (64, 128, 4, 1), 4096: (32, 32, 1, 2), 32768: (64, 32, 4, 1)},
    64: {128: (32, 128, 4, 2), 1024: (64, 64, 4, 2), 4096: (64, 64, 4, 2), 32768: (128, 64, 4, 2)},
}


def pick_config(T_bucket: int, head_dim: int) -> dict:
    bd = max(16, triton.next_power_of_2(head_dim))
    hit = _TUNED.get(int(head_dim))
    if hit is not None and T_bucket > 64:
        t = min(hit, key=lambda m: abs(math.log2(T_bucket) - math.log2(m)))
        bm, bn, w, st = hit[t]
        return dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=bd, num_warps=w, num_stages=st)
    bm = 16 if T_bucket <= 64 else (64 if T_bucket <= 8192 else 128)
    return dict(BLOCK_M=bm, BLOCK_N=64, BLOCK_D=bd, num_warps=4, num_stages=2)


def block_b(n_seq: int) -> int:
    """Chunk of cu_seqlens / tile table one program scans at a time."""
    return max(16, min(1024, triton.next_power_of_2(max(n_seq, 1))))


def grid_tiles(T_bucket: int, n_seq: int, heads: int, cfg: dict, n_sm: int = 132) -> int:
    """Programs along the tile axis: enough for the worst split, capped (grid-stride loop)."""
    worst = triton.cdiv(T_bucket, cfg["BLOCK_M"]) + min(n_seq, T_bucket)
    return max(
        1, min(worst, max(triton.cdiv(8 * n_sm, heads), triton.cdiv(T_bucket, cfg["BLOCK_M"])))
    )


def launch_tiles(hdr, cu, tcum, n_seq, cfg):
    attention_tiles_kernel[(1,)](hdr, cu, tcum, BLOCK_M=cfg["BLOCK_M"], BLOCK_B=block_b(n_seq))


LOG2E = 1.4426950408889634


def launch_attention(
    qkv,
    hdr,
    cu,
    tcum,
    o,
    amax,
    T_bucket,
    n_seq,
    heads,
    head_dim,
    scale,
    cfg=None,
    pdl=False,
    bias=None,
    cos=None,
    sin=None,
    window=0,
    kv_heads=0,
    causal=False,
    q_norm=None,
    k_norm=None,
    qk_eps=1e-6,
):
    """cfg: pick_config's dict for the bucket (its BLOCK_M built the tile table). The extras:
    bias fp32 [heads, 2P-1] (REL_BIAS), cos / sin fp32 [P, head_dim/2] (ROPE), window
    (WINDOW), kv_heads (grouped KV heads: qkv is q [heads d] | k [kv_heads d] | v [kv_heads d];
    0: heads), causal (CAUSAL), q_norm / k_norm fp32 [head_dim] with qk_eps (QK_NORM); none of
    them: the plain kernel."""
    rope = cos is not None
    if rope and head_dim % 2:
        raise ValueError(f"RoPE needs an even head_dim, got {head_dim}")
    if rope != (sin is not None):
        raise ValueError("RoPE needs both the cos and the sin table")
    if (q_norm is None) != (k_norm is None):
        raise ValueError("q/k norm needs both the q and the k weight")
    kvh = int(kv_heads) or int(heads)
    if kvh < 1 or heads % kvh:
        raise ValueError(f"{heads} heads do not share {kvh} KV heads evenly")
    if int(qkv.shape[1]) < (heads + 2 * kvh) * head_dim:
        raise ValueError(
            f"qkv has {qkv.shape[1]} columns, {heads} + 2 x {kvh} heads of {head_dim} need "
            f"{(heads + 2 * kvh) * head_dim}"
        )
    cfg = dict(cfg or pick_config(T_bucket, head_dim))
    if rope:
        cfg["BLOCK_D"] = max(16, triton.next_power_of_2(head_dim // 2))
    P = int(bias.shape[1] + 1) // 2 if bias is not None else (int(cos.shape[0]) if rope else 1)
    if bias is not None and rope and int(cos.shape[0]) != P:
        raise ValueError("the bias and RoPE tables disagree on the positions")
    dummy = bias if bias is not None else (cos if rope else o)
    qk = q_norm is not None
    attention_kernel[(grid_tiles(T_bucket, n_seq, heads, cfg), heads)](
        qkv,
        hdr,
        cu,
        tcum,
        o,
        amax if amax is not None else o,
        dummy,
        cos if rope else dummy,
        sin if rope else dummy,
        q_norm if qk else dummy,
        k_norm if qk else dummy,
        heads * head_dim,
        kvh * head_dim,
        heads // kvh,
        qkv.stride(0),
        o.stride(0),
        float(scale) * LOG2E,
        float(qk_eps),
        P,
        D=head_dim,
        BLOCK_B=block_b(n_seq),
        AMAX_OUT=amax is not None,
        PDL=pdl,
        REL_BIAS=bias is not None,
        ROPE=rope,
        WINDOW=int(window),
        CAUSAL=bool(causal),
        QK_NORM=qk,
        launch_pdl=pdl,
        **cfg,
    )
