"""The task heads as IR ops after the encoder's last hidden state (the weights are
zoi.frontend.heads'). Every head uses the ops the encoder uses: `pool`, `linear` (on "B" rows
after a pool), `add_layernorm` with one input (a plain LayerNorm), and pool mode `splade`.

- seq_cls:   pooled = pool(x, cls); h = linear(pooled, head_act); logits = linear(h)   [B, labels]
- token_cls: logits = linear(x)                                                       [T, labels]
- splade:    h = linear(x, act); n = LN(h); v = linear(n) [T, V];
             sparse = pool(v, splade) = max over the tokens of log1p(relu(v))          [B, V]
- seq_cls of an LLM reranker (spec.score_tokens), after the decoder stack's final norm:
             pooled = pool(x, last); logits = linear(pooled) [B, n]: the LM head's rows of the
             true (and false) token, so logits are exactly the LM's logits of those tokens; the
             score, logit[true] - logit[false], is zoi.heads' post-processing (score_of), one
             subtraction as sentence-transformers' LogitScore does it
"""

from __future__ import annotations

from zoi.graph.ir import Buffer, Graph, Op


def append_head(spec, ops: list[Op], bufs: dict[str, Buffer], x: str) -> str:
    """Append the head's ops reading the last hidden state `x`; returns the output buffer."""
    H = spec.hidden

    def lin(inp: str, prefix: str, out: str, cols: int, rows: str, act: str = "none") -> str:
        bufs[out] = Buffer(out, rows, cols)
        ops.append(Op("linear", [inp], out, {"w": f"{prefix}.w", "b": f"{prefix}.b"}, {"act": act}))
        return out

    if spec.head == "seq_cls" and spec.score_tokens:
        bufs["pooled"] = Buffer("pooled", "B", H)
        ops.append(Op("pool", [x, "cu_seqlens"], "pooled", {}, {"mode": "last"}))
        return lin("pooled", "head.out", "logits", len(spec.score_tokens), "B")
    if spec.head == "seq_cls":
        bufs["pooled"] = Buffer("pooled", "B", H)
        ops.append(Op("pool", [x, "cu_seqlens"], "pooled", {}, {"mode": "cls"}))
        h = lin("pooled", "head.dense", "head_h", H, "B", spec.head_act)
        return lin(h, "head.out", "logits", spec.num_labels, "B")
    if spec.head == "token_cls":
        return lin(x, "head.out", "logits", spec.num_labels, "T")
    if spec.head == "splade":
        h = lin(x, "mlm.dense", "mlm_h", H, "T", spec.head_act)
        bufs["mlm_n"] = Buffer("mlm_n", "T", H)
        ops.append(
            Op("add_layernorm", [h], "mlm_n", {"w": "mlm.ln.w", "b": "mlm.ln.b"}, {"eps": spec.eps})
        )
        v = lin("mlm_n", "mlm.dec", "mlm_logits", spec.vocab_size, "T")
        bufs["sparse"] = Buffer("sparse", "B", spec.vocab_size)
        ops.append(Op("pool", [v, "cu_seqlens"], "sparse", {}, {"mode": "splade"}))
        return "sparse"
    raise ValueError(f"unknown head {spec.head!r}")


def uses_types(spec) -> bool:
    """Pairs carry token types (segment B = 1) into the embedding: a seq_cls head with a table."""
    return spec.head == "seq_cls" and spec.type_vocab_size > 1


def decoder_with_head(spec) -> Graph:
    """A decoder architecture's graph (zoi.graph.build_decoder) with the head in place of its
    pool: the head reads the final norm's output."""
    from zoi.graph.build_decoder import build_decoder

    if spec.dense:
        raise ValueError("a decoder head model has no sentence-transformers Dense modules")
    g = build_decoder(spec)
    i = next(k for k, o in enumerate(g.ops) if o.kind == "pool")
    x = g.ops[i].inputs[0]
    ops = g.ops[:i]
    bufs = {n: b for n, b in g.buffers.items() if n != g.ops[i].output}
    out = append_head(spec, ops, bufs, x)
    return Graph(ops, bufs, ("ids", "positions", "cu_seqlens"), out)
