"""add_layernorm: y = LayerNorm(x + r) * w + b over rows of H, fp32 statistics.

Used where the LN could not be fused into the preceding linear's epilogue (a linear whose N
is too wide for one program). Also writes the per-row amax of y for an INT8 consumer.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from zoi.backends.cuda.kernels.linear import quantize_rows


@triton.jit
def add_layernorm_kernel(
    x_ptr,  # [T, H], row stride ldx
    r_ptr,  # [T, H] residual, row stride ldr
    w_ptr,  # [H] fp32
    b_ptr,  # [H] fp32
    y_ptr,  # [T, H] output, row stride ldy
    amax_ptr,  # [T] fp32 (AMAX_OUT)
    yq_ptr,  # [T, H] int8 per-token quantised y, row stride ldyq (Q_OUT, with AMAX_OUT)
    T,
    H,
    ldx,
    ldr,
    ldy,
    ldyq,
    eps,
    AMAX_OUT: tl.constexpr,
    Q_OUT: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_H: tl.constexpr,
    PDL: tl.constexpr,
):
    if PDL:  # programmatic dependent launch: wait for the previous kernel's writes
        gdc_wait()
        gdc_launch_dependents()
    pid = tl.program_id(0)
    rows = pid * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.arange(0, BLOCK_H)
    r_ok = rows < T
    c_ok = cols < H
    m2 = r_ok[:, None] & c_ok[None, :]
    r64 = rows[:, None].to(tl.int64)
    x = tl.load(x_ptr + r64 * ldx + cols[None, :], mask=m2, other=0).to(tl.float32)
    x += tl.load(r_ptr + r64 * ldr + cols[None, :], mask=m2, other=0).to(tl.float32)
    mean = tl.sum(x, axis=1) / H
    d = tl.where(c_ok[None, :], x - mean[:, None], 0.0)
    var = tl.sum(d * d, axis=1) / H
    rstd = 1.0 / tl.sqrt(var + eps)
    lw = tl.load(w_ptr + cols, mask=c_ok, other=0.0)
    lb = tl.load(b_ptr + cols, mask=c_ok, other=0.0)
    y = (d * rstd[:, None] * lw[None, :] + lb[None, :]).to(y_ptr.dtype.element_ty)
    tl.store(y_ptr + r64 * ldy + cols[None, :], y, mask=m2)
    if AMAX_OUT:
        am = tl.max(tl.where(m2, tl.abs(y.to(tl.float32)), 0.0), axis=1)
        tl.store(amax_ptr + rows, am, mask=r_ok)
        if Q_OUT:
            tl.store(
                yq_ptr + r64 * ldyq + cols[None, :], quantize_rows(y.to(tl.float32), am), mask=m2
            )


def pick_config(H: int) -> dict:
    bh = triton.next_power_of_2(H)
    return dict(BLOCK_R=max(1, min(16, 4096 // bh)), BLOCK_H=bh, num_warps=4 if bh <= 1024 else 8)


def launch_add_layernorm(x, r, w, b, y, amax, T, H, eps, cfg=None, pdl=False, yq=None):
    cfg = cfg or pick_config(H)
    add_layernorm_kernel[(triton.cdiv(T, cfg["BLOCK_R"]),)](
        x,
        r,
        w,
        b,
        y,
        amax if amax is not None else w,
        yq if yq is not None else y,
        T,
        H,
        x.stride(0),
        r.stride(0),
        y.stride(0),
        yq.stride(0) if yq is not None else 0,
        float(eps),
        AMAX_OUT=amax is not None,
        Q_OUT=yq is not None,
        PDL=pdl,
        launch_pdl=pdl,
        **cfg,
    )
