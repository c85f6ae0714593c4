"""The golden engine: a readable numpy implementation of every IR op (float32 or float64).

Every other backend is tested against these functions. INT8 linears run through
`zoi.quant.primitives` (integer-exact emulation) so INT8 numerics are testable anywhere.
"""

from __future__ import annotations

import math

import numpy as np

from zoi.graph.build import linear_prefix
from zoi.graph.compiled import CompiledModel
from zoi.quant import primitives as qp

_SQRT1_2 = 1.0 / math.sqrt(2.0)


def _erf(x: np.ndarray) -> np.ndarray:
    try:
        from scipy.special import erf  # optional, exact

        return erf(x)
    except ImportError:  # vectorised math.erf: exact to double precision
        return np.vectorize(math.erf, otypes=[np.float64])(x).astype(x.dtype)


def activation(x: np.ndarray, act: str) -> np.ndarray:
    if act == "none":
        return x
    if act == "gelu":  # erf form, as BERT
        return (0.5 * x * (1.0 + _erf(x * _SQRT1_2))).astype(x.dtype)
    if act == "gelu_tanh":
        c = math.sqrt(2.0 / math.pi)
        return (0.5 * x * (1.0 + np.tanh(c * (x + 0.044715 * x**3)))).astype(x.dtype)
    if act == "relu":
        return np.maximum(x, 0)
    if act == "sigmoid":
        return (1.0 / (1.0 + np.exp(-x))).astype(x.dtype)
    raise ValueError(f"unknown activation {act!r}")


def layernorm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    return ((x - mu) / np.sqrt(var + eps) * w + b).astype(x.dtype)


def embed(ids, positions, word, pos, ln_w, ln_b, eps, type_=None, dtype=np.float32) -> np.ndarray:
    """x[T,H] = LN(word[ids] + pos[positions] + type[0])."""
    x = word[ids].astype(dtype) + pos[positions].astype(dtype)
    if type_ is not None:
        x = x + type_[0].astype(dtype)
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


def linear_int8(x, w_q, w_scale, b, act="none", residual=None, amax=None) -> np.ndarray:
    """Emulated INT8 linear: quantise x (per token, or per tensor with amax), exact int matmul."""
    y = qp.linear_int8_emulated(x.astype(np.float32), w_q, w_scale, b, amax).astype(x.dtype)
    y = activation(y, act)
    if residual is not None:
        y = y + residual
    return y.astype(x.dtype)


def attention(qkv: np.ndarray, cu_seqlens: np.ndarray, heads: int, head_dim: int, scale: float) -> np.ndarray:
    """Varlen self-attention over packed sequences. qkv [T, 3H] -> ctx [T, H]."""
    H = heads * head_dim
    out = np.empty((qkv.shape[0], H), dtype=qkv.dtype)
    for s in range(len(cu_seqlens) - 1):
        a, e = int(cu_seqlens[s]), int(cu_seqlens[s + 1])
        q = qkv[a:e, :H].reshape(e - a, heads, head_dim).transpose(1, 0, 2)
        k = qkv[a:e, H : 2 * H].reshape(e - a, heads, head_dim).transpose(1, 0, 2)
        v = qkv[a:e, 2 * H :].reshape(e - a, heads, head_dim).transpose(1, 0, 2)
        sc = (q @ k.transpose(0, 2, 1)) * qkv.dtype.type(scale)
        sc = sc - sc.max(axis=-1, keepdims=True)
        p = np.exp(sc)
        p = p / p.sum(axis=-1, keepdims=True)
        out[a:e] = (p @ v).transpose(1, 0, 2).reshape(e - a, H)
    return out


def add_layernorm(x, residual, w, b, eps) -> np.ndarray:
    return layernorm(x + residual, w.astype(x.dtype), b.astype(x.dtype), eps)


