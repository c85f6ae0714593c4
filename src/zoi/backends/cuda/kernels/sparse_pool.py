"""sparse_pool: SPLADE's pooling of the MLM logits, a segmented max-reduction on the GPU so the
[T, vocab] matrix never goes to the host: p[b, v] = log1p(relu(max over the tokens t of
sequence b of x[t, v])) (max and log1p(relu) commute: both monotone), fp32 [B, V].

Grid (programs over sequences, vocab blocks of BLOCK_V); programs stride over the B of the
call header (one captured graph serves every batch size). NaN in a sequence's logits comes
out NaN (the engine refuses non-finite outputs), an empty sequence gives zeros.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait


@triton.jit
def sparse_pool_kernel(
    x_ptr,  # [T, V] fp16 MLM logits, row stride ldx
    cu_ptr,  # [B + 1] int32
    hdr_ptr,  # [>=3] int32 call header: [normalize flag, B, T]
    p_ptr,  # [B, V] fp32 out, row stride ldp
    V,
    ldx,
    ldp,
    BLOCK_R: tl.constexpr,
    BLOCK_V: tl.constexpr,
    PDL: tl.constexpr,
):
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    cols = tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V)
    c_ok = cols < V
    rr = tl.arange(0, BLOCK_R)
    B = tl.load(hdr_ptr + 1)
    for b in range(tl.program_id(0), B, tl.num_programs(0)):
        s = tl.load(cu_ptr + b)
        e = tl.load(cu_ptr + b + 1)
        acc = tl.zeros((BLOCK_R, BLOCK_V), tl.float32) - float("inf")
        for r0 in range(s, e, BLOCK_R):
            rows = r0 + rr
            m2 = (rows < e)[:, None] & c_ok[None, :]
            x = tl.load(x_ptr + rows[:, None].to(tl.int64) * ldx + cols[None, :], mask=m2, other=0)
            x = tl.where(m2, x.to(tl.float32), float("-inf"))
            acc = tl.maximum(acc, x, propagate_nan=tl.PropagateNan.ALL)
        m = tl.maximum(_nanmax(acc), 0.0, propagate_nan=tl.PropagateNan.ALL)
        u = 1.0 + m  # log1p(m) = log(u) * m / (u - 1), accurate for small m (Goldberg)
        v = tl.where(u == 1.0, m, tl.log(u) * (m / tl.where(u == 1.0, 1.0, u - 1.0)))
        v = tl.where(e > s, v, 0.0)
        tl.store(p_ptr + b * ldp + cols, v, mask=c_ok)


@triton.jit
def _nanmax(acc):
    """Column max of acc [R, C] that keeps a NaN (tl.max may drop it)."""
    bad = tl.max((acc != acc).to(tl.int32), 0)
    m = tl.max(tl.where(acc != acc, float("-inf"), acc), 0)
    return tl.where(bad > 0, float("nan"), m)


def pick_config(V: int) -> dict:
    bv = min(1024, triton.next_power_of_2(max(V, 16)))
    return dict(BLOCK_R=max(1, min(16, 4096 // bv)), BLOCK_V=bv, num_warps=4)


def launch_sparse_pool(x, cu, hdr, p, n_seq, V, cfg=None, pdl=False):
    cfg = cfg or pick_config(V)
    grid = (max(1, min(n_seq, 256)), triton.cdiv(V, cfg["BLOCK_V"]))
    sparse_pool_kernel[grid](
        x, cu, hdr, p, V, x.stride(0), p.stride(0), PDL=pdl, launch_pdl=pdl, **cfg
    )
