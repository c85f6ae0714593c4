"""sparse_pool: SPLADE's pooling of the MLM logits, a segmented max-reduction on the GPU:
p[b, v] = log1p(relu(max over the tokens t of sequence b of x[t, v])) (max and log1p(relu)
commute: both monotone), fp32 [B, V].

``GEMM`` 1 (what the plan runs): x is not stored anywhere. The kernel IS the MLM decoder
linear (kernels/linear.py ``gemm_tile``: every precision of that kernel, fp16 / INT8 / FP8,
the same numerics) with the max over tokens in its epilogue: a program owns (sequence,
BLOCK_V vocab columns), walks the sequence's rows in BLOCK_R-row tiles (one GEMM tile
each, fp32) and keeps the running max in registers, so the arena holds the [B, V] result
only, never [T, V] logits (6 T V bytes before: fp16 logits + an fp32 [T, V]-sized output).
A tile never spans two sequences (its rows are clamped to the sequence), so there is no
atomic and no zeroing, and the result is deterministic.
``GEMM`` 0: x is given, fp16 [T, V] (the unfused path: the plan's fallback when the logits
are needed elsewhere).

Grid (programs over sequences, vocab blocks of BLOCK_V); programs stride over the B of the
call header (one captured graph serves every batch size). NaN in a sequence's logits comes
out NaN (NaN-propagating maxima: the engine refuses non-finite outputs), an empty sequence
gives zeros.
"""

from __future__ import annotations

import triton
import triton.language as tl

from zoi.backends.cuda.kernels.common import ACTS, colmax_nan
from zoi.backends.cuda.kernels.linear import gemm_tile
from zoi.backends.cuda.kernels.pdl import pdl_begin


@triton.jit
def sparse_pool_kernel(
    x_ptr,  # GEMM 0: [T, V] fp16 logits; GEMM 1: A [T, K] of the decoder (linear.py's a_ptr)
    a_amax_ptr,  # GEMM 1: linear.py's (per-row amax / a_scale of A)
    a_zp_ptr,  # GEMM 1, ASYM: [T] int32 zero point of A
    colsum_ptr,  # GEMM 1, ASYM: [V] int32
    w_ptr,  # GEMM 1: W [V, K] (fp16, int8 or fp8)
    ws_ptr,  # GEMM 1: [V] fp32 weight scale (quantised W)
    b_ptr,  # GEMM 1: [V] fp32 bias
    cu_ptr,  # [B + 1] int32
    hdr_ptr,  # [>=3] int32 call header: [normalize flag, B, T]
    p_ptr,  # [B, V] fp32 out, row stride ldp
    V,
    K,  # GEMM 1
    ldx,  # row stride of x (GEMM 0) / A (GEMM 1)
    ldp,
    static_amax,  # GEMM 1, QUANT 2
    BLOCK_R: tl.constexpr,
    BLOCK_V: tl.constexpr,
    PDL: tl.constexpr,
    GEMM: tl.constexpr = False,
    QUANT: tl.constexpr = 0,  # GEMM 1: linear.py's QUANT, ASYM, ACT
    ASYM: tl.constexpr = False,
    ACT: tl.constexpr = 0,
    BLOCK_K: tl.constexpr = 64,
):
    pdl_begin(PDL)  # programmatic dependent launch: wait for the previous kernel's writes
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
            r_ok = rows < e
            m2 = r_ok[:, None] & c_ok[None, :]
            if GEMM:  # rows clamped into the sequence (in bounds; masked below)
                y = gemm_tile(
                    x_ptr, a_amax_ptr, a_zp_ptr, colsum_ptr, w_ptr, ws_ptr, b_ptr,
                    tl.where(r_ok, rows, s), cols, c_ok, K, ldx, static_amax, QUANT, ASYM, ACT,
                    BLOCK_R, BLOCK_V, BLOCK_K,
                )  # fmt: skip
            else:
                y = tl.load(
                    x_ptr + rows[:, None].to(tl.int64) * ldx + cols[None, :], mask=m2, other=0
                ).to(tl.float32)
            x = tl.where(m2, y, float("-inf"))
            acc = tl.maximum(acc, x, propagate_nan=tl.PropagateNan.ALL)
        m = tl.maximum(colmax_nan(acc), 0.0, propagate_nan=tl.PropagateNan.ALL)
        u = 1.0 + m  # log1p(m) = log(u) * m / (u - 1), accurate for small m (Goldberg)
        v = tl.where(u == 1.0, m, tl.log(u) * (m / tl.where(u == 1.0, 1.0, u - 1.0)))
        v = tl.where(e > s, v, 0.0)
        tl.store(p_ptr + b * ldp + cols, v, mask=c_ok)


