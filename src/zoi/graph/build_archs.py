"""Graphs of the pre-norm architectures (ModernBERT), in the IR of zoi.graph.ir.

ModernBERT (transformers' ModernBertModel): x0 = LN(tok[ids]) (no position table), then per
layer i (pre-norm; layer 0 has no attention norm)

    qkv = Wqkv(LN1(x)) ; ctx = attention(qkv, RoPE, window on local layers)
    x1 = x + Wo(ctx) ; x = x1 + Wo2(geglu(Wi(LN2(x1))))

and a final LN before pooling. Residual adds ride on the linear (its second input), the norm
is an add_layernorm without residual, GeGLU is the "glu" op. Bias-less linears / norms carry
zero biases (zoi.frontend.archs), so every backend and the quantiser see the usual weights.
"""

from __future__ import annotations

import math

from zoi.frontend.spec import ModelSpec
from zoi.graph.build_decoder import append_pool
from zoi.graph.ir import Buffer, Graph, Op


def is_global(spec: ModelSpec, i: int) -> bool:
    return i % spec.global_every == 0


def build_modernbert(spec: ModelSpec) -> Graph:
    H, I = spec.hidden, spec.intermediate
    bufs: dict[str, Buffer] = {}
    ops: list[Op] = []

    def buf(name: str, cols: int, rows: str = "T") -> str:
        bufs[name] = Buffer(name, rows, cols)
        return name

    def lin(x: str, prefix: str, out: str, cols: int, res: str | None = None) -> str:
        ins = [x] if res is None else [x, res]
        w = {"w": f"{prefix}.w", "b": f"{prefix}.b"}
        ops.append(Op("linear", ins, buf(out, cols), w, {"act": "none"}))
        return out

    def norm(x: str, prefix: str, out: str) -> str:
        w = {"w": f"{prefix}.w", "b": f"{prefix}.b"}
        ops.append(Op("add_layernorm", [x], buf(out, H), w, {"eps": spec.eps}))
        return out

    ew = {"word": "embed.word", "ln_w": "embed.ln.w", "ln_b": "embed.ln.b"}
    ops.append(Op("embed", ["ids", "positions"], buf("x0", H), ew, {"eps": spec.eps}))
    x = "x0"
    for i in range(spec.layers):
        n = x if i == 0 else norm(x, f"l{i}.ln1", f"l{i}.n1")
        qkv = lin(n, f"l{i}.qkv", f"l{i}.qkv_out", 3 * H)
        g = is_global(spec, i)
        kind = "g" if g else "l"
        attrs = {
            "heads": spec.heads,
            "head_dim": spec.head_dim,
            "scale": 1.0 / math.sqrt(spec.head_dim),
        }
        if not g and spec.local_window:
            attrs["window"] = spec.local_window
        aw = {"rope_cos": f"rope.{kind}.cos", "rope_sin": f"rope.{kind}.sin"}
        ops.append(Op("attention", [qkv, "cu_seqlens"], buf(f"l{i}.ctx", H), aw, attrs))
        x1 = lin(f"l{i}.ctx", f"l{i}.o", f"l{i}.x1", H, res=x)
        m = norm(x1, f"l{i}.ln2", f"l{i}.n2")
        h = lin(m, f"l{i}.ffn1", f"l{i}.ffn_h", 2 * I)
        ops.append(Op("glu", [h], buf(f"l{i}.glu", I), {}, {"act": spec.act}))
        x = lin(f"l{i}.glu", f"l{i}.ffn2", f"l{i}.x2", H, res=x1)
    x = norm(x, "final_ln", "xf")
    append_pool(spec, ops, bufs, x)
    return Graph(ops, bufs)