def pool(x: np.ndarray, cu_seqlens: np.ndarray, mode: str) -> np.ndarray:
    B = len(cu_seqlens) - 1
    out = np.empty((B, x.shape[1]), dtype=x.dtype)
    for s in range(B):
        a, e = int(cu_seqlens[s]), int(cu_seqlens[s + 1])
        if mode == "mean":
            out[s] = x[a:e].mean(axis=0)
        elif mode == "cls":
            out[s] = x[a]
        elif mode == "max":
            out[s] = x[a:e].max(axis=0)
        else:
            raise ValueError(f"unknown pooling {mode!r}")
    return out


def normalize(p: np.ndarray) -> np.ndarray:
    n = np.sqrt((p.astype(np.float64) ** 2).sum(axis=1, keepdims=True))
    return (p / np.maximum(n, 1e-12)).astype(p.dtype)


l2_normalize = normalize


def dequantized_embedding(weights: dict[str, np.ndarray]) -> np.ndarray:
    if "embed.word" in weights:
        return weights["embed.word"]
    return qp.dequantize_weight(weights["embed.word_q"], weights["embed.word_scale"])


def run_graph(model: CompiledModel, ids, positions, cu_seqlens, dtype=np.float32, int8: bool | None = None,
              capture: dict | None = None) -> dict[str, np.ndarray]:
    """Run the whole op list; returns every buffer (by name). `capture` receives linear inputs."""
    W = model.weights
    env: dict[str, np.ndarray] = {"ids": np.asarray(ids), "positions": np.asarray(positions),
                                  "cu_seqlens": np.asarray(cu_seqlens)}
    for op in model.graph.ops:
        ins = [env[n] for n in op.inputs]
        if op.kind == "embed":
            word = dequantized_embedding(W)
            env[op.output] = embed(ins[0], ins[1], word, W[op.weights["pos"]], W[op.weights["ln_w"]],
                                   W[op.weights["ln_b"]], op.attrs["eps"],
                                   W[op.weights["type"]] if "type" in op.weights else None, dtype)
        elif op.kind == "linear":
            p = linear_prefix(op)
            res = ins[1] if len(ins) > 1 else None
            if capture is not None:
                capture.setdefault(p, []).append(ins[0])
            q = model.quant.get(p)
            if f"{p}.w_q" in W and (q is None or q.scheme != "fp32") and int8 is not False:
                env[op.output] = linear_int8(ins[0], W[f"{p}.w_q"], W[f"{p}.w_scale"], W[f"{p}.b"],
                                             op.attrs["act"], res, q.amax if q and q.scheme == "static" else None)
            else:
                w = W[f"{p}.w"] if f"{p}.w" in W else qp.dequantize_weight(W[f"{p}.w_q"], W[f"{p}.w_scale"])
                env[op.output] = linear(ins[0], w, W[f"{p}.b"], op.attrs["act"], res)
        elif op.kind == "attention":
            env[op.output] = attention(ins[0], ins[1], op.attrs["heads"], op.attrs["head_dim"], op.attrs["scale"])
        elif op.kind == "add_layernorm":
            env[op.output] = add_layernorm(ins[0], ins[1], W[op.weights["w"]], W[op.weights["b"]], op.attrs["eps"])
        elif op.kind == "pool":
            env[op.output] = pool(ins[0], ins[1], op.attrs["mode"])
        else:
            raise ValueError(f"unknown op kind {op.kind!r}")
    return env


class ReferenceBackend:
    """The numpy golden engine behind the Backend interface (float32 by default, or float64)."""

    name = "reference"

    def __init__(self, model: CompiledModel, dtype=np.float32):
        self.model = model
        self.dtype = dtype

    def run(self, ids, positions, cu_seqlens, normalize: bool) -> np.ndarray:
        env = run_graph(self.model, ids, positions, cu_seqlens, self.dtype)
        out = env[self.model.graph.output]
        if normalize:
            out = l2_normalize(out)
        return np.ascontiguousarray(out, dtype=np.float32)

    def memory(self) -> dict:
        return {"weights_bytes": self.model.weight_bytes(), "arena_bytes": self.model.plan.arena_bytes}
