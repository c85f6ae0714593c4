"""Per-token INT8 quantisation of whole activation rows: the numerics of zoi.numerics.primitives.

``quant_rows`` (a ``triton.jit`` helper) is what every producer that sees whole rows calls
in its epilogue (embed, add_layernorm) to write the int8 copy its INT8
consumer reads; ``quantize_kernel`` is the same as a launch of its own, for consumers whose
producer sees only tiles of a row (attention -> o, ffn1 -> ffn2) when the in-loop path of
the linear kernel cannot serve them (asymmetric scheme, or an act_mul / act_shift).

Modes (``QMODE``): 1 symmetric per token (``quantize_act``), 2 static (per tensor,
``quantize_act(x, amax)``), 3 asymmetric per token (``quantize_act_asym``), 5 FP8 E4M3 per
token (``zoi.numerics.fp8.quantize_act_fp8``: a_scale = amax / 448, the copy is float8e4nv,
rounded by ``e4m3_round`` in fp32 first, so the conversion itself is exact).
Before the statistics, the consumer's SmoothQuant transform ``x' = (x - act_shift) * act_mul``
(float32, two roundings: a subtract then a multiply cannot contract into an FMA).

NaN (the engine's rule: a NaN never passes): a row holding a NaN gets a NaN ``a_scale`` in
every mode (the row statistics keep the NaN: ``common.amax_rows``, folded with NaN-propagating
maxima; static: the NaN check alone), so every GEMM output of that row is NaN and the engine's
non-finite check refuses the result; the row's int8 codes are then meaningless (an int8 cannot
hold a NaN, and the clamps return a bound for it on the GPU). Inf is unchanged: dynamic modes
give an infinite scale (a non-finite output), static saturates it as zoi.numerics.primitives.

Output per row: the int8 copy, ``a_scale`` (float32: amax/127 or range/255, IEEE division)
and, asymmetric, the zero point (int32). The asymmetric copy is stored as signed int8,
``q_s = q_u8 - 128``, so the GEMM stays an int8 x int8 ``tl.dot``; the linear kernel adds
``(128 - zp[t]) * colsum[n]`` to the integer sum, which gives exactly
``primitives.int8_matmul_asym_exact``.
"""

from __future__ import annotations

import math

import triton
import triton.language as tl

from zoi.backends.cuda.kernels.common import amax_rows, rint
from zoi.backends.cuda.kernels.pdl import pdl_begin
from zoi.graph.quantmode import QuantMode

# the kernels' QMODE of each INT8 / FP8 QuantMode (zoi.graph.quantmode: one name per scheme)
QMODES = {m.value: m.kernel_code for m in QuantMode if m.quantized}


@triton.jit
def act_tf(x, cols, c_ok, shift_ptr, mul_ptr, HAS_SHIFT: tl.constexpr, HAS_MUL: tl.constexpr):
    """The consumer's SmoothQuant transform x' = (x - act_shift) * act_mul (two roundings);
    columns outside c_ok become 0 (0 never changes the row statistics)."""
    if HAS_SHIFT:
        x = x - tl.load(shift_ptr + cols, mask=c_ok, other=0.0)[None, :]
    if HAS_MUL:
        x = x * tl.load(mul_ptr + cols, mask=c_ok, other=0.0)[None, :]
    return tl.where(c_ok[None, :], x, 0.0)


@triton.jit
def e4m3_round(v):
    """fp32 v with |v| <= 448 -> the nearest E4M3 value (ties to even), as fp32: the grid
    step is 2**(e - 3), e = max(floor(log2 |v|), -6), and v / step < 16 (exact products by
    powers of two; rint is exact there). Same arithmetic as zoi.numerics.fp8.e4m3_round."""
    bits = v.to(tl.int32, bitcast=True)
    e = tl.maximum(((bits >> 23) & 0xFF) - 127, -6) - 3
    step = ((e + 127) << 23).to(tl.float32, bitcast=True)
    inv_step = ((127 - e) << 23).to(tl.float32, bitcast=True)
    return rint(v * inv_step) * step


