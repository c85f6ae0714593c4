"""glu: y = act(x[:, :n]) * x[:, n:] over rows of 2n (ModernBERT's GeGLU between its two FFN
linears), fp32 math, one program per BLOCK_R whole rows, columns in BLOCK_C chunks.

For the INT8 linear that reads y (ffn2), as the plan says (zoi.graph.fusion: glu sees whole
rows, so it writes the copy, ``quant_out``):

* ``Q_OUT``: y's int8 copy (``quantize`` numerics, the consumer's act_shift / act_mul first)
  with its a_scale (and zero point) per row, so that ffn2 runs as a pure int8 GEMM (QUANT 4).
  The row statistics are folded over the chunks while y is stored (``quantize.q_stats``),
  then the program reads its stored rows back and quantises them (``quantize.
  store_q_stored_rows``): the copy is that of the stored fp16 y, as a quantize launch makes it;
* ``AMAX_OUT``: the per-row max |y| (NaN-keeping) for a linear that quantises y while loading
  it (kernels/linear.py QUANT 1); stored (the program owns its rows: no atomics).
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from zoi.backends.cuda.kernels.common import ACTS, activation, amax_rows
from zoi.backends.cuda.kernels.quantize import act_tf, q_copy, q_stats, store_q_stored_rows


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
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
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
        store_q_stored_rows(
            y_ptr, ldy, rows, r_ok, n, lo, hi, yq_ptr, ldyq, yqs_ptr, yqz_ptr, qshift_ptr,
            qmul_ptr, q_static_amax, Q_OUT, Q_SHIFT, Q_MUL, BLOCK_C,
        )  # fmt: skip


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
    dummy = amax if amax is not None else (yq_scale if yq_scale is not None else y)
    qc = q_copy("glu", y, dummy, yq, yq_scale, yq_zp, q_mode, q_shift, q_mul, q_static_amax)
    cfg = cfg or pick_config(n)
    glu_kernel[(triton.cdiv(T, cfg["BLOCK_R"]),)](
        x,
        y,
        dummy,
        *qc.ptrs,
        T,
        n,
        x.stride(0),
        y.stride(0),
        qc.ld,
        qc.static_amax,
        ACT=ACTS[act],
        AMAX_OUT=amax is not None,
        **qc.flags,
        PDL=pdl,
        launch_pdl=pdl,
        **cfg,
    )
