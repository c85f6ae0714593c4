"""The golden engine: a readable numpy implementation of every IR op (float32 or float64).

Every backend is tested against these functions, the reference backend
(zoi.backends.reference) runs them, and the quantiser (zoi.quant) runs the model through
`execute` (with taps on every linear). INT8 linears run through `zoi.numerics.primitives`
(integer-exact emulation) so INT8 numerics are testable anywhere. Imports nothing of zoi
but `zoi.numerics` (docs/ARCHITECTURE.md): `execute` takes any graph of IR ops.
"""

from __future__ import annotations

import math

import numpy as np

from zoi.numerics import fp8 as qf8
from zoi.numerics import primitives as qp

_SQRT1_2 = 1.0 / math.sqrt(2.0)


def _erf(x: np.ndarray) -> np.ndarray:
    try:
        from scipy.special import erf  # optional, exact

        return erf(x)
    except ImportError:  # vectorised math.erf: exact to double precision
        return np.vectorize(math.erf, otypes=[np.float64])(x).astype(x.dtype)


def _fma32(a: np.ndarray, b, c) -> np.ndarray:
    """float32 fused multiply-add (one rounding; the product is exact in float64)."""
    return (a.astype(np.float64) * np.float64(np.float32(b)) + np.float64(np.float32(c))).astype(
        np.float32
    )


def _fma32v(a: np.ndarray, b: np.ndarray, c) -> np.ndarray:
    return (a.astype(np.float64) * b.astype(np.float64) + np.float64(np.float32(c))).astype(
        np.float32
    )


def erf_f32(a: np.ndarray) -> np.ndarray:
    """erf in float32 as zoi's kernels compute it (csrc/kernels/simd.h `verf`): the odd/even
    rational minimax fit on [-4, 4] of Eigen's generic_fast_erf_float, a few ulp from erf,
    evaluated with fused multiply-adds. The float32 contract of GELU, so INT8 kernels can
    reproduce the emulation's requantisation exactly; float64 runs use the exact erf."""
    x = np.clip(a.astype(np.float32), np.float32(-4), np.float32(4))
    x2 = (x * x).astype(np.float32)
    p = _fma32(x2, -2.72614225801306e-10, 2.77068142495902e-08)
    for c in (
        -2.10102402082508e-06,
        -5.69250639462346e-05,
        -7.34990630326855e-04,
        -2.95459980854025e-03,
        -1.60960333262415e-02,
    ):
        p = _fma32v(x2, p, c)
    p = (x * p).astype(np.float32)
    q = _fma32(x2, -1.45660718464996e-05, -2.13374055278905e-04)
    for c in (-1.68282697438203e-03, -7.37332916720468e-03, -1.42647390514189e-02):
        q = _fma32v(x2, q, c)
    return (p / q).astype(np.float32)


def activation(x: np.ndarray, act: str) -> np.ndarray:
    if act == "none":
        return x
    if act == "gelu":  # erf form, as BERT: (0.5 x)(1 + erf(x / sqrt 2))
        if x.dtype == np.float32:
            e = erf_f32((x * np.float32(_SQRT1_2)).astype(np.float32))
            return ((np.float32(0.5) * x) * (np.float32(1) + e)).astype(np.float32)
        return (0.5 * x * (1.0 + _erf(x * _SQRT1_2))).astype(x.dtype)
    if act == "gelu_tanh":
        c = math.sqrt(2.0 / math.pi)
        return (0.5 * x * (1.0 + np.tanh(c * (x + 0.044715 * x**3)))).astype(x.dtype)
    if act == "relu":
        return np.maximum(x, 0)
    if act == "sigmoid":
        return (1.0 / (1.0 + np.exp(-x))).astype(x.dtype)
    if act == "tanh":  # BERT's pooler, the RoBERTa classification head
        return np.tanh(x).astype(x.dtype)
    if act == "silu":  # x * sigmoid(x) (SwiGLU's gate: Llama, Qwen)
        return (x / (1.0 + np.exp(-x))).astype(x.dtype)
    raise ValueError(f"unknown activation {act!r}")


