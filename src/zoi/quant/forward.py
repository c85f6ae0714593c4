"""A small numpy executor of the IR for calibration, search and reports.

It walks `graph.ops` (docs/ARCHITECTURE.md) in float32, with the INT8 linears emulated
through `zoi.quant.primitives` when a quant dict is given, and lets the caller tap the
input and output of every linear. The backends have their own implementations; this one
exists so the quantiser can run the model many times (observer statistics, SmoothQuant
alpha search, per-layer SQNR) without building an engine.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from zoi.quant import primitives as P

try:  # scipy is optional: erf from it when present, else a 1e-7-accurate fallback
    from scipy.special import erf as _erf
except Exception:  # pragma: no cover - depends on the environment
    _erf = None


def erf(x: np.ndarray) -> np.ndarray:
    if _erf is not None:
        return _erf(x)
    # Numerical Recipes erfc (Chebyshev fit), fractional error < 1.2e-7 everywhere
    z = np.abs(x).astype(np.float64)
    t = 1.0 / (1.0 + 0.5 * z)
    poly = -z * z - 1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 + t * (
        -0.18628806 + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 + t * (
            -0.82215223 + t * 0.17087277))))))))
    r = 1.0 - t * np.exp(poly)
    return np.where(x >= 0, r, -r)


def activation(y: np.ndarray, act: str | None) -> np.ndarray:
    if act in (None, "none", ""):
        return y
    if act == "gelu":
        return (0.5 * y * (1.0 + erf(y / math.sqrt(2.0)))).astype(np.float32)
    if act == "gelu_tanh":
        c = np.float32(math.sqrt(2.0 / math.pi))
        return (0.5 * y * (1.0 + np.tanh(c * (y + np.float32(0.044715) * y * y * y)))).astype(
            np.float32
        )
    if act == "relu":
        return np.maximum(y, 0).astype(np.float32)
    if act == "sigmoid":
        return (1.0 / (1.0 + np.exp(-y))).astype(np.float32)
    raise ValueError(f"unknown activation {act!r}")


def layernorm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    x = x.astype(np.float32)
    mu = x.mean(axis=1, keepdims=True)
    d = x - mu
    var = (d * d).mean(axis=1, keepdims=True)
    return (d / np.sqrt(var + np.float32(eps)) * w + b).astype(np.float32)


def attention(qkv: np.ndarray, cu: np.ndarray, heads: int, head_dim: int, scale: float) -> np.ndarray:
    H = heads * head_dim
    out = np.empty((qkv.shape[0], H), np.float32)
    for s in range(len(cu) - 1):
        a, e = int(cu[s]), int(cu[s + 1])
        n = e - a
        blk = qkv[a:e]
        q = blk[:, :H].reshape(n, heads, head_dim).transpose(1, 0, 2)
        k = blk[:, H : 2 * H].reshape(n, heads, head_dim).transpose(1, 0, 2)
        v = blk[:, 2 * H :].reshape(n, heads, head_dim).transpose(1, 0, 2)
        sc = np.matmul(q, k.transpose(0, 2, 1)) * np.float32(scale)
        sc -= sc.max(axis=2, keepdims=True)
        p = np.exp(sc)
        p /= p.sum(axis=2, keepdims=True)
        out[a:e] = np.matmul(p, v).transpose(1, 0, 2).reshape(n, H)
    return out


def pool(x: np.ndarray, cu: np.ndarray, mode: str) -> np.ndarray:
    B = len(cu) - 1
    out = np.empty((B, x.shape[1]), np.float32)
    for s in range(B):
        a, e = int(cu[s]), int(cu[s + 1])
        if mode == "mean":
            out[s] = x[a:e].mean(axis=0)
        elif mode == "cls":
            out[s] = x[a]
        elif mode == "max":
            out[s] = x[a:e].max(axis=0)
        else:
            raise ValueError(f"unknown pooling {mode!r}")
    return out


def l2_normalize(p: np.ndarray) -> np.ndarray:
    n = np.sqrt((p.astype(np.float32) ** 2).sum(axis=1, keepdims=True))
    return (p / np.maximum(n, np.float32(1e-12))).astype(np.float32)


def linear_prefix(op) -> str:
    """Weight prefix of a linear op: 'l0.qkv' for weights {'w': 'l0.qkv.w', ...}."""
    name = op.weights.get("w")
    if name is None:
        raise ValueError(f"linear op without a 'w' weight: {op}")
    return name[:-2] if name.endswith(".w") else name


def _gather(weights: dict, name: str, idx: np.ndarray) -> np.ndarray:
    if name in weights:
        return weights[name][idx]
    q, s = weights[name + "_q"], weights[name + "_scale"]
    return q[idx].astype(np.float32) * s[idx][:, None]


def pre_transform(x: np.ndarray, weights: dict, prefix: str) -> np.ndarray:
    """The per-channel transform some linears apply before quantising x (docs/QUANT.md):
    x' = (x - p.act_shift) * p.act_mul, each optional; identity when neither is stored."""
    z = weights.get(prefix + ".act_shift")
    m = weights.get(prefix + ".act_mul")
    if z is None and m is None:
        return x
    return P.act_transform(x, z, m)


