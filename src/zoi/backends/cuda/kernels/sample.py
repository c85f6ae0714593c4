"""Embedding gather and the fused sampling step of the GPU decoder.

``sample_kernel`` (grid B, one program per sequence, looping over the vocabulary in BLOCK_V
chunks of the fp32 logits row):

* greedy (temperature <= 0): argmax, lowest id on ties;
* otherwise logits / temperature, then top-k and top-p as thresholds: the kept set is
  {x >= t}, t found by bisection over the order-preserving int32 keys of the fp32 logits (exact,
  <= 32 passes each): top-k's t is the largest with count(x >= t) >= k (ties to the k-th value
  kept, as transformers' TopKLogitsWarper), top-p's the largest with mass(x >= t) >= p * mass of
  the top-k set (the smallest top set reaching p, as TopPLogitsWarper, ties kept);
* the token is drawn by the Gumbel-max trick, argmax(x / T + g) over the kept set, g = -log(-log u)
  with u = tl.rand(Philox) keyed by (seed, step) and the token id: the same seed, prompt and
  params give the same tokens, whatever the batch (``NOISE_IN``: u read from a buffer, the
  tests' seam to compare with numpy).

Top-k / top-p cost up to 64 extra passes over the row (the L2-resident logits); greedy and pure
temperature sampling are one and two passes.
"""

from __future__ import annotations

import triton
import triton.language as tl

from zoi.backends.cuda.kernels.pdl import pdl_begin


