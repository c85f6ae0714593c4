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

from zoi.decoder.cuda.pdl import pdl_begin


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
    BLOCK_V: tl.constexpr,
    NOISE_IN: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_begin(PDL)
    b = tl.program_id(0)
    row = logits_ptr + b.to(tl.int64) * ldl
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
    temp = tl.load(temp_ptr + b)
    tok = arg
    if temp > 0:
        inv_t = 1.0 / temp
        k = tl.load(topk_ptr + b)
        p = tl.load(topp_ptr + b)
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
        seed = tl.load(seed_ptr + b).to(tl.uint32).to(tl.uint64)
        step = tl.load(step_ptr + b).to(tl.uint32).to(tl.uint64)
        seed64 = (step << 32) | seed
        gbest = float("-inf")
        for v0 in range(0, V, BLOCK_V):
            o = v0 + tl.arange(0, BLOCK_V)
            x = tl.load(row + o, mask=o < V, other=float("-inf"))
            if NOISE_IN:
                u = tl.load(noise_ptr + b.to(tl.int64) * V + o, mask=o < V, other=0.5)
            else:
                u = tl.rand(seed64, o)
            u = tl.maximum(u, 1e-30)
            sc = x * inv_t - tl.log(-tl.log(u))
            sc = tl.where((_key(x) >= tp) & (o < V), sc, float("-inf"))
            cm = tl.max(sc, 0)
            ci = tl.argmax(sc, 0, tie_break_left=True)
            if cm > gbest:
                gbest = cm
                tok = v0 + ci
    tl.store(out_ptr + b, tok)


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
):
    sample_kernel[(B,)](
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
        BLOCK_V=min(block_v, triton.next_power_of_2(V)),
        NOISE_IN=noise is not None,
        PDL=pdl,
        num_warps=8,
        launch_pdl=pdl,
    )