def pick_config(V: int) -> dict:
    """GEMM 0: wide vocab blocks, many rows per load."""
    bv = min(1024, triton.next_power_of_2(max(V, 16)))
    return dict(BLOCK_R=max(1, min(16, 4096 // bv)), BLOCK_V=bv, num_warps=4)


def pick_gemm_config(T: int, V: int, quant: bool) -> dict:
    """GEMM 1: the small-M tiles of linear.pick_config (16-row mma tiles, narrow vocab tiles:
    many programs share the weight reads). A tile is one sequence's: a short sequence wastes
    the rest of its last tile, so the rows stay at 16 below 1024-token buckets. Not swept on
    the H200 yet (lab/gpu/sweep_linear.py has no SPLADE shape)."""
    return dict(
        BLOCK_R=16 if T < 1024 else 32,
        BLOCK_V=64 if V > 32 else max(16, triton.next_power_of_2(V)),
        BLOCK_K=128 if quant else 64,
        num_warps=4,
        num_stages=3,
    )


def _grid(n_seq, V, cfg, programs=2048):
    """(programs over sequences, vocab blocks): about `programs` in all (a vocab of 30522 has
    477 blocks of 64: 4 programs per block stride over the sequences; more would idle, and
    cost the interpreter a run each)."""
    n_v = triton.cdiv(V, cfg["BLOCK_V"])
    return (max(1, min(n_seq, 256, triton.cdiv(programs, n_v))), n_v)


def launch_sparse_pool(x, cu, hdr, p, n_seq, V, cfg=None, pdl=False):
    """x fp16 [T, V] logits -> p fp32 [>= B, V] (rows < B of the header written)."""
    cfg = cfg or pick_config(V)
    sparse_pool_kernel[_grid(n_seq, V, cfg)](
        x, x, x, x, x, x, x, cu, hdr, p, V, 0, x.stride(0), p.stride(0), 0.0,
        PDL=pdl, launch_pdl=pdl, **cfg,
    )  # fmt: skip


def launch_splade_linear(
    a,
    a_amax,
    w,
    ws,
    b,
    cu,
    hdr,
    p,
    T,
    n_seq,
    V,
    K,
    *,
    quant,
    act="none",
    static_amax=0.0,
    a_zp=None,
    colsum=None,
    cfg=None,
    pdl=False,
):
    """The decoder linear fused with the pooling: p[b] = log1p(relu(max over the rows t of
    sequence b of act(a[t] @ w.T + b))), fp32 [>= B, V]; a, a_amax, w, ws, quant, a_zp,
    colsum, static_amax as linear.launch_linear's (T: the bucket, for the config)."""
    cfg = cfg or pick_gemm_config(T, V, quant != 0)
    asym = quant == 4 and a_zp is not None
    assert not asym or colsum is not None
    sparse_pool_kernel[_grid(n_seq, V, cfg)](
        a,
        a_amax if a_amax is not None else b,
        a_zp if a_zp is not None else b,
        colsum if colsum is not None else b,
        w,
        ws if ws is not None else b,
        b,
        cu,
        hdr,
        p,
        V,
        K,
        a.stride(0),
        p.stride(0),
        float(static_amax),
        GEMM=True,
        QUANT=quant,
        ASYM=asym,
        ACT=ACTS[act] if isinstance(act, str) else act,
        PDL=pdl,
        launch_pdl=pdl,
        **cfg,
    )