def layernorm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    return ((x - mu) / np.sqrt(var + eps) * w + b).astype(x.dtype)


def rmsnorm(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, eps: float) -> np.ndarray:
    """x / sqrt(mean(x^2) + eps) * w (+ b): transformers' RMSNorm (Llama, Qwen, Gemma3 with
    its 1 + w folded into w at load)."""
    ms = (x * x).mean(axis=-1, keepdims=True)
    y = x / np.sqrt(ms + x.dtype.type(eps)) * w.astype(x.dtype)
    return (y + b.astype(x.dtype) if b is not None else y).astype(x.dtype)


def embed(ids, positions, word, pos, ln_w, ln_b, eps, type_=None, dtype=np.float32) -> np.ndarray:
    """x[T,H] = LN(word[ids] + pos[positions] + type[0])."""
    return embed_rows(word[ids], positions, pos, ln_w, ln_b, eps, type_, dtype)


def embed_rows(
    word_rows,
    positions,
    pos,
    ln_w,
    ln_b,
    eps,
    type_=None,
    dtype=np.float32,
    types=None,
    type_delta=None,
) -> np.ndarray:
    """embed() with the word rows already gathered (float or dequantised INT8 table);
    types: int32[T] token types (pairs, heads), else row 0 of the type table for every token;
    type_delta [T, H]: the task adapters' term of each token's type row (lora_type), or None."""
    x = word_rows.astype(dtype)
    if pos is not None:  # ModernBERT has no position table (RoPE in attention)
        x = x + pos[positions].astype(dtype)
    if type_ is not None:
        x = x + (type_[0] if types is None else type_[np.asarray(types)]).astype(dtype)
    if type_delta is not None:
        x = x + type_delta.astype(dtype)
    if ln_w is None:  # decoder architectures: no embedding norm
        return x
    return layernorm(x, ln_w.astype(dtype), ln_b.astype(dtype), eps)


def linear(x, w, b, act="none", residual=None) -> np.ndarray:
    """y = act(x @ w.T + b) (+ residual). x [T,K], w [N,K]."""
    y = x @ w.T.astype(x.dtype)
    if b is not None:
        y = y + b.astype(x.dtype)
    y = activation(y, act)
    if residual is not None:
        y = y + residual
    return y.astype(x.dtype)


def task_rows(tasks, cu_seqlens) -> dict[int, np.ndarray]:
    """{task: the token rows of its sequences} of per-sequence task ids (-1: no adapter)."""
    cu = np.asarray(cu_seqlens)
    tasks = np.asarray(tasks)
    out: dict[int, np.ndarray] = {}
    for t in np.unique(tasks[tasks >= 0]):
        seqs = np.flatnonzero(tasks == t)
        out[int(t)] = np.concatenate([np.arange(cu[s], cu[s + 1]) for s in seqs])
    return out


def lora_delta(x: np.ndarray, a: np.ndarray, b: np.ndarray, tasks, cu_seqlens) -> np.ndarray:
    """The task adapters' term of a linear (before its activation): the rows of sequence s get
    (x A_t^T) B_t^T with t = tasks[s] (a [n, r, K], b [n, N, r]: s * B, zoi.frontend.adapters);
    rows of a sequence with task -1 get 0."""
    d = np.zeros((x.shape[0], b.shape[1]), x.dtype)
    for t, rows in task_rows(tasks, cu_seqlens).items():
        xa = x[rows] @ a[t].T.astype(x.dtype)
        d[rows] = xa @ b[t].T.astype(x.dtype)
    return d


def lora_embed(ids, a: np.ndarray, b: np.ndarray, ltype, tasks, cu_seqlens, dtype):
    """(word delta, type delta) [T, H] of the embedding's adapters: A_t[ids] B_t (s folded into
    b) and lora_type[t] for each token of a sequence with task t; zeros for task -1."""
    ids = np.asarray(ids)
    dw = np.zeros((len(ids), b.shape[2]), dtype)
    dt = np.zeros_like(dw) if ltype is not None else None
    for t, rows in task_rows(tasks, cu_seqlens).items():
        dw[rows] = a[t][ids[rows]].astype(dtype) @ b[t].astype(dtype)
        if dt is not None:
            dt[rows] = ltype[t].astype(dtype)
    return dw, dt


def rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Rotary embedding of x [heads, L, d] at positions 0..L-1 (transformers' rotate_half form):
    x * cos + rotate_half(x) * sin, cos / sin [>= L, d/2] (the tables of zoi.frontend.archs)."""
    L, h = x.shape[1], x.shape[2] // 2
    c = np.concatenate([cos[:L], cos[:L]], axis=1).astype(x.dtype)
    s = np.concatenate([sin[:L], sin[:L]], axis=1).astype(x.dtype)
    rot = np.concatenate([-x[..., h:], x[..., :h]], axis=-1)
    return (x * c + rot * s).astype(x.dtype)


def attention(
    qkv: np.ndarray,
    cu_seqlens: np.ndarray,
    heads: int,
    head_dim: int,
    scale: float,
    bias: np.ndarray | None = None,
    window: int = 0,
    rope_cs: tuple[np.ndarray, np.ndarray] | None = None,
    kv_heads: int = 0,
    causal: bool = False,
    qk_norm: tuple[np.ndarray, np.ndarray, float] | None = None,
    key_lens: np.ndarray | None = None,
) -> np.ndarray:
    """Varlen self-attention over packed sequences. qkv [T, (heads + 2 kv_heads) d] -> ctx
    [T, heads d].

    key_lens [B] (not an IR attribute: zoi.heads.multivector's ColBERT queries whose [MASK]
    expansion tokens no token attends to, as an attention mask of 0 does in transformers):
    every query of sequence s sees only its first key_lens[s] keys.

    bias [heads, 2P-1] (MPNet's relative position bias): scores[h, i, j] += bias[h, j - i + P - 1];
    window > 0 (ModernBERT's local layers, sliding-window layers): key j is seen by query i only
    when |i - j| <= window; causal: only when j <= i; kv_heads (0: heads): head h reads KV head
    h // (heads / kv_heads); qk_norm (w_q, w_k, eps): RMSNorm of each q / k head first;
    rope_cs (cos, sin) [P, d/2]: q and k rotated (RoPE at the position in the sequence)."""
    H = heads * head_dim
    kvh = kv_heads or heads
    KV = kvh * head_dim
    rep = heads // kvh
    out = np.empty((qkv.shape[0], H), dtype=qkv.dtype)
    for s in range(len(cu_seqlens) - 1):
        a, e = int(cu_seqlens[s]), int(cu_seqlens[s + 1])
        q = qkv[a:e, :H].reshape(e - a, heads, head_dim).transpose(1, 0, 2)
        k = qkv[a:e, H : H + KV].reshape(e - a, kvh, head_dim).transpose(1, 0, 2)
        v = qkv[a:e, H + KV : H + 2 * KV].reshape(e - a, kvh, head_dim).transpose(1, 0, 2)
        if rep > 1:
            k, v = np.repeat(k, rep, axis=0), np.repeat(v, rep, axis=0)
        if qk_norm is not None:
            q = rmsnorm(q, qk_norm[0], None, qk_norm[2])
            k = rmsnorm(k, qk_norm[1], None, qk_norm[2])
        if rope_cs is not None:
            q, k = rope(q, *rope_cs), rope(k, *rope_cs)
        sc = (q @ k.transpose(0, 2, 1)) * qkv.dtype.type(scale)
        ij = np.arange(e - a)[None, :] - np.arange(e - a)[:, None]  # j - i
        if bias is not None:
            P = (bias.shape[1] + 1) // 2
            sc = sc + bias[:, ij + P - 1].astype(sc.dtype)
        if window > 0:
            sc = np.where(np.abs(ij) <= window, sc, sc.dtype.type(-np.inf))
        if causal:
            sc = np.where(ij <= 0, sc, sc.dtype.type(-np.inf))
        if key_lens is not None:
            seen = np.arange(e - a)[None, :] < int(key_lens[s])
            sc = np.where(seen, sc, sc.dtype.type(-np.inf))
        sc = sc - sc.max(axis=-1, keepdims=True)
        p = np.exp(sc)
        p = p / p.sum(axis=-1, keepdims=True)
        out[a:e] = (p @ v).transpose(1, 0, 2).reshape(e - a, H)
    return out


def attention_paged(
    qkv: np.ndarray,
    cu_seqlens: np.ndarray,
    positions: np.ndarray,
    heads: int,
    head_dim: int,
    scale: float,
    cache,
    layer: int,
    rope_cs: tuple[np.ndarray, np.ndarray] | None = None,
    kv_heads: int = 0,
    qk_norm: tuple[np.ndarray, np.ndarray, float] | None = None,
    causal: bool = True,
    window: int = 0,
    bias: np.ndarray | None = None,
) -> np.ndarray:
    """The `attention` op with attribute `paged` (generation): sequence s's tokens sit at the
    absolute positions `positions[cu[s]:cu[s+1]]` of the sequence whose block table is
    cache.tables[s]; their q and k are normed / rotated at those positions, their K and V
    written to the cache (cache.write(layer, table, pos, k, v)), and each query attends to every
    cached position up to its own (cache.read(layer, table, n): K, V [n, kv_heads, d])."""
    if not causal or window or bias is not None:
        raise ValueError(
            "paged attention is causal over every cached position (no window, no bias)"
        )
    H, kvh = heads * head_dim, kv_heads or heads
    KV, rep = kvh * head_dim, heads // (kv_heads or heads)
    out = np.empty((qkv.shape[0], H), dtype=qkv.dtype)
    for s in range(len(cu_seqlens) - 1):
        a, e = int(cu_seqlens[s]), int(cu_seqlens[s + 1])
        pos = np.asarray(positions[a:e], np.int64)
        q = qkv[a:e, :H].reshape(e - a, heads, head_dim).transpose(1, 0, 2)
        k = qkv[a:e, H : H + KV].reshape(e - a, kvh, head_dim).transpose(1, 0, 2)
        v = qkv[a:e, H + KV : H + 2 * KV].reshape(e - a, kvh, head_dim)
        if qk_norm is not None:
            q = rmsnorm(q, qk_norm[0], None, qk_norm[2])
            k = rmsnorm(k, qk_norm[1], None, qk_norm[2])
        if rope_cs is not None:  # the table's rows at the absolute positions
            cs = (rope_cs[0][pos], rope_cs[1][pos])
            q, k = rope(q, *cs), rope(k, *cs)
        table = cache.tables[s]
        cache.write(layer, table, pos, k.transpose(1, 0, 2), v)
        K, V = cache.read(layer, table, int(pos[-1]) + 1)  # [n, kv_heads, d]
        K = np.repeat(K.transpose(1, 0, 2), rep, axis=0).astype(qkv.dtype)  # [heads, n, d]
        V = np.repeat(V.transpose(1, 0, 2), rep, axis=0).astype(qkv.dtype)
        sc = (q @ K.transpose(0, 2, 1)) * qkv.dtype.type(scale)  # [heads, e - a, n]
        seen = np.arange(K.shape[1])[None, :] <= pos[:, None]
        sc = np.where(seen[None], sc, sc.dtype.type(-np.inf))
        sc = sc - sc.max(axis=-1, keepdims=True)
        p = np.exp(sc)
        p = p / p.sum(axis=-1, keepdims=True)
        out[a:e] = (p @ V).transpose(1, 0, 2).reshape(e - a, H)
    return out


def add_layernorm(x, residual, w, b, eps, rms: bool = False, post: bool = False) -> np.ndarray:
    """LN(x + residual) * w + b; residual None: LN(x) (the pre-norm layers of ModernBERT);
    rms: RMSNorm instead of LayerNorm; post: norm(x) + residual (Gemma3's sandwich norms)."""
    s = x if residual is None or post else x + residual
    if rms:
        y = rmsnorm(s, w, b, eps)
    else:
        y = layernorm(s, w.astype(x.dtype), b.astype(x.dtype), eps)
    return (y + residual).astype(x.dtype) if post and residual is not None else y


def glu(x: np.ndarray, act: str) -> np.ndarray:
    """Gated linear unit (ModernBERT's GeGLU): x [T, 2n] -> act(x[:, :n]) * x[:, n:]."""
    n = x.shape[1] // 2
    return (activation(x[:, :n], act) * x[:, n:]).astype(x.dtype)


def attention_extras(op, weights: dict) -> dict:
    """The optional inputs of an attention op (bias table, window, RoPE tables) as kwargs."""
    wn, kw = op.weights, {}
    if "rel_bias" in wn:
        kw["bias"] = weights[wn["rel_bias"]]
    if op.attrs.get("window", 0):
        kw["window"] = int(op.attrs["window"])
    if "rope_cos" in wn:
        kw["rope_cs"] = (weights[wn["rope_cos"]], weights[wn["rope_sin"]])
    if op.attrs.get("kv_heads"):
        kw["kv_heads"] = int(op.attrs["kv_heads"])
    if op.attrs.get("causal"):
        kw["causal"] = True
    if "q_norm" in wn:
        kw["qk_norm"] = (weights[wn["q_norm"]], weights[wn["k_norm"]], float(op.attrs["qk_eps"]))
    return kw


def pool(x: np.ndarray, cu_seqlens: np.ndarray, mode: str) -> np.ndarray:
    B = len(cu_seqlens) - 1
    out = np.empty((B, x.shape[1]), dtype=x.dtype)
    for s in range(B):
        a, e = int(cu_seqlens[s]), int(cu_seqlens[s + 1])
        if mode == "mean":
            out[s] = x[a:e].mean(axis=0)
        elif mode == "cls":
            out[s] = x[a]
        elif mode == "last":  # decoder embedders: the last token (sentence-transformers lasttoken)
            out[s] = x[e - 1]
        elif mode == "max":
            out[s] = x[a:e].max(axis=0)
        elif mode == "splade":  # max_t log1p(relu(x_t)) = log1p(relu(max_t x_t)): monotone
            out[s] = np.log1p(np.maximum(x[a:e].max(axis=0), 0))
        else:
            raise ValueError(f"unknown pooling {mode!r}")
    return out


def normalize(p: np.ndarray) -> np.ndarray:
    n = np.sqrt((p.astype(np.float64) ** 2).sum(axis=1, keepdims=True))
    return (p / np.maximum(n, 1e-12)).astype(p.dtype)


l2_normalize = normalize


def gather_rows(weights: dict[str, np.ndarray], name: str, idx: np.ndarray) -> np.ndarray:
    """Rows of an embedding table, stored as float (`name`) or per-row INT8 (`name_q` + `name_scale`)."""
    if name in weights:
        return weights[name][idx]
    q, scale = weights[name + "_q"], weights[name + "_scale"]
    return q[idx].astype(np.float32) * scale[idx][:, None]


def pre_transform(x: np.ndarray, weights: dict, prefix: str) -> np.ndarray:
    """The per-channel transform a linear may apply before quantising x (SmoothQuant where it
    cannot fold, docs/QUANT.md): x' = (x - p.act_shift) * p.act_mul; identity when absent."""
    z = weights.get(prefix + ".act_shift")
    m = weights.get(prefix + ".act_mul")
    if z is None and m is None:
        return x
    return qp.act_transform(x, z, m).astype(x.dtype)


def linear_apply(
    x: np.ndarray,
    weights: dict,
    prefix: str,
    lq=None,
    matmul_exact: bool = True,
    cu_seqlens=None,
) -> np.ndarray:
    """x @ w.T + b of one linear (before activation / residual): float, or emulated INT8 by
    `lq.scheme` ("dynamic" | "static" | "dynamic_asym"; "fp8": emulated E4M3, zoi.numerics.fp8;
    "fp32" or None: float). Float
    inputs keep their dtype (float64 for golden runs); INT8 runs in float32 as the kernels.
    cu_seqlens: the token batch's sequences, for an INT8 `lq.first_row` (the first row of each
    sequence quantised twice, zoi.numerics.primitives.first_row_residual); None: not applied."""
    b = weights.get(prefix + ".b")
    scheme = getattr(lq, "scheme", "fp32") if lq is not None else "fp32"
    x = pre_transform(x, weights, prefix)
    if scheme == "fp32":
        w = weights.get(prefix + ".w")
        if w is None:  # weight-only INT8: dequantise, compute in float
            w = qp.dequantize_weight(weights[prefix + ".w_q"], weights[prefix + ".w_scale"])
        y = x @ w.T.astype(x.dtype)
        return (y + b.astype(x.dtype) if b is not None else y).astype(x.dtype)
    x = x.astype(np.float32)
    if scheme == "fp8":  # E4M3 weights per channel, activations per token (numerics.fp8)
        w_q, w_s = qf8.quantize_weight_fp8(weights[prefix + ".w"])
        return qf8.linear_fp8_emulated(x, w_q, w_s, b)
    if prefix + ".w_q" in weights:
        w_q, w_s = weights[prefix + ".w_q"], weights[prefix + ".w_scale"]
    else:
        w_q, w_s = qp.quantize_weight(weights[prefix + ".w"])
    zp = None
    if scheme == "dynamic_asym":
        q, a_scale, zp = qp.quantize_act_asym(x)
        if matmul_exact:
            acc = qp.int8_matmul_asym_exact(q, zp, w_q).astype(np.float32)
        else:  # float32 sums of integer products: exact unless a partial sum passes 2**24
            wf = w_q.astype(np.float32)
            acc = (
                q.astype(np.float32) @ wf.T
                - zp.astype(np.float32)[:, None] * wf.sum(axis=1)[None, :]
            )
    elif scheme in ("dynamic", "static"):
        q, a_scale = qp.quantize_act(x, lq.amax if scheme == "static" else None)
        acc = (
            qp.int8_matmul_fast(q, w_q)
            if matmul_exact
            else q.astype(np.float32) @ w_q.astype(np.float32).T
        ).astype(np.float32)
    else:
        raise ValueError(f"{prefix}: unknown quantisation scheme {scheme!r}")
    y = acc * (a_scale[:, None] * w_s[None, :])
    if b is not None:
        y = y + np.asarray(b, np.float32)[None, :]
    if getattr(lq, "first_row", False) and cu_seqlens is not None:
        rows = qp.first_rows(cu_seqlens, x.shape[0])
        q2, s2 = qp.first_row_residual(x, q, a_scale, zp, rows)
        y = qp.add_first_row_term(y, q2, s2, w_q, w_s, rows)
    return y.astype(np.float32)


def execute(
    graph,
    weights: dict,
    ids,
    positions,
    cu_seqlens,
    quant: dict | None = None,
    dtype=np.float32,
    tap=None,
    override=None,
    matmul_exact: bool = True,
    types=None,
    store=None,
    key_lens=None,
    tasks=None,
    paged=None,
    sample=None,
) -> dict[str, np.ndarray]:
    """Run the op list; returns every buffer by name.

    paged: the KV cache of a generation graph (build_generate): its `attention` ops with
    attribute `paged` write and read it (attention_paged: `write`, `read`, `tables`, the block
    table of each sequence of the call); the i-th such op is layer i. sample(logits [B, V]) ->
    tokens [B]: the `sample` op (None: the graph's ops before it run, `sample`'s output is
    absent).

    tasks: int[B], the task adapter of each sequence (-1: none) for ops with `lora_a` /
    `lora_b` weights (docs/ARCHITECTURE.md "Task adapters"); None: every sequence runs the base
    weights.

    key_lens: int[B], every attention op's queries of sequence s see only its first
    key_lens[s] keys (attention()'s key_lens); None: all of them.

    types: int32[T] token types for an embed op that reads them (pairs); None: type 0.

    quant: {linear prefix: LinearQuant}; a linear without an entry runs in float.
    tap(prefix, x, y) sees each linear's input and output (before activation and residual);
    override(prefix, x) may return a replacement output for a linear (None: normal path).
    store(op, y) -> what the later ops read of op's output y (a backend's activation storage,
    e.g. fp16 rounding: the tests' fp16-storage emulation); None: y as computed.
    """
    W = weights
    quant = quant or {}
    env: dict[str, np.ndarray] = {
        "ids": np.asarray(ids),
        "positions": np.asarray(positions),
        "cu_seqlens": np.asarray(cu_seqlens),
        "types": None if types is None else np.asarray(types),
    }
    layer = 0  # the paged attention ops seen: the cache's layer
    for op in graph.ops:
        ins = [env[n] for n in op.inputs]
        a, wn = op.attrs, op.weights
        if op.kind == "embed":
            rows, type_delta = gather_rows(W, wn["word"], ins[0]), None
            if tasks is not None and "lora_a" in wn:
                lt = W[wn["lora_type"]] if "lora_type" in wn else None
                dw, type_delta = lora_embed(
                    ins[0], W[wn["lora_a"]], W[wn["lora_b"]], lt, tasks, env["cu_seqlens"], dtype
                )
                rows = rows.astype(dtype) + dw
            env[op.output] = embed_rows(
                rows,
                ins[1],
                W[wn["pos"]] if "pos" in wn else None,
                W[wn["ln_w"]] if "ln_w" in wn else None,
                W[wn["ln_b"]] if "ln_b" in wn else None,
                a["eps"],
                W[wn["type"]] if "type" in wn else None,
                dtype,
                ins[2] if len(ins) > 2 else None,
                type_delta,
            )
        elif op.kind == "linear":
            p = op.prefix
            y = override(p, ins[0]) if override is not None else None
            if y is None:
                cu = env["cu_seqlens"] if len(ins[0]) == int(env["cu_seqlens"][-1]) else None
                y = linear_apply(ins[0], W, p, quant.get(p), matmul_exact, cu)
            if tap is not None:
                tap(p, ins[0], y)
            y = y.astype(dtype)
            if tasks is not None and "lora_a" in wn:  # before the activation: W + B A
                x = ins[0].astype(dtype)
                y = y + lora_delta(x, W[wn["lora_a"]], W[wn["lora_b"]], tasks, env["cu_seqlens"])
            y = activation(y, a["act"])
            if len(ins) > 1:
                y = y + ins[1]
            env[op.output] = y.astype(dtype)
        elif op.kind == "attention" and a.get("paged"):
            if paged is None:
                raise ValueError("a generation graph's paged attention needs its KV cache (paged=)")
            env[op.output] = attention_paged(
                ins[0],
                ins[1],
                env["positions"],
                a["heads"],
                a["head_dim"],
                a["scale"],
                paged,
                layer,
                **attention_extras(op, W),
            )
            layer += 1
        elif op.kind == "attention":
            env[op.output] = attention(
                ins[0],
                ins[1],
                a["heads"],
                a["head_dim"],
                a["scale"],
                **attention_extras(op, W),
                key_lens=key_lens,
            )
        elif op.kind == "add_layernorm":
            # one input: a plain LayerNorm (pre-norm, MLM head)
            r = ins[1] if len(ins) > 1 else None
            env[op.output] = add_layernorm(
                ins[0],
                r,
                W[wn["w"]],
                W[wn["b"]],
                a["eps"],
                bool(a.get("rms")),
                a.get("residual") == "post",
            )
        elif op.kind == "glu":
            env[op.output] = glu(ins[0], a["act"])
        elif op.kind == "pool":
            env[op.output] = pool(ins[0], ins[1], a["mode"])
        elif op.kind == "sample":
            if sample is None:
                continue
            env[op.output] = np.asarray(sample(ins[0]))
        else:
            raise ValueError(f"unknown op kind {op.kind!r}")
        if store is not None:
            env[op.output] = store(op, env[op.output])
    return env