@triton.jit
def q_params(lo, hi, static_amax, QMODE: tl.constexpr):
    """Row statistics -> (inv, z (float), a_scale, zp int32). QMODE 3: lo = min(row, 0),
    hi = max(row, 0); QMODE 1, 5: hi = max |row| (lo unused); QMODE 2: static_amax (hi only
    says NaN). hi NaN (q_stats: the row holds a NaN) -> inv 0, a_scale NaN."""
    if QMODE == 3:
        r = hi - lo
        inv = tl.where(r > 0.0, tl.math.div_rn(255.0 + tl.zeros_like(r), tl.maximum(r, 1e-30)), 0.0)
        z = tl.minimum(rint(tl.minimum(tl.maximum(-lo * inv, 0.0), 256.0)), 255.0)
        scale = tl.math.div_rn(r, 255.0 + tl.zeros_like(r))
        zp = z.to(tl.int32)
    elif QMODE == 5:  # FP8 E4M3 per token: inv = 448 / amax, a_scale = amax / 448
        inv = tl.where(
            hi > 0.0, tl.math.div_rn(448.0 + tl.zeros_like(hi), tl.maximum(hi, 1e-30)), 0.0
        )
        z = tl.zeros_like(hi)
        scale = tl.math.div_rn(hi, 448.0 + tl.zeros_like(hi))
        zp = z.to(tl.int32)
    else:
        if QMODE == 2:
            amax = tl.zeros_like(hi) + static_amax
        else:
            amax = hi
        inv = tl.where(
            amax > 0.0, tl.math.div_rn(127.0 + tl.zeros_like(amax), tl.maximum(amax, 1e-30)), 0.0
        )
        z = tl.zeros_like(amax)
        scale = tl.math.div_rn(amax, 127.0 + tl.zeros_like(amax))
        if QMODE == 2:  # hi = max |row| (NaN-keeping): a NaN row's scale is NaN
            scale = tl.where(hi != hi, hi, scale)
        zp = z.to(tl.int32)
    return inv, z, scale, zp


@triton.jit
def q_apply(x, inv, z, QMODE: tl.constexpr):
    """x' [R, C] -> the int8 copy (asymmetric: stored as q_u8 - 128; QMODE 5: float8e4nv)
    with q_params' inv, z."""
    if QMODE == 3:
        s = rint(tl.minimum(tl.maximum(x * inv[:, None], -512.0), 512.0))
        s = tl.minimum(tl.maximum(s + z[:, None], 0.0), 255.0)
        q = (s - 128.0).to(tl.int8)
    elif QMODE == 5:  # E4M3: saturate at +-448, round on the grid, convert (exact)
        v = tl.minimum(tl.maximum(x * inv[:, None], -448.0), 448.0)
        q = e4m3_round(v).to(tl.float8e4nv, fp_downcast_rounding="rtne")
    else:
        q = rint(tl.minimum(tl.maximum(x * inv[:, None], -127.0), 127.0)).to(tl.int8)
    return q


@triton.jit
def q_stats(x, lo, hi, QMODE: tl.constexpr):
    """Fold a tile of x' rows into the running statistics (start both at 0): exact, so a row
    seen in tiles gives the statistics of the whole row. A NaN in the row makes hi NaN (kept by
    the NaN-propagating fold over later tiles): tl.max / tl.maximum alone would drop it."""
    a = amax_rows(x)  # max |x|, NaN if the row holds one
    if QMODE == 3:
        lo = tl.minimum(lo, tl.min(x, axis=1))
        m = tl.where(a != a, a, tl.max(x, axis=1))
        hi = tl.maximum(hi, m, propagate_nan=tl.PropagateNan.ALL)
    else:
        hi = tl.maximum(hi, a, propagate_nan=tl.PropagateNan.ALL)
    return lo, hi


