"""linear: y = act(x @ w.T + b) [+ r], INT8 (per-token sym / asym, static) or FP16.

One Triton kernel, specialised by constexpr flags:

* ``QUANT`` 0: FP16 weights, ``tl.dot`` on fp16 operands with fp32 accumulation.
  1: INT8 weights, activations quantised per token *while loading* from the fp16
  activation buffer with ``amax`` read from ``a_amax_ptr`` (dynamic scheme, the producer
  wrote it). 2: INT8 static scheme, ``amax = static_amax``. 4: A already int8 (below).
  The INT8 numerics are those of ``zoi.numerics.primitives`` (ARCHITECTURE.md):
  ``inv = 127/amax`` (0 when amax == 0), ``q = clip(rint(x*inv), -127, 127)``,
  ``y = float(sum_k q*w_q) * (amax/127 * w_scale[n]) + b[n]``; the sum is int32, exact.
  rint is done as clamp-then-(x + 1.5*2^23) - 1.5*2^23 (round-half-even for |x| < 2^22,
  identical on the GPU and in the interpreter; the clamp sits between the multiply and the
  add, so no FMA contraction can change it). NaN: the clamp makes a NaN a finite code, so the
  row's a_scale carries it instead (QUANT 1: the producer's NaN-keeping amax; QUANT 2: a check
  of A's bits in the loop; QUANT 4 / 8: the a_scale the quantiser poisoned, kernels/quantize.py).
* ``ACT`` 0 none, 1 gelu (erf), 2 gelu_tanh, 3 relu, 4 sigmoid, 5 silu; before the residual.
* ``HAS_RES``: ``+ r`` after the activation (fp32).
* ``AMAX_OUT``: the atomic max of |y| per row into ``amax_out_ptr`` (the buffer
  must be zero beforehand; amax >= 0 so a float atomic max is exact, and a NaN amax, a
  positive NaN, wins it: Triton's float atomic max is an integer max for values >= 0 by sign
  bit, and NaN's bits lie above every float's). The next INT8 linear reads it (QUANT 1).
* ``QUANT`` 4: A already int8 (written by its producer or by ``quantize.quantize_kernel``)
  with the per-row ``a_scale`` itself in ``a_amax_ptr``; with ``ASYM`` the copy is the
  asymmetric one stored as ``q_u8 - 128`` and the exact integer sum is
  ``dot(q_s, w) + (128 - zp[t]) * colsum[n]`` (``colsum[n] = sum_k w_q[n, k]``, int32,
  packed with the weights) == ``primitives.int8_matmul_asym_exact``.
* ``QUANT`` 8: FP8. A is the float8e4nv copy (written by its producer or by
  ``quantize.quantize_kernel``, QMODE 5) with the per-row ``a_scale`` in ``a_amax_ptr``, W
  float8e4nv [N, K] with ``ws`` per output channel; ``tl.dot`` on fp8 operands into an fp32
  accumulator (promoted every BLOCK_K products: ``max_num_imprecise_acc``, Hopper's fp8
  wgmma keeps fewer bits internally), ``y = acc * (a_scale[t] * ws[n]) + b[n]`` as INT8 ==
  ``zoi.numerics.fp8.linear_fp8_emulated`` up to fp32 summation order.
* ``FIRST_ROW`` (INT8, QUANT 1 / 2 / 4): the first row of each sequence quantised twice
  (``zoi.numerics.primitives.first_row_residual``: q2 = the residual of q1 on the fixed scale
  s2 = s1 * 2^-8). A tile holding such a row (row map ``fr_ptr`` >= 0, tested once before the
  K loop: the other tiles run the plain loop) computes q2 of those rows in the same K loop
  (``quantize.first_row_q2``, from x' and the block's own codes q1; QUANT 4 loads the fp16
  rows the int8 A came from, masked to the first rows) and accumulates ``dot(q2, w)`` with the
  W tile just loaded into a second int32 accumulator; after the bias, those rows get
  ``+ acc2 * (s2 * ws[n])`` (``primitives.add_first_row_term``).

Not here, measured slower on the H200 and removed (lab/gpu/NOTES.md has the figures): a
LayerNorm epilogue (o / ffn2 + LN: a program owning whole rows lost to linear + add_layernorm
at every bucket), a mode in which ffn1's programs own whole rows to write ffn2's int8 copy
(slower than ffn1 + a quantize launch), and the quantize launch folded into the consumer's GEMM
(a second, un-pipelined walk over K cost more than the launch it saved).
"""

