"""linear: y = act(x @ w.T + b) [+ r] [-> LayerNorm], INT8 (per-token sym / asym, static) or FP16.

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
  add, so no FMA contraction can change it).
* ``ACT`` 0 none, 1 gelu (erf), 2 gelu_tanh, 3 relu, 4 sigmoid; applied before the residual.
* ``HAS_RES``: ``+ r`` after the activation (fp32).
* ``LN``: the program owns whole rows (``BLOCK_N >= N``, grid_n == 1); the epilogue
  computes ``LayerNorm(y) * ln_w + ln_b`` in fp32 (two-pass on the tile in registers).
* ``AMAX_OUT`` 0 none; 1 atomic max of |y| per row into ``amax_out_ptr`` (the buffer
  must be zero beforehand; amax >= 0 so a float atomic max is exact); 2 plain store
  (LN mode only, the program sees the whole row). The next INT8 linear reads it (QUANT 1).
* ``QUANT`` 4: A already int8 (written by its producer or by ``quantize.quantize_kernel``)
  with the per-row ``a_scale`` itself in ``a_amax_ptr``; with ``ASYM`` the copy is the
  asymmetric one stored as ``q_u8 - 128`` and the exact integer sum is
  ``dot(q_s, w) + (128 - zp[t]) * colsum[n]`` (``colsum[n] = sum_k w_q[n, k]``, int32,
  packed with the weights) == ``primitives.int8_matmul_asym_exact``.
* ``Q_OUT`` (LN mode only): also write y quantised per token for the next INT8 linear
  (``quantize.quant_rows``: mode 1 symmetric, 2 static, 3 asymmetric; that consumer's
  act_shift / act_mul applied first), with a_scale (and zp) per row, so that it runs as
  QUANT 4 (a pure int8 GEMM, no conversion in its main loop).
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from zoi.backends.cuda.kernels.quantize import QMODES, quant_rows


@triton.jit
def _activation(y, ACT: tl.constexpr):
    if ACT == 1:  # gelu, erf form (BERT)
        y = 0.5 * y * (1.0 + tl.erf(y * 0.7071067811865476))
    elif ACT == 2:  # gelu, tanh form; tanh via exp for the interpreter's sake
        u = 0.7978845608028654 * (y + 0.044715 * y * y * y)
        t = 1.0 - 2.0 / (tl.exp(2.0 * u) + 1.0)
        y = 0.5 * y * (1.0 + t)
    elif ACT == 3:
        y = tl.maximum(y, 0.0)
    elif ACT == 4:
        y = 1.0 / (1.0 + tl.exp(-y))
    return y


@triton.jit
def linear_kernel(
    a_ptr,  # A [M, K] fp16 activations (QUANT 4: int8), row stride lda
    a_amax_ptr,  # [M] fp32 per-row amax of A (QUANT 1) or a_scale (QUANT 4)
    a_zp_ptr,  # [M] int32 per-row zero point of A (QUANT 4, ASYM)
    colsum_ptr,  # [N] int32 sum_k w_q[n, k] (QUANT 4, ASYM)
    w_ptr,  # W [N, K] int8 (QUANT 1, 2, 4) or fp16 (QUANT 0), row-major (HF orientation)
    ws_ptr,  # [N] fp32 per-output-channel weight scale (QUANT 1, 2, 4)
    b_ptr,  # [N] fp32 bias
    r_ptr,  # [M, N] residual (HAS_RES), row stride ldr
    lnw_ptr,  # [N] fp32 LayerNorm weight (LN)
    lnb_ptr,  # [N] fp32 LayerNorm bias (LN)
    y_ptr,  # [M, N] output (dtype of the buffer), row stride ldy
    amax_out_ptr,  # [M] fp32 per-row amax of y (AMAX_OUT)
    yq_ptr,  # [M, N] int8 per-token quantised y, row stride ldyq (Q_OUT, LN mode)
    yqs_ptr,  # [M] fp32 a_scale of yq (Q_OUT)
    yqz_ptr,  # [M] int32 zero point of yq (Q_OUT 3)
    qshift_ptr,  # [N] fp32 act_shift of the consumer (Q_SHIFT)
    qmul_ptr,  # [N] fp32 act_mul of the consumer (Q_MUL)
    M,
    N,
    K,
    lda,
    ldr,
    ldy,
    ldyq,
    static_amax,  # float, QUANT 2
    eps,  # float, LN
    q_static_amax,  # float, Q_OUT 2
    QUANT: tl.constexpr,
    ASYM: tl.constexpr,
    ACT: tl.constexpr,
    HAS_RES: tl.constexpr,
    LN: tl.constexpr,
    AMAX_OUT: tl.constexpr,
    Q_OUT: tl.constexpr,
    Q_SHIFT: tl.constexpr,
    Q_MUL: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    PDL: tl.constexpr,
):
    if PDL:  # programmatic dependent launch: wait for the previous kernel's writes
        gdc_wait()
        gdc_launch_dependents()
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
    rk = tl.arange(0, BLOCK_K)
    m_mask = rm < M
    n_mask = rn < N
    # clamp rows for the main-loop loads (in bounds; their results are masked at the store).
    # The column index along N stays a plain arange: the epilogue's loads and stores are
    # contiguous along N and must stay provably so (a clamped index made them 2-byte scalar
    # stores: 121 GB/s, measured on the H200, 2026-11-30).
    rm_c = tl.where(m_mask, rm, 0)
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
    else:
        if QUANT == 2:
            amax = tl.zeros((BLOCK_M,), dtype=tl.float32) + static_amax
        else:
            amax = tl.load(a_amax_ptr + rm_c)
        inv = tl.where(
            amax > 0.0, tl.math.div_rn(127.0 + tl.zeros_like(amax), tl.maximum(amax, 1e-30)), 0.0
        )
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
        for k in range(0, K, BLOCK_K):
            k_ok = (k + rk) < K
            if QUANT == 4:
                q = tl.load(a_ptrs, mask=k_ok[None, :], other=0)
            else:
                a = tl.load(a_ptrs, mask=k_ok[None, :], other=0.0).to(tl.float32)
                s = tl.minimum(tl.maximum(a * inv[:, None], -127.0), 127.0)
                s = (s + 12582912.0) - 12582912.0
                q = s.to(tl.int8)
            w = tl.load(w_ptrs, mask=k_ok[:, None], other=0)
            acc = tl.dot(q, w, acc, out_dtype=tl.int32)
            a_ptrs += BLOCK_K
            w_ptrs += BLOCK_K
        if QUANT == 4:
            if ASYM:  # sum_k q_u8 w = dot(q_u8 - 128, w) + 128 colsum; minus zp colsum
                zp = tl.load(a_zp_ptr + rm_c)
                cs = tl.load(colsum_ptr + rn_c)
                acc += (128 - zp)[:, None] * cs[None, :]
            a_scale = amax
        else:
            a_scale = tl.math.div_rn(amax, 127.0 + tl.zeros_like(amax))
        ws = tl.load(ws_ptr + rn, mask=n_mask, other=0.0)
        y = acc.to(tl.float32) * (a_scale[:, None] * ws[None, :])

    bias = tl.load(b_ptr + rn, mask=n_mask, other=0.0)
    y = y + bias[None, :]
    y = _activation(y, ACT)
    mask2 = m_mask[:, None] & n_mask[None, :]
    if HAS_RES:
        r = tl.load(r_ptr + rm[:, None].to(tl.int64) * ldr + rn[None, :], mask=mask2, other=0.0)
        y = y + r.to(tl.float32)
    if LN:
        y = tl.where(n_mask[None, :], y, 0.0)
        mean = tl.sum(y, axis=1) / N
        d = tl.where(n_mask[None, :], y - mean[:, None], 0.0)
        var = tl.sum(d * d, axis=1) / N
        rstd = 1.0 / tl.sqrt(var + eps)
        lw = tl.load(lnw_ptr + rn, mask=n_mask, other=0.0)
        lb = tl.load(lnb_ptr + rn, mask=n_mask, other=0.0)
        y = d * rstd[:, None] * lw[None, :] + lb[None, :]
    out = y.to(y_ptr.dtype.element_ty)
    tl.store(y_ptr + rm[:, None].to(tl.int64) * ldy + rn[None, :], out, mask=mask2)
    if AMAX_OUT != 0:
        ay = tl.where(mask2, tl.abs(out.to(tl.float32)), 0.0)
        row_amax = tl.max(ay, axis=1)
        if AMAX_OUT == 1:
            tl.atomic_max(amax_out_ptr + rm, row_amax, mask=m_mask)
        else:
            tl.store(amax_out_ptr + rm, row_amax, mask=m_mask)
    if Q_OUT != 0:  # LN mode: the program owns whole rows
        yq, qs, qz = quant_rows(
            out.to(tl.float32),
            rn,
            n_mask,
            qshift_ptr,
            qmul_ptr,
            q_static_amax,
            Q_OUT,
            Q_SHIFT,
            Q_MUL,
        )
        tl.store(yq_ptr + rm[:, None].to(tl.int64) * ldyq + rn[None, :], yq, mask=mask2)
        tl.store(yqs_ptr + rm, qs, mask=m_mask)
        if Q_OUT == 3:
            tl.store(yqz_ptr + rm, qz, mask=m_mask)


ACTS = {"none": 0, "gelu": 1, "gelu_tanh": 2, "relu": 3, "sigmoid": 4}


def pick_config(M: int, N: int, K: int, quant: bool, ln: bool) -> dict:
    """Tile configuration per shape (chosen once, at compile time, from H200 measurements in
    docs/GPU.md).

    Small M (a few sequences): 16-row tiles (mma.sync) and narrow N tiles, so that more
    programs share the weight reads. Large M: 128-row tiles, lowered to wgmma (IGMMA/HGMMA)
    on sm_90a; 128x256x128 with 3 stages measured best for INT8 (1120 TOP/s at 8192^3).
    LN epilogue: the program must own whole rows, BLOCK_N = next_pow2(N).
    """
    bk = 128 if quant else 64
    if ln:
        bn = triton.next_power_of_2(N)
        bm = 16 if M <= 256 else (32 if M <= 4096 else 64)
        if bn >= 1024:
            bk = 64
        warps = 4 if bn * bm <= 8192 else 8
        stages = 3 if bn <= 512 else 2
        return dict(
            BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8, num_warps=warps, num_stages=stages
        )
    if M <= 256:
        return dict(
            BLOCK_M=16,
            BLOCK_N=32 if N <= 512 else 64,
            BLOCK_K=bk,
            GROUP_M=8,
            num_warps=4,
            num_stages=4,
        )
    if M <= 4096:
        return dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=bk, GROUP_M=8, num_warps=4, num_stages=4)
    if N >= 1024:
        return dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=bk, GROUP_M=8, num_warps=8, num_stages=3)
    return dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=bk, GROUP_M=8, num_warps=8, num_stages=4)


def grid_size(M: int, N: int, cfg: dict) -> int:
    return triton.cdiv(M, cfg["BLOCK_M"]) * triton.cdiv(N, cfg["BLOCK_N"])


def launch_linear(
    a,
    a_amax,
    w,
    ws,
    b,
    r,
    lnw,
    lnb,
    y,
    amax_out,
    M,
    N,
    K,
    *,
    quant,
    act="none",
    static_amax=0.0,
    eps=1e-12,
    ln=False,
    amax_out_mode=0,
    cfg=None,
    pdl=False,
    a_zp=None,
    colsum=None,
    yq=None,
    yq_scale=None,
    yq_zp=None,
    q_mode="dynamic",
    q_shift=None,
    q_mul=None,
    q_static_amax=0.0,
):
    """Launch on the current stream. Arguments are torch tensors (or anything Triton accepts).

    quant 4 with a_zp / colsum: A is the asymmetric copy (q_u8 - 128). yq (LN mode): also
    write the per-token int8 copy of y for the next linear, in q_mode ("dynamic", "static",
    "dynamic_asym"), a_scale into yq_scale, zp into yq_zp, after q_shift / q_mul."""
    cfg = cfg or pick_config(M, N, K, quant != 0, ln)
    if ln:
        assert cfg["BLOCK_N"] >= N, "LN epilogue needs whole rows in one program"
    assert yq is None or (ln and yq_scale is not None), "Q_OUT needs LN mode and yq_scale"
    asym = quant == 4 and a_zp is not None
    assert not asym or colsum is not None
    qmode = (QMODES[q_mode] if isinstance(q_mode, str) else int(q_mode)) if yq is not None else 0
    assert qmode != 3 or yq_zp is not None
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
        lnw if lnw is not None else dummy,
        lnb if lnb is not None else dummy,
        y,
        amax_out if amax_out is not None else dummy,
        yq if yq is not None else y,
        yq_scale if yq_scale is not None else dummy,
        yq_zp if yq_zp is not None else dummy,
        q_shift if q_shift is not None else dummy,
        q_mul if q_mul is not None else dummy,
        M,
        N,
        K,
        a.stride(0),
        r.stride(0) if r is not None else 0,
        y.stride(0),
        yq.stride(0) if yq is not None else 0,
        float(static_amax),
        float(eps),
        float(q_static_amax),
        QUANT=quant,
        ASYM=asym,
        ACT=ACTS[act] if isinstance(act, str) else act,
        HAS_RES=r is not None,
        LN=ln,
        AMAX_OUT=amax_out_mode,
        Q_OUT=qmode,
        Q_SHIFT=q_shift is not None,
        Q_MUL=q_mul is not None,
        PDL=pdl,
        launch_pdl=pdl,
        **cfg,
    )
