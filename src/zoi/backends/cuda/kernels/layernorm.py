"""add_layernorm: y = LayerNorm(x + r) * w + b over rows of H, fp32 statistics (r None: LN(x)).

The decoder architectures' variants are constexpr switches of the same kernel: ``RMS``, the
RMSNorm x / sqrt(mean(x^2) + eps) * w + b (Llama, Qwen, Gemma3); ``POST``, the residual added
after the norm, y = norm(x) + r (Gemma3's sandwich norms after each branch). Reference:
zoi.numerics.reference.add_layernorm (rms, post).

Used where the LN could not be fused into the preceding linear's epilogue (a linear whose N
is too wide for one program). Also writes, for an INT8 consumer, the per-row amax of y or its
int8 copy (with a_scale / zero point, after the consumer's act_shift / act_mul:
``quantize.quant_rows``).
"""

from __future__ import annotations

import math

import triton
import triton.language as tl

from zoi.backends.cuda.kernels.common import amax_rows, norm_rows
from zoi.backends.cuda.kernels.pdl import pdl_begin
from zoi.backends.cuda.kernels.quantize import QMODES, quant_rows


@triton.jit
def add_layernorm_kernel(
    x_ptr,  # [T, H], row stride ldx
    r_ptr,  # [T, H] residual, row stride ldr
    w_ptr,  # [H] fp32
    b_ptr,  # [H] fp32
    y_ptr,  # [T, H] output, row stride ldy
    amax_ptr,  # [T] fp32 (AMAX_OUT)
    yq_ptr,  # [T, H] int8 per-token quantised y, row stride ldyq (Q_OUT)
    yqs_ptr,  # [T] fp32 a_scale of yq (Q_OUT)
    yqz_ptr,  # [T] int32 zero point of yq (Q_OUT 3)
    qshift_ptr,  # [H] fp32 act_shift of the consumer (Q_SHIFT)
    qmul_ptr,  # [H] fp32 act_mul of the consumer (Q_MUL)
    T,
    H,
    ldx,
    ldr,
    ldy,
    ldyq,
    eps,
    q_static_amax,
    AMAX_OUT: tl.constexpr,
    Q_OUT: tl.constexpr,  # 0, or the quantize.QMODES mode of the int8 copy
    Q_SHIFT: tl.constexpr,
    Q_MUL: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_H: tl.constexpr,
    PDL: tl.constexpr,
    HAS_RES: tl.constexpr = True,  # False: LN(x) alone (pre-norm layers, the MLM head)
    RMS: tl.constexpr = False,  # RMSNorm instead of LayerNorm
    POST: tl.constexpr = False,  # HAS_RES: y = norm(x) + r instead of norm(x + r)
):
    pdl_begin(PDL)  # programmatic dependent launch: wait for the previous kernel's writes
    pid = tl.program_id(0)
    rows = pid * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.arange(0, BLOCK_H)
    r_ok = rows < T
    c_ok = cols < H
    m2 = r_ok[:, None] & c_ok[None, :]
    r64 = rows[:, None].to(tl.int64)
    x = tl.load(x_ptr + r64 * ldx + cols[None, :], mask=m2, other=0).to(tl.float32)
    if HAS_RES:
        r = tl.load(r_ptr + r64 * ldr + cols[None, :], mask=m2, other=0).to(tl.float32)
        if not POST:
            x += r
    lw = tl.load(w_ptr + cols, mask=c_ok, other=0.0)
    lb = tl.load(b_ptr + cols, mask=c_ok, other=0.0)
    y = norm_rows(x, c_ok, lw, lb, H, eps, RMS)
    if HAS_RES and POST:  # fp32 sum, one rounding into y's dtype
        y += r
    y = y.to(y_ptr.dtype.element_ty)
    tl.store(y_ptr + r64 * ldy + cols[None, :], y, mask=m2)
    if AMAX_OUT:
        am = amax_rows(tl.where(m2, y.to(tl.float32), 0.0))  # NaN-keeping
        tl.store(amax_ptr + rows, am, mask=r_ok)
    if Q_OUT != 0:
        q, qs, qz = quant_rows(
            y.to(tl.float32), cols, c_ok, qshift_ptr, qmul_ptr, q_static_amax, Q_OUT, Q_SHIFT, Q_MUL
        )
        tl.store(yq_ptr + r64 * ldyq + cols[None, :], q, mask=m2)
        tl.store(yqs_ptr + rows, qs, mask=r_ok)
        if Q_OUT == 3:
            tl.store(yqz_ptr + rows, qz, mask=r_ok)