from __future__ import annotations

import math

import triton
import triton.language as tl

from zoi.backends.cuda.kernels.common import ACTS, activation, amax_rows, rint
from zoi.backends.cuda.kernels.pdl import pdl_begin
from zoi.backends.cuda.kernels.quantize import act_tf, first_row_q2


@triton.jit
def int8_loop(
    a_ptrs, w_ptrs, x_ptrs, rk, K, inv, s1, zq, has, in_shift_ptr, in_mul_ptr,
    QUANT: tl.constexpr, IN_SHIFT: tl.constexpr, IN_MUL: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, FR: tl.constexpr,
):  # fmt: skip
    """The K loop of QUANT 1 / 2 / 4: (int32 acc, int32 acc2, QUANT 2's max bits of |a|).
    FR (a tile holding a first row, ``has``): also q2 of those rows (quantize.first_row_q2,
    from x' and the codes q1 of this very block, ``q1 - zp = code + zq``) into acc2 with the
    same W tile; x' is A itself in QUANT 1 / 2 (no transform), else the fp16 rows at x_ptrs
    (loaded for the first rows only) after act_shift / act_mul."""
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
    acc2 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
    a_bits = tl.zeros((BLOCK_M,), dtype=tl.int32)  # QUANT 2: max bits of |a| (NaN check)
    s2 = s1 * 0.00390625  # spec: s2 = s1 * 2^-8 (exact)
    for k in range(0, K, BLOCK_K):
        k_ok = (k + rk) < K
        if QUANT == 4:
            q = tl.load(a_ptrs, mask=k_ok[None, :], other=0)
        else:
            a = tl.load(a_ptrs, mask=k_ok[None, :], other=0.0).to(tl.float32)
            if QUANT == 2:  # the static amax says nothing of a NaN in A: look for one
                a_bits = tl.maximum(a_bits, amax_rows(a).to(tl.int32, bitcast=True))
            s = tl.minimum(tl.maximum(a * inv[:, None], -127.0), 127.0)
            s = rint(s)
            q = s.to(tl.int8)
        w = tl.load(w_ptrs, mask=k_ok[:, None], other=0)
        acc = tl.dot(q, w, acc, out_dtype=tl.int32)
        if FR:
            ok = has[:, None] & k_ok[None, :]
            if QUANT == 4:
                x = tl.load(x_ptrs, mask=ok, other=0.0).to(tl.float32)
                x = act_tf(x, k + rk, k_ok, in_shift_ptr, in_mul_ptr, IN_SHIFT, IN_MUL)
                q2 = first_row_q2(x, q.to(tl.float32) + zq[:, None], s1, s2, ok)
                x_ptrs += BLOCK_K
            else:
                q2 = first_row_q2(a, s, s1, s2, ok)
            acc2 = tl.dot(q2, w, acc2, out_dtype=tl.int32)
        a_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    return acc, acc2, a_bits