@triton.jit
def quant_rows(
    x,  # [R, C] fp32 rows (columns outside c_ok are ignored)
    cols,  # [C] column indices
    c_ok,  # [C] valid columns
    shift_ptr,  # [C] fp32 (HAS_SHIFT)
    mul_ptr,  # [C] fp32 (HAS_MUL)
    static_amax,  # float (QMODE 2)
    QMODE: tl.constexpr,
    HAS_SHIFT: tl.constexpr,
    HAS_MUL: tl.constexpr,
):
    """-> (q int8 [R, C], a_scale fp32 [R], zp int32 [R]; 0 unless QMODE 3)."""
    x = act_tf(x, cols, c_ok, shift_ptr, mul_ptr, HAS_SHIFT, HAS_MUL)
    zero = tl.zeros((x.shape[0],), dtype=tl.float32)
    lo, hi = q_stats(x, zero, zero, QMODE)
    inv, z, scale, zp = q_params(lo, hi, static_amax, QMODE)
    return q_apply(x, inv, z, QMODE), scale, zp


@triton.jit
def quantize_kernel(
    x_ptr,  # [T, K] fp16 activations, row stride ldx
    shift_ptr,  # [K] fp32 (HAS_SHIFT)
    mul_ptr,  # [K] fp32 (HAS_MUL)
    q_ptr,  # [T, K] int8 out, row stride ldq
    scale_ptr,  # [T] fp32 out: a_scale
    zp_ptr,  # [T] int32 out: zero point (QMODE 3)
    T,
    K,
    ldx,
    ldq,
    static_amax,
    QMODE: tl.constexpr,
    HAS_SHIFT: tl.constexpr,
    HAS_MUL: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_begin(PDL)  # programmatic dependent launch: wait for the previous kernel's writes
    pid = tl.program_id(0)
    rows = pid * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.arange(0, BLOCK_K)
    r_ok = rows < T
    c_ok = cols < K
    m2 = r_ok[:, None] & c_ok[None, :]
    r64 = rows[:, None].to(tl.int64)
    x = tl.load(x_ptr + r64 * ldx + cols[None, :], mask=m2, other=0.0).to(tl.float32)
    q, scale, zp = quant_rows(
        x, cols, c_ok, shift_ptr, mul_ptr, static_amax, QMODE, HAS_SHIFT, HAS_MUL
    )
    tl.store(q_ptr + r64 * ldq + cols[None, :], q, mask=m2)
    tl.store(scale_ptr + rows, scale, mask=r_ok)
    if QMODE == 3:
        tl.store(zp_ptr + rows, zp, mask=r_ok)


# lab/gpu/sweep_linear.py on the H200 (gpu_sweep_20261201T0959Z.json): (BLOCK_R, num_warps) per
# (BLOCK_K, rows); us, the pick before the sweep -> the winner: K 1536 at 32768 rows 73.8 -> 59.6,
# 4096: 11.2 -> 9.6; K 3072 at 32768: 154.9 -> 117.3, 4096: 21.6 -> 18.0; K 384 / 768: <= 10%.
_TUNED = {
    512: {128: (4, 4), 1024: (4, 4), 4096: (8, 8), 32768: (2, 1)},
    1024: {128: (2, 4), 1024: (1, 2), 4096: (1, 1), 32768: (2, 1)},
    2048: {128: (1, 8), 1024: (2, 2), 4096: (1, 1), 32768: (2, 2)},
    4096: {128: (1, 16), 1024: (2, 4), 4096: (2, 4), 32768: (2, 4)},
}


def _nearest(T, ms):
    return min(ms, key=lambda m: abs(math.log2(max(T, 1)) - math.log2(m)))


def pick_config(K: int, T: int | None = None) -> dict:
    bk = triton.next_power_of_2(K)
    hit = _TUNED.get(bk) if T is not None else None
    if hit is not None:
        br, w = hit[_nearest(T, hit)]
        return dict(BLOCK_R=br, BLOCK_K=bk, num_warps=w)
    return dict(BLOCK_R=max(1, min(16, 4096 // bk)), BLOCK_K=bk, num_warps=4 if bk <= 1024 else 8)


def launch_quantize(
    x, shift, mul, q, scale, zp, T, K, *, mode, static_amax=0.0, cfg=None, pdl=False
):
    """x fp16 [T, K] -> q int8 [T, K] (mode 'fp8': float8_e4m3fn), scale fp32 [T], zp int32
    [T] (mode 'dynamic_asym')."""
    cfg = cfg or pick_config(K, T)
    qmode = QMODES[mode] if isinstance(mode, str) else int(mode)
    quantize_kernel[(triton.cdiv(T, cfg["BLOCK_R"]),)](
        x,
        shift if shift is not None else scale,
        mul if mul is not None else scale,
        q,
        scale,
        zp if zp is not None else scale,
        T,
        K,
        x.stride(0),
        q.stride(0),
        float(static_amax),
        QMODE=qmode,
        HAS_SHIFT=shift is not None,
        HAS_MUL=mul is not None,
        PDL=pdl,
        launch_pdl=pdl,
        **cfg,
    )


# ---- the first row of each sequence quantised twice (LinearQuant.first_row) ----------------
# zoi.numerics.primitives.first_row_residual: the first row of each sequence (row cu[b]) gets
# q1 = Q(x') in the linear's own mode, then the residual r = x' - float32(q1 - zp) * s1
# quantised with the fixed scale s2 = s1 * 2^-8 (|r| <= s1 / 2 when q1 is not clamped) into
# q2; the INT8 GEMM adds float(q2 . w) * (s2 * ws[n]) to that row after its bias. q2 of an
# element depends on that element, x' and s1 only, so the linear kernel computes it in its own
# K loop from the block it is reading (kernels/linear.py int8_loop): no launch;
# the row map it needs comes with the embedding (embed.py FR_MAP, first_row_seq).


@triton.jit
def first_row_q2(x, q1, s1, s2, ok):
    """q2 int8 [R, C] of x' [R, C] fp32 quantised as q1 (float32(q1 - zp), exact small
    integers) with a_scale s1 [R], s2 = s1 * 2^-8: clamp(rint(r / s2), -127, 127) with
    r = x' - float32(q1 * s1); 0 where not ok, where s2 is not finite and > 0 (a zero row, a
    NaN / Inf scale: NaN outputs anyway) and where r / s2 is NaN, as the emulation."""
    d = q1 * s1[:, None]
    # both operands rounded on their own, as the emulation: a clamp between each multiply (this
    # one, and act_mul's in x') and the subtract, so that neither contracts into an FMA (an
    # inf or a NaN becomes finite here: its row's s1, hence s2, is NaN / Inf, its outputs too)
    d = tl.minimum(tl.maximum(d, -3.4028234663852886e38), 3.4028234663852886e38)
    x = tl.minimum(tl.maximum(x, -3.4028234663852886e38), 3.4028234663852886e38)
    r = x - d
    pos = (s2 > 0.0) & (s2 < float("inf"))
    den = tl.where(pos, s2, 1.0)[:, None] + tl.zeros_like(r)
    v = tl.math.div_rn(r, den)  # IEEE division, correctly rounded
    ok = ok & pos[:, None] & (v == v)
    return tl.where(ok, rint(tl.minimum(tl.maximum(v, -127.0), 127.0)), 0.0).to(tl.int8)


@triton.jit
def first_row_seq(rows, nb, cu_ptr, BLOCK_B: tl.constexpr):
    """The sequence each of rows (int32) starts: b < nb with cu[b] == row, else -1 (rows past
    the call's tokens too: cu[b] < T for b < B). The embed kernel writes it for every row of
    the activation buffers (its FR_MAP): the linears' row map of the first-row term."""
    seq = tl.zeros_like(rows) - 1
    for b0 in range(0, nb, BLOCK_B):
        bs = b0 + tl.arange(0, BLOCK_B)
        starts = tl.load(cu_ptr + bs, mask=bs < nb, other=-1)
        hit = rows[:, None] == starts[None, :]
        seq = tl.maximum(seq, tl.max(tl.where(hit, bs[None, :], -1), axis=1))
    return seq
