"""ModelSpec -> Graph (the op list of a BERT-family encoder over packed tokens).

NomicBERT / GTE / jina-embeddings-v3 (spec.ROTARY_ARCHS) are the same post-norm layers with
other attributes: no position table in `embed`, RoPE tables on `attention` (heads x head_dim
columns, which need not be H), and for NomicBERT / GTE a gated MLP: `ffn1` writes 2I columns,
`glu` (act(gate) * up) feeds `ffn2`.

Task adapters (spec.adapters, jina-embeddings-v3): every linear of the layers gets the weight
roles `lora_a` / `lora_b` and the embedding `lora_a` / `lora_b` (/ `lora_type`), and the graph
takes the per-sequence input `tasks` (docs/ARCHITECTURE.md "Task adapters")."""

from __future__ import annotations

import math

from zoi.frontend.spec import DECODER_ARCHS, GATED_ROTARY_ARCHS, ROTARY_ARCHS, ModelSpec
from zoi.graph.build_decoder import append_pool, build_decoder
from zoi.graph.heads import append_head, decoder_with_head, uses_types
from zoi.graph.ir import Buffer, Graph, Op


def linear_prefix(op: Op) -> str:
    """Weight prefix of a linear op, e.g. 'l0.qkv' (its weights are prefix.w / prefix.b)."""
    return op.prefix


def build_graph(spec: ModelSpec) -> Graph:
    if spec.arch == "modernbert":
        from zoi.graph.build_archs import build_modernbert

        return build_modernbert(spec)
    if spec.arch in DECODER_ARCHS:  # with a head (an LLM reranker): zoi.graph.heads
        return decoder_with_head(spec) if spec.head else build_decoder(spec)
    H, I = spec.hidden, spec.intermediate
    rotary = spec.arch in ROTARY_ARCHS  # RoPE instead of a position table, a gated MLP
    A = spec.heads * spec.head_dim  # the attention's width (H but for an explicit head_dim)
    bufs: dict[str, Buffer] = {}
    ops: list[Op] = []

    def buf(name: str, cols: int, rows: str = "T") -> str:
        bufs[name] = Buffer(name, rows, cols)
        return name

    lora = bool(spec.adapters)

    def lin(x: str, prefix: str, out: str, cols: int, act: str = "none") -> str:
        w = {"w": f"{prefix}.w", "b": f"{prefix}.b"}
        if lora and prefix.startswith("l"):  # the layers' linears (not Electra's projection)
            w.update(lora_a=f"{prefix}.lora_a", lora_b=f"{prefix}.lora_b")
        ops.append(Op("linear", [x], buf(out, cols), w, {"act": act}))
        return out

    def add_ln(x: str, res: str, prefix: str, out: str) -> str:
        ops.append(
            Op(
                "add_layernorm",
                [x, res],
                buf(out, H),
                {"w": f"{prefix}.w", "b": f"{prefix}.b"},
                {"eps": spec.eps},
            )
        )
        return out

    ew = {"word": "embed.word", "pos": "embed.pos", "ln_w": "embed.ln.w", "ln_b": "embed.ln.b"}
    if rotary:
        del ew["pos"]
    if spec.type_vocab_size:
        ew["type"] = "embed.type"
    if lora:
        ew.update(lora_a="embed.lora_a", lora_b="embed.lora_b")
        if spec.type_vocab_size:
            ew["lora_type"] = "embed.lora_type"
    E = spec.embed_size or H  # Electra / ALBERT: factorised embeddings, then a projection
    ins = ["ids", "positions"] + (["types"] if uses_types(spec) else [])  # types: pairs (heads)
    ops.append(Op("embed", ins, buf("x0", E), ew, {"eps": spec.eps}))
    x = "x0"
    if spec.embed_size:
        x = lin(x, "embed.proj", "x0p", H)
    attn_w = {"rel_bias": "rel_bias"} if spec.rel_buckets else {}  # MPNet
    if rotary:
        attn_w = {"rope_cos": "rope.g.cos", "rope_sin": "rope.g.sin"}
    for i in range(spec.layers):
        qkv = lin(x, f"l{i}.qkv", f"l{i}.qkv_out", 3 * A)
        ops.append(
            Op(
                "attention",
                [qkv, "cu_seqlens"],
                buf(f"l{i}.ctx", A),
                dict(attn_w),
                {
                    "heads": spec.heads,
                    "head_dim": spec.head_dim,
                    "scale": 1.0 / math.sqrt(spec.head_dim),
                },
            )
        )
        ao = lin(f"l{i}.ctx", f"l{i}.o", f"l{i}.attn_out", H)
        x1 = add_ln(ao, x, f"l{i}.ln1", f"l{i}.x1")
        if spec.arch in GATED_ROTARY_ARCHS:  # act(x1 Wgate) * (x1 Wup): one [2I, H] linear, glu
            h = lin(x1, f"l{i}.ffn1", f"l{i}.ffn_h", 2 * I)
            ops.append(Op("glu", [h], buf(f"l{i}.glu", I), {}, {"act": spec.act}))
            h = f"l{i}.glu"
        else:
            h = lin(x1, f"l{i}.ffn1", f"l{i}.ffn_h", I, act=spec.act)
        f = lin(h, f"l{i}.ffn2", f"l{i}.ffn_out", H)
        x = add_ln(f, x1, f"l{i}.ln2", f"l{i}.x2")
    if spec.head:  # a task head (zoi.graph.heads) instead of the embedding pool
        out = append_head(spec, ops, bufs, x)
        return Graph(ops, bufs, ("ids", "positions", "cu_seqlens", *ins[2:]), out)
    append_pool(spec, ops, bufs, x)
    if lora:  # one task id per sequence (-1: the base weights)
        return Graph(ops, bufs, ("ids", "positions", "cu_seqlens", "tasks"))
    return Graph(ops, bufs)