@triton.jit
def gemm_tile(
    a_ptr,
    a_amax_ptr,
    a_zp_ptr,
    colsum_ptr,
    w_ptr,
    ws_ptr,
    b_ptr,
    rm_c,
    rn,
    n_mask,
    K,
    lda,
    static_amax,
    QUANT: tl.constexpr,
    ASYM: tl.constexpr,
    ACT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    FIRST_ROW: tl.constexpr = False,
    fr=None,
    x_ptr=None,
    ldx=0,
    in_shift_ptr=None,
    in_mul_ptr=None,
    IN_SHIFT: tl.constexpr = False,
    IN_MUL: tl.constexpr = False,
):
    """One output tile (rows rm_c, clamped in bounds; columns rn): act(A W^T dequantised + b),
    fp32. FIRST_ROW (INT8): ``fr`` [BLOCK_M] the rows' sequence if they start one, else -1;
    such rows get the second term (first_rows_term), q2 computed in the K loop from the fp16
    rows x' comes from (QUANT 4: x_ptr, row stride ldx, this linear's act_shift / act_mul)."""
    rk = tl.arange(0, BLOCK_K)
    rn_c = tl.where(n_mask, rn, 0)
    a_ptrs = a_ptr + rm_c[:, None].to(tl.int64) * lda + rk[None, :]
    w_ptrs = w_ptr + rn_c[None, :].to(tl.int64) * K + rk[:, None]  # [BLOCK_K, BLOCK_N] view of W^T

    if QUANT == 0:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(0, K, BLOCK_K):
            k_ok = (k + rk) < K
            a = tl.load(a_ptrs, mask=k_ok[None, :], other=0.0)
            w = tl.load(w_ptrs, mask=k_ok[:, None], other=0.0)
            acc = tl.dot(a.to(tl.float16), w, acc)
            a_ptrs += BLOCK_K
            w_ptrs += BLOCK_K
        y = acc
    elif QUANT == 8:  # FP8 E4M3 x E4M3, fp32 accumulation
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(0, K, BLOCK_K):
            k_ok = (k + rk) < K
            a = tl.load(a_ptrs, mask=k_ok[None, :], other=0.0)
            w = tl.load(w_ptrs, mask=k_ok[:, None], other=0.0)
            acc = tl.dot(a, w, acc, max_num_imprecise_acc=BLOCK_K)
            a_ptrs += BLOCK_K
            w_ptrs += BLOCK_K
        a_scale = tl.load(a_amax_ptr + rm_c)
        ws = tl.load(ws_ptr + rn, mask=n_mask, other=0.0)
        y = acc * (a_scale[:, None] * ws[None, :])
    else:
        if QUANT == 2:
            amax = tl.zeros((BLOCK_M,), dtype=tl.float32) + static_amax
        else:
            amax = tl.load(a_amax_ptr + rm_c)
        inv = tl.where(
            amax > 0.0, tl.math.div_rn(127.0 + tl.zeros_like(amax), tl.maximum(amax, 1e-30)), 0.0
        )
        if QUANT == 4:
            a_scale = amax
        else:  # QUANT 1: a NaN in A made the producer's amax NaN, so a_scale is NaN
            a_scale = tl.math.div_rn(amax, 127.0 + tl.zeros_like(amax))
        zq = tl.zeros_like(amax)  # q1 - zp = the code in A + zq (asymmetric: q_u8 - 128 in A)
        if FIRST_ROW and ASYM:
            zq = (128 - tl.load(a_zp_ptr + rm_c)).to(tl.float32)
        x_ptrs = a_ptrs
        if FIRST_ROW and QUANT == 4:
            x_ptrs = x_ptr + rm_c[:, None].to(tl.int64) * ldx + rk[None, :]
        if FIRST_ROW:
            has = fr >= 0
            if tl.max(fr, axis=0) >= 0:  # a first row in the tile: the loop that adds q2
                acc, acc2, a_bits = int8_loop(
                    a_ptrs, w_ptrs, x_ptrs, rk, K, inv, a_scale, zq, has, in_shift_ptr,
                    in_mul_ptr, QUANT, IN_SHIFT, IN_MUL, BLOCK_M, BLOCK_N, BLOCK_K, True,
                )  # fmt: skip
            else:
                acc, acc2, a_bits = int8_loop(
                    a_ptrs, w_ptrs, x_ptrs, rk, K, inv, a_scale, zq, has, in_shift_ptr,
                    in_mul_ptr, QUANT, IN_SHIFT, IN_MUL, BLOCK_M, BLOCK_N, BLOCK_K, False,
                )  # fmt: skip
        else:
            acc, acc2, a_bits = int8_loop(
                a_ptrs, w_ptrs, x_ptrs, rk, K, inv, a_scale, zq, zq > 0.0, in_shift_ptr,
                in_mul_ptr, QUANT, IN_SHIFT, IN_MUL, BLOCK_M, BLOCK_N, BLOCK_K, False,
            )  # fmt: skip
        if ASYM:  # sum_k q_u8 w = dot(q_u8 - 128, w) + 128 colsum; minus zp colsum
            zp = tl.load(a_zp_ptr + rm_c)
            cs = tl.load(colsum_ptr + rn_c)
            acc += (128 - zp)[:, None] * cs[None, :]
        if QUANT == 2:  # bits above +inf's: a NaN (the clamp made it a finite code)
            a_scale = tl.where(a_bits > 0x7F800000, float("nan"), a_scale)
        ws = tl.load(ws_ptr + rn, mask=n_mask, other=0.0)
        y = acc.to(tl.float32) * (a_scale[:, None] * ws[None, :])
    bias = tl.load(b_ptr + rn, mask=n_mask, other=0.0)
    y = y + bias[None, :]
    if FIRST_ROW:
        y = first_rows_term(y, acc2, a_scale, ws, fr)
    return activation(y, ACT)


