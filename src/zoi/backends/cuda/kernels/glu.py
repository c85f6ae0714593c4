"""glu: y = act(x[:, :n]) * x[:, n:] over rows of 2n (ModernBERT's GeGLU between its two FFN
linears), fp32 math, one program per BLOCK_R rows, columns in BLOCK_C chunks. With AMAX_OUT
the per-row max |y| goes (atomic max, into a row zeroed by the embed kernel) to the INT8
linear that quantises y while loading it (kernels/linear.py QUANT 1).
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from zoi.backends.cuda.kernels.common import ACTS, activation


@triton.jit
def glu_kernel(
    x_ptr,  # [T, 2n], row stride ldx
    y_ptr,  # [T, n], row stride ldy
    amax_ptr,  # [T] fp32 (AMAX_OUT)
    T,
    n,
    ldx,
    ldy,
    ACT: tl.constexpr,
    AMAX_OUT: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
    PDL: tl.constexpr,
):
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    r_ok = rows < T
    r64 = rows[:, None].to(tl.int64)
    am = tl.zeros((BLOCK_R,), tl.float32)
    for c0 in range(0, n, BLOCK_C):
        cols = c0 + tl.arange(0, BLOCK_C)
        m2 = r_ok[:, None] & (cols < n)[None, :]
        a = tl.load(x_ptr + r64 * ldx + cols[None, :], mask=m2, other=0).to(tl.float32)
        g = tl.load(x_ptr + r64 * ldx + n + cols[None, :], mask=m2, other=0).to(tl.float32)
        y = (activation(a, ACT) * g).to(y_ptr.dtype.element_ty)
        tl.store(y_ptr + r64 * ldy + cols[None, :], y, mask=m2)
        if AMAX_OUT:
            am = tl.maximum(am, tl.max(tl.where(m2, tl.abs(y.to(tl.float32)), 0.0), axis=1))
    if AMAX_OUT:
        tl.atomic_max(amax_ptr + rows, am, mask=r_ok)


def pick_config(n: int) -> dict:
    bc = min(1024, triton.next_power_of_2(max(n, 16)))
    return dict(BLOCK_R=max(1, min(16, 4096 // bc)), BLOCK_C=bc, num_warps=4)


def launch_glu(x, y, amax, T, n, act="gelu", cfg=None, pdl=False):
    if act not in ACTS:
        raise ValueError(f"glu: no kernel activation {act!r} (have {sorted(ACTS)})")
    cfg = cfg or pick_config(n)
    glu_kernel[(triton.cdiv(T, cfg["BLOCK_R"]),)](
        x,
        y,
        amax if amax is not None else y,
        T,
        n,
        x.stride(0),
        y.stride(0),
        ACT=ACTS[act],
        AMAX_OUT=amax is not None,
        PDL=pdl,
        launch_pdl=pdl,
        **cfg,
    )
