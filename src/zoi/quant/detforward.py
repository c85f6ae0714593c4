"""The quantiser's forward pass, bit-identical on every machine (zoi.quant.detmath).

The same ops as the golden engine (`zoi.numerics.reference.execute`), with every reduction
made order-independent: float linears and attention products through `det_matmul`,
LayerNorm means / variances, softmax denominators, mean pooling and the L2 norm through
`fixed_sum`, the softmax exponential through `det_exp`. INT8 linears run the integer-exact
emulation of zoi.numerics.primitives unchanged (its integer sums are exact in any order).
Buffers are float32 between ops, as in the FP32 engine; the arithmetic inside an op is
float64. The results differ from the golden engine's by about float32 rounding; what
matters here is that they do not differ between two compiles.
"""

from __future__ import annotations

import numpy as np

from zoi.graph.build import linear_prefix
from zoi.numerics import primitives as qp
from zoi.numerics.reference import (
    attention_extras,
    erf_f32,
    gather_rows,
    linear_apply,
    pre_transform,
    rope,
)
from zoi.quant.detmath import det_exp, det_matmul, fixed_mean, fixed_sum

_SQRT1_2 = np.float32(1.0 / np.sqrt(2.0))


def layernorm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    x64 = np.asarray(x, np.float64)
    mu = fixed_mean(x64, -1, keepdims=True)
    d = x64 - mu
    var = fixed_mean(d * d, -1, keepdims=True)
    y = d / np.sqrt(var + float(eps)) * np.asarray(w, np.float64) + np.asarray(b, np.float64)
    return y.astype(np.float32)


def rmsnorm(x: np.ndarray, w: np.ndarray, b, eps: float) -> np.ndarray:
    x64 = np.asarray(x, np.float64)
    ms = fixed_mean(x64 * x64, -1, keepdims=True)
    y = x64 / np.sqrt(ms + float(eps)) * np.asarray(w, np.float64)
    if b is not None:
        y = y + np.asarray(b, np.float64)
    return y.astype(np.float32)


def activation(y: np.ndarray, act: str) -> np.ndarray:
    """float32 in and out; erf GELU as the kernels (erf_f32, elementwise), the others through
    det_exp (numpy's tanh / exp are SIMD code that differs between CPUs)."""
    if act == "none":
        return y
    if act == "gelu":
        e = erf_f32((y * _SQRT1_2).astype(np.float32))
        return ((np.float32(0.5) * y) * (np.float32(1) + e)).astype(np.float32)
    y64 = y.astype(np.float64)
    if act == "relu":
        return np.maximum(y, np.float32(0))
    if act == "gelu_tanh":
        z = np.sqrt(2.0 / np.pi) * (y64 + 0.044715 * y64 * y64 * y64)
        t = 1.0 - 2.0 / (det_exp(2.0 * z) + 1.0)  # tanh(z)
        return (0.5 * y64 * (1.0 + t)).astype(np.float32)
    if act == "sigmoid":
        return (1.0 / (1.0 + det_exp(-y64))).astype(np.float32)
    if act == "silu":
        return (y64 / (1.0 + det_exp(-y64))).astype(np.float32)
    if act == "tanh":
        return (1.0 - 2.0 / (det_exp(2.0 * y64) + 1.0)).astype(np.float32)
    raise ValueError(f"unknown activation {act!r}")


def linear(x: np.ndarray, weights: dict, prefix: str, lq=None) -> np.ndarray:
    """One linear before activation / residual: det_matmul in float, the exact emulation in INT8."""
    scheme = getattr(lq, "scheme", "fp32") if lq is not None else "fp32"
    if scheme != "fp32":
        return linear_apply(x, weights, prefix, lq, matmul_exact=True)
    xt = pre_transform(np.asarray(x, np.float32), weights, prefix)
    w = weights.get(prefix + ".w")
    if w is None:  # weight-only INT8
        w = qp.dequantize_weight(weights[prefix + ".w_q"], weights[prefix + ".w_scale"])
    y = det_matmul(xt, w)
    b = weights.get(prefix + ".b")
    if b is not None:
        y = y + np.asarray(b, np.float32).astype(np.float64)[None, :]
    return y.astype(np.float32)