@triton.jit
def first_rows_term(y, acc2, s1, ws, fr):
    """y (bias in) + float(q2 . w) * (s2 * ws[n]) on the rows that start a sequence (fr >= 0),
    s2 = s1 * 2^-8 (a NaN s1, a NaN row: NaN outputs) == primitives.add_first_row_term."""
    s2 = s1 * 0.00390625
    return tl.where((fr >= 0)[:, None], y + acc2.to(tl.float32) * (s2[:, None] * ws[None, :]), y)


@triton.jit
def linear_kernel(
    a_ptr,  # A [M, K] fp16 activations (QUANT 4: int8, QUANT 8: fp8), row stride lda
    a_amax_ptr,  # [M] fp32 per-row amax of A (QUANT 1) or a_scale (QUANT 4)
    a_zp_ptr,  # [M] int32 per-row zero point of A (QUANT 4, ASYM)
    colsum_ptr,  # [N] int32 sum_k w_q[n, k] (QUANT 4, ASYM)
    w_ptr,  # W [N, K] int8 (QUANT 1, 2, 4), fp8 (QUANT 8) or fp16 (QUANT 0), row-major
    ws_ptr,  # [N] fp32 per-output-channel weight scale (QUANT 1, 2, 4)
    b_ptr,  # [N] fp32 bias
    r_ptr,  # [M, N] residual (HAS_RES), row stride ldr
    y_ptr,  # [M, N] output (dtype of the buffer), row stride ldy
    amax_out_ptr,  # [M] fp32 per-row amax of y (AMAX_OUT)
    in_shift_ptr,  # [K] fp32 this linear's act_shift (QUANT 4 with FIRST_ROW; IN_SHIFT)
    in_mul_ptr,  # [K] fp32 this linear's act_mul (QUANT 4 with FIRST_ROW; IN_MUL)
    fr_ptr,  # [M] int32 row -> sequence whose first row it is, or -1 (FIRST_ROW)
    x_ptr,  # [M, K] fp16 rows the int8 A was quantised from, row stride ldx (FIRST_ROW, QUANT 4)
    M,
    N,
    K,
    lda,
    ldr,
    ldy,
    ldx,
    static_amax,  # float, QUANT 2
    QUANT: tl.constexpr,
    ASYM: tl.constexpr,
    ACT: tl.constexpr,
    HAS_RES: tl.constexpr,
    AMAX_OUT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    PDL: tl.constexpr,
    IN_SHIFT: tl.constexpr,
    IN_MUL: tl.constexpr,
    FIRST_ROW: tl.constexpr = False,  # INT8: the first rows' second quantisation, in the loop
):
    pdl_begin(PDL)  # programmatic dependent launch: wait for the previous kernel's writes
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    # grouped ordering: consecutive programs share W tiles in L2
    group = GROUP_M * num_n
    gid = pid // group
    first_m = gid * GROUP_M
    gsize = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % group) % gsize
    pid_n = (pid % group) // gsize

    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_mask = rm < M
    n_mask = rn < N
    # clamp rows for the main-loop loads (in bounds; their results are masked at the store).
    # The column index along N stays a plain arange: the epilogue's loads and stores are
    # contiguous along N and must stay provably so (a clamped index made them 2-byte scalar
    # stores: 121 GB/s, measured on the H200, 2026-11-30).
    rm_c = tl.where(m_mask, rm, 0)
    fr = rm_c
    if FIRST_ROW:  # row -> its sequence if it starts one, else -1 (rows past M too)
        fr = tl.load(fr_ptr + rm, mask=m_mask, other=-1)
    y = gemm_tile(
        a_ptr, a_amax_ptr, a_zp_ptr, colsum_ptr, w_ptr, ws_ptr, b_ptr, rm_c, rn, n_mask,
        K, lda, static_amax, QUANT, ASYM, ACT, BLOCK_M, BLOCK_N, BLOCK_K, FIRST_ROW,
        fr, x_ptr, ldx, in_shift_ptr, in_mul_ptr, IN_SHIFT, IN_MUL,
    )  # fmt: skip
    mask2 = m_mask[:, None] & n_mask[None, :]
    if HAS_RES:
        r = tl.load(r_ptr + rm[:, None].to(tl.int64) * ldr + rn[None, :], mask=mask2, other=0.0)
        y = y + r.to(tl.float32)
    out = y.to(y_ptr.dtype.element_ty)
    tl.store(y_ptr + rm[:, None].to(tl.int64) * ldy + rn[None, :], out, mask=mask2)
    if AMAX_OUT:  # NaN-keeping (a NaN row's amax is NaN: its consumer's scale too)
        row_amax = amax_rows(tl.where(mask2, out.to(tl.float32), 0.0))
        tl.atomic_max(amax_out_ptr + rm, row_amax, mask=m_mask)