@triton.jit
def embed_kernel(
    ids_ptr,
    fb_ptr,  # [T] int32 (FEEDBACK): >= 0: take row fb[t]'s token of the previous step instead
    prev_ptr,  # [*] int32 the previous decode step's sampled tokens (FEEDBACK)
    emb_ptr,
    h_ptr,
    Hd,
    ldh,
    BLOCK: tl.constexpr,
    FEEDBACK: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_begin(PDL)
    t = tl.program_id(0)
    i = tl.load(ids_ptr + t)
    if FEEDBACK:
        f = tl.load(fb_ptr + t)
        if f >= 0:
            i = tl.load(prev_ptr + f)
    i = i.to(tl.int64)
    for c in range(0, Hd, BLOCK):
        o = c + tl.arange(0, BLOCK)
        m = o < Hd
        x = tl.load(emb_ptr + i * Hd + o, mask=m, other=0.0)
        tl.store(h_ptr + t.to(tl.int64) * ldh + o, x.to(h_ptr.dtype.element_ty), mask=m)


def embed(ids, emb, h, T: int, pdl: bool = False, fb=None, prev=None):
    """h[t] = emb[ids[t]]; with fb / prev (device int32): emb[prev[fb[t]]] where fb[t] >= 0 (a
    decode step launched before the host has read the previous step's tokens)."""
    Hd = emb.shape[1]
    embed_kernel[(T,)](
        ids,
        fb if fb is not None else ids,
        prev if prev is not None else ids,
        emb,
        h,
        Hd,
        h.stride(0),
        BLOCK=min(1024, triton.next_power_of_2(Hd)),
        FEEDBACK=fb is not None,
        PDL=pdl,
        launch_pdl=pdl,
    )


@triton.jit
def _key(x):
    b = x.to(tl.int32, bitcast=True)
    return (b ^ ((b >> 31) & 0x7FFFFFFF)).to(tl.int64)


@triton.jit
def _count_ge(row, V, t, BLOCK_V: tl.constexpr):
    n = 0
    for v0 in range(0, V, BLOCK_V):
        o = v0 + tl.arange(0, BLOCK_V)
        x = tl.load(row + o, mask=o < V, other=float("-inf"))
        n += tl.sum(((_key(x) >= t) & (o < V)).to(tl.int32), 0)
    return n


@triton.jit
def _mass_ge(row, V, t, top, inv_t, BLOCK_V: tl.constexpr):
    z = 0.0
    for v0 in range(0, V, BLOCK_V):
        o = v0 + tl.arange(0, BLOCK_V)
        x = tl.load(row + o, mask=o < V, other=float("-inf"))
        e = tl.exp((x - top) * inv_t)
        z += tl.sum(tl.where((_key(x) >= t) & (o < V), e, 0.0), 0)
    return z


@triton.jit
def _scores(x, o, ok, temp, inv_t, seed64, noise_row, NOISE_IN: tl.constexpr):
    """The values argmax'ed over columns o (x: the logits there): x (greedy) or x / T + Gumbel
    noise."""
    if temp > 0:
        if NOISE_IN:
            u = tl.load(noise_row + o, mask=ok, other=0.5)
        else:
            u = tl.rand(seed64, o)
        u = tl.maximum(u, 1e-30)
        x = x * inv_t - tl.log(-tl.log(u))
    return tl.where(ok, x, float("-inf"))


@triton.jit
def sample_kernel(
    logits_ptr,  # [B, V] fp32, row stride ldl
    ldl,
    V,
    temp_ptr,  # [B] fp32 (<= 0: greedy)
    topk_ptr,  # [B] int32 (0: off)
    topp_ptr,  # [B] fp32 (>= 1: off)
    seed_ptr,  # [B] int32
    step_ptr,  # [B] int32 (the token's index in the sequence's output)
    noise_ptr,  # [B, V] fp32 uniforms (NOISE_IN)
    out_ptr,  # [B] int32 tokens
    pv_ptr,  # [B, S] fp32 the chunks' best scores (S > 1)
    pi_ptr,  # [B, S] int32 their columns
    cnt_ptr,  # [B] int32 arrivals per row (zero, and left zero)
    chunk,  # columns per program of a split row (a multiple of BLOCK_V)
    BLOCK_V: tl.constexpr,
    BLOCK_S: tl.constexpr,
    NOISE_IN: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_begin(PDL)
    b = tl.program_id(0)
    sp = tl.program_id(1)
    S = tl.num_programs(1)
    row = logits_ptr + b.to(tl.int64) * ldl
    noise_row = noise_ptr + b.to(tl.int64) * V
    temp = tl.load(temp_ptr + b)
    k = tl.load(topk_ptr + b)
    p = tl.load(topp_ptr + b)
    inv_t = 1.0 / tl.where(temp > 0, temp, 1.0)
    seed = tl.load(seed_ptr + b).to(tl.uint32).to(tl.uint64)
    step = tl.load(step_ptr + b).to(tl.uint32).to(tl.uint64)
    seed64 = (step << 32) | seed
    if (temp <= 0) | (((k <= 0) | (k >= V)) & (p >= 1.0)):
        # greedy or plain temperature: an argmax, split over S programs per row; per-lane
        # running bests (no cross-lane reduction inside the loop), lowest column on ties
        lo = sp * chunk
        hi = tl.minimum(lo + chunk, V)
        bv = tl.full([BLOCK_V], float("-inf"), tl.float32)
        bi = tl.full([BLOCK_V], 2147483647, tl.int32)
        for v0 in range(lo, hi, BLOCK_V):
            o = v0 + tl.arange(0, BLOCK_V)
            x = tl.load(row + o, mask=o < hi, other=float("-inf"))
            sc = _scores(x, o, o < hi, temp, inv_t, seed64, noise_row, NOISE_IN)
            up = sc > bv
            bi = tl.where(up, o, bi)
            bv = tl.where(up, sc, bv)
        best = tl.max(bv, 0)
        arg = tl.min(tl.where(bv == best, bi, 2147483647), 0)
        if S == 1:
            tl.store(out_ptr + b, tl.where(best == float("-inf"), 0, arg))
        else:
            tl.store(pv_ptr + b * S + sp, best)
            tl.store(pi_ptr + b * S + sp, arg)
            tl.debug_barrier()
            seen = tl.atomic_add(cnt_ptr + b, 1)  # acq_rel, gpu scope
            if seen == S - 1:  # the last chunk in merges the row's S bests
                j = tl.arange(0, BLOCK_S)
                v = tl.load(
                    pv_ptr + b * S + j, mask=j < S, other=float("-inf"), cache_modifier=".cg"
                )
                c = tl.load(pi_ptr + b * S + j, mask=j < S, other=2147483647, cache_modifier=".cg")
                best = tl.max(v, 0)
                arg = tl.min(tl.where(v == best, c, 2147483647), 0)
                tl.store(out_ptr + b, tl.where(best == float("-inf"), 0, arg))
                tl.store(cnt_ptr + b, 0)
    elif sp == 0:  # top-k / top-p: thresholds over the whole row, one program
        tl.store(out_ptr + b, _sample_row(row, V, temp, k, p, seed64, noise_row, BLOCK_V, NOISE_IN))


@triton.jit
def _sample_row(
    row, V, temp, k, p, seed64, noise_row, BLOCK_V: tl.constexpr, NOISE_IN: tl.constexpr
):
    """temperature + top-k / top-p thresholds (bisection over the int keys) + Gumbel-max."""
    best = float("-inf")
    low = float("inf")
    arg = 0
    for v0 in range(0, V, BLOCK_V):
        o = v0 + tl.arange(0, BLOCK_V)
        x = tl.load(row + o, mask=o < V, other=float("-inf"))
        cm = tl.max(x, 0)
        ci = tl.argmax(x, 0, tie_break_left=True)
        if cm > best:
            best = cm
            arg = v0 + ci
        low = tl.minimum(low, tl.min(tl.where(o < V, x, float("inf")), 0))
    tok = arg
    inv_t = 1.0 / temp
    top_key = _key(best)
    tk = _key(low)
    if (k > 0) & (k < V):
        lo = tk
        hi = top_key + 1
        for _ in range(33):
            if hi - lo > 1:
                mid = lo + (hi - lo) // 2
                if _count_ge(row, V, mid, BLOCK_V) >= k:
                    lo = mid
                else:
                    hi = mid
        tk = lo
    tp = tk
    if p < 1.0:
        goal = p * _mass_ge(row, V, tk, best, inv_t, BLOCK_V)
        lo = tk
        hi = top_key + 1
        for _ in range(33):
            if hi - lo > 1:
                mid = lo + (hi - lo) // 2
                if _mass_ge(row, V, mid, best, inv_t, BLOCK_V) >= goal:
                    lo = mid
                else:
                    hi = mid
        tp = lo
    gbest = float("-inf")
    for v0 in range(0, V, BLOCK_V):
        o = v0 + tl.arange(0, BLOCK_V)
        x = tl.load(row + o, mask=o < V, other=float("-inf"))
        sc = _scores(x, o, o < V, temp, inv_t, seed64, noise_row, NOISE_IN)
        sc = tl.where(_key(x) >= tp, sc, float("-inf"))
        cm = tl.max(sc, 0)
        ci = tl.argmax(sc, 0, tie_break_left=True)
        if cm > gbest:
            gbest = cm
            tok = v0 + ci
    return tok


def sample_splits(V: int, block_v: int = 4096, max_splits: int = 64) -> tuple[int, int]:
    """(programs per row, columns per program) of the split argmax: one BLOCK_V step each where
    the vocabulary allows, at most max_splits."""
    bv = min(block_v, triton.next_power_of_2(V))
    steps = triton.cdiv(V, bv)
    chunk = bv * triton.cdiv(steps, min(steps, max_splits))
    return triton.cdiv(V, chunk), chunk


def sample(
    logits,
    V: int,
    B: int,
    temp,
    topk,
    topp,
    seed,
    step,
    out,
    noise=None,
    block_v: int = 4096,
    pdl: bool = False,
    ws=None,
):
    """ws: (fp32 [B * S], int32 [B * S], int32 [B] zeros) for the split argmax of greedy /
    plain-temperature rows (S from sample_splits); None: one program per row."""
    bv = min(block_v, triton.next_power_of_2(V))
    S, chunk = sample_splits(V, bv) if ws is not None else (1, V)
    if ws is not None and (ws[0].numel() < B * S or ws[2].numel() < B):
        raise ValueError(f"sample workspace under B={B} x S={S}: size it with sample_splits()")
    pv, pi, cnt = ws if ws is not None else (logits, out, out)
    sample_kernel[(B, S)](
        logits,
        logits.stride(0),
        V,
        temp,
        topk,
        topp,
        seed,
        step,
        noise if noise is not None else logits,
        out,
        pv,
        pi,
        cnt,
        chunk,
        BLOCK_V=bv,
        BLOCK_S=triton.next_power_of_2(S),
        NOISE_IN=noise is not None,
        PDL=pdl,
        num_warps=8,
        launch_pdl=pdl,
    )