# lab/gpu/sweep_linear.py on the H200 (gpu_sweep_20261201T0959Z.json): (BLOCK_R, num_warps) per
# (BLOCK_H, rows, int8 copy written); the pick before the sweep was within 3% from 4096 rows on
# (H 384 at 32768 rows: 30.6 us with the int8 copy, 20.5 without; near the bytes floor), and
# 10-25% slower at 128 rows (3.3 -> 2.7 us).
_TUNED = {
    (512, True): {128: (1, 4), 1024: (4, 4), 4096: (8, 8), 32768: (8, 4)},
    (512, False): {128: (2, 4), 1024: (1, 4), 4096: (8, 4), 32768: (8, 4)},
    (1024, True): {128: (1, 8), 1024: (2, 8), 4096: (4, 4), 32768: (4, 4)},
    (1024, False): {128: (1, 8), 1024: (4, 8), 4096: (4, 2), 32768: (4, 4)},
}


def pick_config(H: int, T: int | None = None, q_out: bool = False) -> dict:
    bh = triton.next_power_of_2(H)
    hit = _TUNED.get((bh, bool(q_out))) if T is not None else None
    if hit is not None:
        t = min(hit, key=lambda m: abs(math.log2(max(T, 1)) - math.log2(m)))
        br, w = hit[t]
        return dict(BLOCK_R=br, BLOCK_H=bh, num_warps=w)
    return dict(BLOCK_R=max(1, min(16, 4096 // bh)), BLOCK_H=bh, num_warps=4 if bh <= 1024 else 8)


def launch_add_layernorm(
    x,
    r,
    w,
    b,
    y,
    amax,
    T,
    H,
    eps,
    cfg=None,
    pdl=False,
    yq=None,
    yq_scale=None,
    yq_zp=None,
    q_mode="dynamic",
    q_shift=None,
    q_mul=None,
    q_static_amax=0.0,
    rms=False,
    post=False,
):
    """yq: also write the int8 copy of y for the next linear (quantize.quant_rows, q_mode).
    rms: RMSNorm; post (with r): y = norm(x) + r."""
    if post and r is None:
        raise ValueError("add_layernorm: a post-norm residual needs r")
    qmode = (QMODES[q_mode] if isinstance(q_mode, str) else int(q_mode)) if yq is not None else 0
    cfg = cfg or pick_config(H, T, qmode != 0)
    assert qmode == 0 or yq_scale is not None
    assert qmode != 3 or yq_zp is not None
    add_layernorm_kernel[(triton.cdiv(T, cfg["BLOCK_R"]),)](
        x,
        r if r is not None else x,
        w,
        b,
        y,
        amax if amax is not None else w,
        yq if yq is not None else y,
        yq_scale if yq_scale is not None else w,
        yq_zp if yq_zp is not None else w,
        q_shift if q_shift is not None else w,
        q_mul if q_mul is not None else w,
        T,
        H,
        x.stride(0),
        r.stride(0) if r is not None else 0,
        y.stride(0),
        yq.stride(0) if yq is not None else 0,
        float(eps),
        float(q_static_amax),
        AMAX_OUT=amax is not None,
        Q_OUT=qmode,
        Q_SHIFT=q_shift is not None,
        Q_MUL=q_mul is not None,
        HAS_RES=r is not None,
        RMS=bool(rms),
        POST=bool(post),
        PDL=pdl,
        launch_pdl=pdl,
        **cfg,
    )