from zoi.backends.cuda.kernels.linear_table import _LINEAR  # noqa: E402  (the measured tiles)

_TUNED_M = (16, 128, 1024, 4096, 16384, 32768)


def _nearest(M: int, ms=_TUNED_M) -> int:
    return min(ms, key=lambda m: abs(math.log2(max(M, 1)) - math.log2(m)))


def _as_cfg(t) -> dict:
    bm, bn, bk, w, st = t
    return dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8, num_warps=w, num_stages=st)


def pick_config(M: int, N: int, K: int, quant: bool, *, prequant: bool = True) -> dict:
    """Tile configuration per shape, chosen once at compile time.

    MiniLM / bert-base shapes: the measured table above (prequant: A is int8, QUANT 4; the
    in-loop quantising QUANT 1 / 2 and other shapes use the rules below).
    Rules elsewhere: small M, 16-row tiles (mma.sync) and narrow N tiles, so that more programs
    share the weight reads; large M, 128x128 tiles with BLOCK_K 64 and 4 warps (wgmma), which won
    at every large shape of the sweep (128x256 / 8 warps, the pick before it, lost 10-30%).
    """
    prec = "int8" if quant else "fp16"
    hit = _LINEAR.get((prec, int(N), int(K))) if (prequant or not quant) else None
    if hit is not None:
        return _as_cfg(hit[_nearest(M)])
    bk = 128 if quant else 64
    if M <= 256:
        return dict(
            BLOCK_M=16,
            BLOCK_N=32 if N <= 512 else 64,
            BLOCK_K=bk,
            GROUP_M=8,
            num_warps=4,
            num_stages=4,
        )
    if quant and not prequant:  # fp16 A quantised on load (QUANT 1 / 2): not swept, as before
        if M <= 4096:
            return dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=bk, GROUP_M=8, num_warps=4, num_stages=4)
        bn, w, st = (256, 8, 3) if N >= 1024 else (128, 8, 4)
        return dict(BLOCK_M=128, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8, num_warps=w, num_stages=st)
    if M <= 4096:
        return dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=bk, GROUP_M=8, num_warps=4, num_stages=3)
    return dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, num_warps=4, num_stages=4)