def linear_apply(
    x: np.ndarray, weights: dict, prefix: str, lq=None, matmul_exact: bool = True
) -> np.ndarray:
    """x @ w.T + b for one linear, FP32 or emulated INT8 by `lq` (a LinearQuant or None)."""
    b = weights.get(prefix + ".b")
    scheme = getattr(lq, "scheme", "fp32") if lq is not None else "fp32"
    if scheme == "fp32":
        x = pre_transform(x, weights, prefix)
        w = weights.get(prefix + ".w")
        if w is None:  # only the quantised form is there: dequantise (reports on artifacts)
            w = P.dequantize_weight(weights[prefix + ".w_q"], weights[prefix + ".w_scale"])
        y = x @ w.T
        return (y + b if b is not None else y).astype(np.float32)
    x = pre_transform(x, weights, prefix)
    if prefix + ".w_q" in weights:
        w_q, w_s = weights[prefix + ".w_q"], weights[prefix + ".w_scale"]
    else:
        w_q, w_s = P.quantize_weight(weights[prefix + ".w"])
    if scheme == "dynamic_asym":
        q, a_scale, zp = P.quantize_act_asym(x)
        if matmul_exact:
            acc = P.int8_matmul_asym_exact(q, zp, w_q).astype(np.float32)
        else:  # float32 sums of integer products: exact unless a partial sum passes 2**24
            wf = w_q.astype(np.float32)
            acc = q.astype(np.float32) @ wf.T - zp.astype(np.float32)[:, None] * wf.sum(axis=1)[None, :]
    else:
        amax = lq.amax if scheme == "static" else None
        q, a_scale = P.quantize_act(x, amax)
        if matmul_exact:
            acc = P.int8_matmul_fast(q, w_q).astype(np.float32)
        else:
            acc = q.astype(np.float32) @ w_q.astype(np.float32).T
    y = acc * (a_scale[:, None] * w_s[None, :])
    if b is not None:
        y = y + np.asarray(b, np.float32)[None, :]
    return y.astype(np.float32)


Tap = Callable[[str, np.ndarray, np.ndarray], None]


def run_graph(
    graph,
    weights: dict,
    ids: np.ndarray,
    positions: np.ndarray,
    cu_seqlens: np.ndarray,
    quant: dict | None = None,
    normalize: bool = False,
    tap: Tap | None = None,
    override: Callable[[str, np.ndarray], np.ndarray | None] | None = None,
    matmul_exact: bool = True,
) -> np.ndarray:
    """Run the graph; returns pooled [B, H] float32.

    tap(prefix, x, y) sees every linear's input x [T, K] and its output y [T, N] (before
    the activation and the residual). override(prefix, x) may return a replacement output
    for a linear (used by the per-layer sensitivity sweep); None keeps the normal path.
    """
    env: dict[str, np.ndarray] = {}
    names = list(graph.inputs) if getattr(graph, "inputs", None) else ["ids", "positions", "cu_seqlens"]
    for n, v in zip(names, (ids, positions, cu_seqlens), strict=False):
        env[n] = v
    env.setdefault("ids", ids)
    env.setdefault("positions", positions)
    env.setdefault("cu_seqlens", cu_seqlens)
    quant = quant or {}
    out_name = None
    for op in graph.ops:
        k, a, wn = op.kind, op.attrs, op.weights
        if k == "embed":
            i, p = env[op.inputs[0]], env[op.inputs[1]]
            x = _gather(weights, wn["word"], i) + weights[wn["pos"]][p]
            if wn.get("type"):
                x = x + weights[wn["type"]][0]
            env[op.output] = layernorm(x, weights[wn["ln_w"]], weights[wn["ln_b"]], a.get("eps", 1e-12))
        elif k == "linear":
            x = env[op.inputs[0]]
            pre = linear_prefix(op)
            y = override(pre, x) if override is not None else None
            if y is None:
                y = linear_apply(x, weights, pre, quant.get(pre), matmul_exact)
            if tap is not None:
                tap(pre, x, y)
            y = activation(y, a.get("act"))
            if len(op.inputs) > 1:
                y = (y + env[op.inputs[1]]).astype(np.float32)
            env[op.output] = y
        elif k == "attention":
            env[op.output] = attention(
                env[op.inputs[0]], env[op.inputs[1]], a["heads"], a["head_dim"], a["scale"]
            )
        elif k == "add_layernorm":
            s = env[op.inputs[0]] + env[op.inputs[1]]
            env[op.output] = layernorm(s, weights[wn["w"]], weights[wn["b"]], a.get("eps", 1e-12))
        elif k == "layernorm":
            env[op.output] = layernorm(env[op.inputs[0]], weights[wn["w"]], weights[wn["b"]], a.get("eps", 1e-12))
        elif k == "pool":
            env[op.output] = pool(env[op.inputs[0]], env[op.inputs[1]], a.get("mode", "mean"))
        elif k == "normalize":
            env[op.output] = env[op.inputs[0]]
            if normalize:
                env[op.output] = l2_normalize(env[op.inputs[0]])
            out_name = op.output
            continue
        else:
            raise ValueError(f"quant.forward: unsupported op kind {k!r}")
        out_name = op.output
    res = env[getattr(graph, "output", None) or out_name]
    if normalize and not any(o.kind == "normalize" for o in graph.ops):
        res = l2_normalize(res)
    return res
