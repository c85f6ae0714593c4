"""glu: y = act(x[:, :n]) * x[:, n:] over rows of 2n (ModernBERT's GeGLU between its two FFN
linears), fp32 math, one program per BLOCK_R whole rows, columns in BLOCK_C chunks.

For the INT8 linear that reads y (ffn2), as the plan says (zoi.graph.fusion: glu sees whole
rows, so it writes the copy, ``quant_out``):

* ``Q_OUT``: y's int8 copy (``quantize`` numerics, the consumer's act_shift / act_mul first)
  with its a_scale (and zero point) per row, so that ffn2 runs as a pure int8 GEMM (QUANT 4).
  The row statistics are folded over the chunks while y is stored (``quantize.q_stats``),
  then the program reads its stored rows back (after a CTA barrier; L2 loads) and quantises
  them: the copy is that of the stored fp16 y, exactly what a quantize launch would make;
* ``AMAX_OUT``: the per-row max |y| (NaN-keeping) for a linear that quantises y while loading
  it (kernels/linear.py QUANT 1); stored (the program owns its rows: no atomics).
"""

from __future__ import annotations

import triton
import triton.language as tl

from zoi.backends.cuda.kernels.common import ACTS, activation, amax_rows
from zoi.backends.cuda.kernels.pdl import pdl_begin
from zoi.backends.cuda.kernels.quantize import QMODES, act_tf, q_apply, q_params, q_stats


@triton.jit
def glu_kernel(
    x_ptr,  # [T, 2n], row stride ldx
    y_ptr,  # [T, n], row stride ldy
    amax_ptr,  # [T] fp32 (AMAX_OUT)
    yq_ptr,  # [T, n] int8 (fp8: QMODE 5) copy of y, row stride ldyq (Q_OUT)
    yqs_ptr,  # [T] fp32 a_scale of yq (Q_OUT)
    yqz_ptr,  # [T] int32 zero point of yq (Q_OUT 3)
    qshift_ptr,  # [n] fp32 act_shift of the consumer (Q_SHIFT)
    qmul_ptr,  # [n] fp32 act_mul of the consumer (Q_MUL)
    T,
    n,
    ldx,
    ldy,
    ldyq,
    q_static_amax,  # float, Q_OUT 2
    ACT: tl.constexpr,
    AMAX_OUT: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
    PDL: tl.constexpr,
    Q_OUT: tl.constexpr = 0,  # 0, or the quantize.QMODES mode of the copy
    Q_SHIFT: tl.constexpr = False,
    Q_MUL: tl.constexpr = False,
):
    pdl_begin(PDL)  # programmatic dependent launch: wait for the previous kernel's writes
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    r_ok = rows < T
    r64 = rows[:, None].to(tl.int64)
    am = tl.zeros((BLOCK_R,), tl.float32)
    lo = tl.zeros((BLOCK_R,), tl.float32)
    hi = tl.zeros((BLOCK_R,), tl.float32)
    for c0 in range(0, n, BLOCK_C):
        cols = c0 + tl.arange(0, BLOCK_C)
        c_ok = cols < n
        m2 = r_ok[:, None] & c_ok[None, :]
        a = tl.load(x_ptr + r64 * ldx + cols[None, :], mask=m2, other=0).to(tl.float32)
        g = tl.load(x_ptr + r64 * ldx + n + cols[None, :], mask=m2, other=0).to(tl.float32)
        y = (activation(a, ACT) * g).to(y_ptr.dtype.element_ty)
        tl.store(y_ptr + r64 * ldy + cols[None, :], y, mask=m2)
        if AMAX_OUT:
            ay = amax_rows(tl.where(m2, y.to(tl.float32), 0.0))
            am = tl.maximum(am, ay, propagate_nan=tl.PropagateNan.ALL)
        if Q_OUT != 0:
            xq = act_tf(y.to(tl.float32), cols, c_ok, qshift_ptr, qmul_ptr, Q_SHIFT, Q_MUL)
            lo, hi = q_stats(xq, lo, hi, Q_OUT)
    if AMAX_OUT:
        tl.store(amax_ptr + rows, am, mask=r_ok)
    if Q_OUT != 0:
        inv, z, qs, qz = q_params(lo, hi, q_static_amax, Q_OUT)
        tl.debug_barrier()  # the stored chunks are read back by other threads of this program
        for c0 in range(0, n, BLOCK_C):
            cols = c0 + tl.arange(0, BLOCK_C)
            c_ok = cols < n
            m2 = r_ok[:, None] & c_ok[None, :]
            y = tl.load(y_ptr + r64 * ldy + cols[None, :], mask=m2, other=0.0, cache_modifier=".cg")
            xq = act_tf(y.to(tl.float32), cols, c_ok, qshift_ptr, qmul_ptr, Q_SHIFT, Q_MUL)
            tl.store(yq_ptr + r64 * ldyq + cols[None, :], q_apply(xq, inv, z, Q_OUT), mask=m2)
        tl.store(yqs_ptr + rows, qs, mask=r_ok)
        if Q_OUT == 3:
            tl.store(yqz_ptr + rows, qz, mask=r_ok)


def pick_config(n: int) -> dict:
    bc = min(1024, triton.next_power_of_2(max(n, 16)))
    return dict(BLOCK_R=max(1, min(16, 4096 // bc)), BLOCK_C=bc, num_warps=4)


def launch_glu(
    x,
    y,
    amax,
    T,
    n,
    act="gelu",
    cfg=None,
    pdl=False,
    yq=None,
    yq_scale=None,
    yq_zp=None,
    q_mode="dynamic",
    q_shift=None,
    q_mul=None,
    q_static_amax=0.0,
):
    """x fp16 [T, 2n] -> y fp16 [T, n]; amax fp32 [T] (max |y| per row) or None; yq: also
    write y's int8 copy for the next linear in q_mode ("dynamic", "static", "dynamic_asym",
    "fp8": the copy is float8_e4m3fn), a_scale into yq_scale, zp into yq_zp, after q_shift /
    q_mul (kernels/quantize.py numerics)."""
    if act not in ACTS:
        raise ValueError(f"glu: no kernel activation {act!r} (have {sorted(ACTS)})")
    qmode = (QMODES[q_mode] if isinstance(q_mode, str) else int(q_mode)) if yq is not None else 0
    if (qmode and yq_scale is None) or (qmode == 3 and yq_zp is None):
        raise ValueError("glu: an int8 copy needs yq_scale (and yq_zp when asymmetric)")
    cfg = cfg or pick_config(n)
    dummy = amax if amax is not None else (yq_scale if yq_scale is not None else y)
    glu_kernel[(triton.cdiv(T, cfg["BLOCK_R"]),)](
        x,
        y,
        dummy,
        yq if yq is not None else y,
        yq_scale if yq_scale is not None else dummy,
        yq_zp if yq_zp is not None else dummy,
        q_shift if q_shift is not None else dummy,
        q_mul if q_mul is not None else dummy,
        T,
        n,
        x.stride(0),
        y.stride(0),
        yq.stride(0) if yq is not None else 0,
        float(q_static_amax),
        ACT=ACTS[act],
        AMAX_OUT=amax is not None,
        Q_OUT=qmode,
        Q_SHIFT=q_shift is not None,
        Q_MUL=q_mul is not None,
        PDL=pdl,
        launch_pdl=pdl,
        **cfg,
    )