def grid_size(M: int, N: int, cfg: dict) -> int:
    return triton.cdiv(M, cfg["BLOCK_M"]) * triton.cdiv(N, cfg["BLOCK_N"])


def launch_linear(
    a,
    a_amax,
    w,
    ws,
    b,
    r,
    y,
    amax_out,
    M,
    N,
    K,
    *,
    quant,
    act="none",
    static_amax=0.0,
    cfg=None,
    pdl=False,
    a_zp=None,
    colsum=None,
    in_shift=None,
    in_mul=None,
    first_row=None,
):
    """Launch on the current stream. Arguments are torch tensors (or anything Triton accepts).

    quant 4 with a_zp / colsum: A is the asymmetric copy (q_u8 - 128). amax_out: fp32 [M],
    zeroed beforehand, gets the atomic max of |y| per row (None: not written).
    first_row (INT8 only): (fr_map, x), fr_map int32 [M] the sequence each row starts or -1
    (the embedding kernel's, embed.py FR_MAP): the first row of each sequence quantised twice
    (zoi.numerics.primitives.first_row_residual), its q2 computed in the K loop; x: quant 4,
    the fp16 [M, K] rows the int8 A was quantised from (this linear's in_shift / in_mul applied
    to them), else None (A itself is fp16)."""
    assert first_row is None or quant in (1, 2, 4), "the first-row residual is INT8 only"
    fr_x = first_row[1] if first_row is not None else None
    assert first_row is None or (fr_x is not None) == (quant == 4), (
        "the first-row residual: x is the fp16 source of an int8 A (quant 4) only"
    )
    assert fr_x is not None or (in_shift is None and in_mul is None), (
        "in_shift / in_mul: the first-row residual of quant 4 only"
    )
    cfg = cfg or pick_config(M, N, K, quant != 0, prequant=quant in (4, 8))
    asym = quant == 4 and a_zp is not None
    assert not asym or colsum is not None
    dummy = b
    linear_kernel[(grid_size(M, N, cfg),)](
        a,
        a_amax if a_amax is not None else dummy,
        a_zp if a_zp is not None else dummy,
        colsum if colsum is not None else dummy,
        w,
        ws if ws is not None else dummy,
        b,
        r if r is not None else dummy,
        y,
        amax_out if amax_out is not None else dummy,
        in_shift if in_shift is not None else dummy,
        in_mul if in_mul is not None else dummy,
        first_row[0] if first_row is not None else dummy,
        fr_x if fr_x is not None else dummy,
        M,
        N,
        K,
        a.stride(0),
        r.stride(0) if r is not None else 0,
        y.stride(0),
        fr_x.stride(0) if fr_x is not None else 0,
        float(static_amax),
        QUANT=quant,
        ASYM=asym,
        ACT=ACTS[act] if isinstance(act, str) else act,
        HAS_RES=r is not None,
        AMAX_OUT=amax_out is not None,
        PDL=pdl,
        IN_SHIFT=in_shift is not None,
        IN_MUL=in_mul is not None,
        FIRST_ROW=first_row is not None,
        launch_pdl=pdl,
        **cfg,
    )