def attention(
    qkv: np.ndarray,
    cu_seqlens: np.ndarray,
    heads: int,
    head_dim: int,
    scale: float,
    bias=None,
    window: int = 0,
    rope_cs=None,
    kv_heads: int = 0,
    causal: bool = False,
    qk_norm=None,
) -> np.ndarray:
    """The reference's attention (bias / window / RoPE / grouped KV heads / causal / q-k norm
    as zoi.numerics.reference.attention); RoPE is elementwise there (bit-identical everywhere),
    so it is reused."""
    H = heads * head_dim
    kvh = kv_heads or heads
    KV = kvh * head_dim
    out = np.empty((qkv.shape[0], H), np.float32)
    sc32 = float(np.float32(scale))
    for s in range(len(cu_seqlens) - 1):
        a, e = int(cu_seqlens[s]), int(cu_seqlens[s + 1])
        if e == a:
            continue
        x = qkv[a:e]
        q = x[:, :H].reshape(e - a, heads, head_dim).transpose(1, 0, 2)  # [heads, L, d]
        k = x[:, H : H + KV].reshape(e - a, kvh, head_dim).transpose(1, 0, 2)
        v = x[:, H + KV :].reshape(e - a, kvh, head_dim).transpose(1, 2, 0)  # [kv, d, L]
        if kvh != heads:
            k, v = np.repeat(k, heads // kvh, axis=0), np.repeat(v, heads // kvh, axis=0)
        if qk_norm is not None:
            q = rmsnorm(q, qk_norm[0], None, qk_norm[2])
            k = rmsnorm(k, qk_norm[1], None, qk_norm[2])
        if rope_cs is not None:
            q, k = rope(q, *rope_cs), rope(k, *rope_cs)
        sc = det_matmul(q, k) * sc32
        ij = np.arange(e - a)[None, :] - np.arange(e - a)[:, None]  # j - i
        if bias is not None:
            P = (bias.shape[1] + 1) // 2
            sc = sc + bias[:, ij + P - 1].astype(np.float64)
        if window > 0:
            sc = np.where(np.abs(ij) <= window, sc, -np.inf)
        if causal:
            sc = np.where(ij <= 0, sc, -np.inf)
        sc = sc - sc.max(axis=-1, keepdims=True)
        p = det_exp(sc)
        p = p / fixed_sum(p, -1, keepdims=True)
        out[a:e] = det_matmul(p, v).transpose(1, 0, 2).reshape(e - a, H).astype(np.float32)
    return out


def pool(x: np.ndarray, cu_seqlens: np.ndarray, mode: str) -> np.ndarray:
    B = len(cu_seqlens) - 1
    out = np.empty((B, x.shape[1]), np.float32)
    for s in range(B):
        a, e = int(cu_seqlens[s]), int(cu_seqlens[s + 1])
        if mode == "mean":
            out[s] = fixed_mean(x[a:e], 0).astype(np.float32)
        elif mode == "cls":
            out[s] = x[a]
        elif mode == "max":
            out[s] = x[a:e].max(axis=0)
        elif mode == "last":
            out[s] = x[e - 1]
        else:
            raise ValueError(f"unknown pooling {mode!r}")
    return out


def l2_normalize(p: np.ndarray) -> np.ndarray:
    p64 = np.asarray(p, np.float64)
    n = np.sqrt(fixed_sum(p64 * p64, 1, keepdims=True))
    return (p64 / np.maximum(n, 1e-12)).astype(np.float32)


def execute(
    graph, weights: dict, ids, positions, cu_seqlens, quant: dict | None = None, tap=None
) -> dict[str, np.ndarray]:
    """Run the op list (float32 buffers); returns every buffer by name. tap(prefix, x, y)
    sees each linear's input and output before activation and residual."""
    W = weights
    quant = quant or {}
    env: dict[str, np.ndarray] = {
        "ids": np.asarray(ids),
        "positions": np.asarray(positions),
        "cu_seqlens": np.asarray(cu_seqlens),
    }
    for op in graph.ops:
        ins = [env[n] for n in op.inputs]
        a, wn = op.attrs, op.weights
        if op.kind == "embed":
            x = gather_rows(W, wn["word"], ins[0]).astype(np.float32)
            if "pos" in wn:
                x = x + W[wn["pos"]][ins[1]].astype(np.float32)
            if "type" in wn:
                x = x + W[wn["type"]][0].astype(np.float32)
            if "ln_w" in wn:
                x = layernorm(x, W[wn["ln_w"]], W[wn["ln_b"]], a["eps"])
            env[op.output] = x
        elif op.kind == "linear":
            p = linear_prefix(op)
            y = linear(ins[0], W, p, quant.get(p))
            if tap is not None:
                tap(p, ins[0], y)
            y = activation(y.astype(np.float32), a["act"])
            if len(ins) > 1:
                y = y + ins[1]
            env[op.output] = y.astype(np.float32)
        elif op.kind == "attention":
            env[op.output] = attention(
                ins[0], ins[1], a["heads"], a["head_dim"], a["scale"], **attention_extras(op, W)
            )
        elif op.kind == "add_layernorm":
            post = a.get("residual") == "post" and len(ins) > 1
            x = ins[0] + ins[1] if len(ins) > 1 and not post else ins[0]
            norm = rmsnorm if a.get("rms") else layernorm
            y = norm(x.astype(np.float32), W[wn["w"]], W[wn["b"]], a["eps"])
            env[op.output] = (y + ins[1]).astype(np.float32) if post else y
        elif op.kind == "glu":
            n = ins[0].shape[1] // 2
            env[op.output] = (activation(ins[0][:, :n], a["act"]) * ins[0][:, n:]).astype(
                np.float32
            )
        elif op.kind == "pool":
            env[op.output] = pool(ins[0], ins[1], a["mode"])
        else:
            raise ValueError(f"unknown op kind {op.kind!r}")
    return env


def run_graph(
    graph,
    weights: dict,
    ids: np.ndarray,
    positions: np.ndarray,
    cu_seqlens: np.ndarray,
    quant: dict | None = None,
    normalize: bool = False,
    tap=None,
) -> np.ndarray:
    """Pooled output [B, H] float32 (L2-normalised when normalize), deterministically."""
    out = execute(graph, weights, ids, positions, cu_seqlens, quant, tap)[graph.output]
    return l2_normalize(out) if normalize else out
