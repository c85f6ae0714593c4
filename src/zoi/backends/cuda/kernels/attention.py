"""attention: varlen softmax(q k^T * scale) v over packed sequences, one kernel.

Grid: (tiles, heads). A tile is BLOCK_M query rows of one sequence. The tile table is not
built on the host: each program loads ``cu_seqlens`` (padded to ``max_batch + 1`` with T,
i.e. empty sequences), counts tiles per sequence, takes an inclusive cumsum and finds its
own sequence, so one captured graph serves any split of T tokens into sequences. The grid
is sized for the worst case (ceil(T_bucket/BLOCK_M) + batch); spare programs do nothing.

Online softmax (flash attention) in fp32 with exp2; q/k/v and p enter ``tl.dot`` as fp16.
Rows of the output are written only for real tokens; with ``AMAX_OUT`` each program maxes
|ctx| of its head slice into ``amax_ptr`` (zeroed earlier in the same forward) for the
INT8 projection that follows.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def attention_kernel(
    qkv_ptr,  # [T, 3*H] fp16: q | k | v, head h at cols [h*D, (h+1)*D) of each third
    cu_ptr,  # [n_seq + 1] int32 cu_seqlens, padded with T
    o_ptr,  # [T, H] fp16 context, row stride ldo
    amax_ptr,  # [T] fp32 (AMAX_OUT)
    n_seq,  # number of sequence slots (max_batch)
    H,  # hidden = heads * D
    ldq,
    ldo,
    qk_scale,  # scale * log2(e)
    D: tl.constexpr,  # head dim
    BLOCK_D: tl.constexpr,
    BLOCK_B: tl.constexpr,  # next_pow2(n_seq)
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    AMAX_OUT: tl.constexpr,
):
    pid = tl.program_id(0)
    h = tl.program_id(1)
    sb = tl.arange(0, BLOCK_B)
    b_ok = sb < n_seq
    starts = tl.load(cu_ptr + sb, mask=b_ok, other=0)
    ends = tl.load(cu_ptr + sb + 1, mask=b_ok, other=0)
    ntile = tl.where(b_ok, (ends - starts + BLOCK_M - 1) // BLOCK_M, 0)
    cum = tl.cumsum(ntile, 0)  # inclusive
    b = tl.sum((cum <= pid).to(tl.int32), 0)  # my sequence (n_seq: none)
    sel = sb == b
    seq_start = tl.sum(tl.where(sel, starts, 0), 0)
    seq_end = tl.sum(tl.where(sel, ends, 0), 0)
    first_tile = tl.sum(tl.where(sel, cum - ntile, 0), 0)
    q0 = seq_start + (pid - first_tile) * BLOCK_M  # b == n_seq: seq_end = 0, nothing to do

    rm = q0 + tl.arange(0, BLOCK_M)
    rd = tl.arange(0, BLOCK_D)
    d_ok = rd < D
    m_ok = rm < seq_end
    rm_c = tl.where(m_ok, rm, 0)
    q = tl.load(qkv_ptr + rm_c[:, None].to(tl.int64) * ldq + h * D + rd[None, :],
                mask=m_ok[:, None] & d_ok[None, :], other=0.0)
    m_i = tl.zeros((BLOCK_M,), tl.float32) - float("inf")
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
    rn = tl.arange(0, BLOCK_N)
    for n0 in range(seq_start, seq_end, BLOCK_N):
        kn = n0 + rn
        n_ok = kn < seq_end
        kn_c = tl.where(n_ok, kn, 0)
        kv_off = kn_c[:, None].to(tl.int64) * ldq + h * D + rd[None, :]
        kv_m = n_ok[:, None] & d_ok[None, :]
        k = tl.load(qkv_ptr + kv_off + H, mask=kv_m, other=0.0)
        v = tl.load(qkv_ptr + kv_off + 2 * H, mask=kv_m, other=0.0)
        s = tl.dot(q, tl.trans(k)) * qk_scale
        s = tl.where(n_ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    l_safe = tl.where(l_i > 0.0, l_i, 1.0)
    out = (acc / l_safe[:, None]).to(o_ptr.dtype.element_ty)
    om = m_ok[:, None] & d_ok[None, :]
    tl.store(o_ptr + rm_c[:, None].to(tl.int64) * ldo + h * D + rd[None, :], out, mask=om)
    if AMAX_OUT:
        am = tl.max(tl.where(om, tl.abs(out.to(tl.float32)), 0.0), axis=1)
        tl.atomic_max(amax_ptr + rm_c, am, mask=m_ok)


def pick_config(T_bucket: int, head_dim: int) -> dict:
    bm = 16 if T_bucket <= 64 else (64 if T_bucket <= 8192 else 128)
    return dict(BLOCK_M=bm, BLOCK_N=64, BLOCK_D=max(16, triton.next_power_of_2(head_dim)),
                num_warps=4, num_stages=2)


def n_tiles(T_bucket: int, n_seq: int, cfg: dict) -> int:
    return triton.cdiv(T_bucket, cfg["BLOCK_M"]) + min(n_seq, T_bucket)


def launch_attention(qkv, cu, o, amax, T_bucket, n_seq, heads, head_dim, scale, cfg=None):
    cfg = cfg or pick_config(T_bucket, head_dim)
    H = heads * head_dim
    attention_kernel[(n_tiles(T_bucket, n_seq, cfg), heads)](
        qkv, cu, o, amax if amax is not None else o, n_seq, H, qkv.stride(0), o.stride(0),
        float(scale) * 1.4426950408889634, D=head_dim,
        BLOCK_B=max(16, triton.next_power_of_2(n_seq)), AMAX_OUT=amax is not None, **cfg,
    )
