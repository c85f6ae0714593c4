"""Graphs of the decoder architectures (Llama, Mistral, Qwen2, Qwen3, Gemma3) run as encoders,
in the IR of zoi.graph.ir: the same ops as BERT with other attributes.

Per layer i (pre-norm; Gemma3 also norms each branch's output before its residual add):

    n = RMS1(x) ; qkv = Wqkv(n) ; ctx = attention(qkv, RoPE, causal | bidirectional, window,
    grouped KV heads, q / k RMSNorm) ; x1 = x + Wo(ctx)            (Gemma3: x + RMSp1(Wo(ctx)))
    m = RMS2(x1) ; x = x1 + Wdown(act(Wgate m) * Wup m)            (Gemma3: x1 + RMSp2(...))

then a final RMSNorm, the pool (last token, mean, ...) and sentence-transformers' Dense modules.

Generation (build_generate) is the same graph with the attention over a paged KV cache (attribute
"paged": each token's K / V written to its sequence's blocks, its query attending to every cached
position before it) and, after the final norm, the last token of each sequence through the LM head
and the sampler.
RMSNorm is `add_layernorm` with attrs rms; "post" residual means norm(x) + r instead of
norm(x + r); the residual of a plain pre-norm block rides on the linear (its second input).
"""

from __future__ import annotations

from zoi.frontend.spec import ModelSpec
from zoi.graph.ir import Buffer, Graph, Op


def append_pool(spec: ModelSpec, ops: list[Op], bufs: dict[str, Buffer], x: str) -> None:
    """pool(x) -> "pooled", through the sentence-transformers Dense modules when there are any
    (linears over the B pooled rows; the last writes "pooled")."""
    dense = spec.dense
    name = "pooled0" if dense else "pooled"
    bufs[name] = Buffer(name, "B", spec.hidden)
    ops.append(Op("pool", [x, "cu_seqlens"], name, {}, {"mode": spec.pooling}))
    for k, (_din, dout, _bias, act) in enumerate(dense):
        out = "pooled" if k == len(dense) - 1 else f"pooled{k + 1}"
        bufs[out] = Buffer(out, "B", dout)
        w = {"w": f"dense{k}.w", "b": f"dense{k}.b"}
        ops.append(Op("linear", [name], out, w, {"act": act}))
        name = out


def build_decoder(spec: ModelSpec, paged: bool = False) -> Graph:
    H, I, d = spec.hidden, spec.intermediate, spec.head_dim
    q, kv = spec.heads * d, spec.num_kv_heads * d
    bufs: dict[str, Buffer] = {}
    ops: list[Op] = []

    def buf(name: str, cols: int) -> str:
        bufs[name] = Buffer(name, "T", cols)
        return name

    def lin(x: str, prefix: str, out: str, cols: int, res: str | None = None) -> str:
        ins = [x] if res is None else [x, res]
        w = {"w": f"{prefix}.w", "b": f"{prefix}.b"}
        ops.append(Op("linear", ins, buf(out, cols), w, {"act": "none"}))
        return out

    def norm(x: str, prefix: str, out: str, res: str | None = None) -> str:
        w = {"w": f"{prefix}.w", "b": f"{prefix}.b"}
        attrs = {"eps": spec.eps, "rms": True}
        if res is not None:
            attrs["residual"] = "post"  # norm(x) + res
        ins = [x] if res is None else [x, res]
        ops.append(Op("add_layernorm", ins, buf(out, H), w, attrs))
        return out

    ew = {"word": "embed.word"}
    ops.append(Op("embed", ["ids", "positions"], buf("x0", H), ew, {"eps": spec.eps}))
    x = "x0"
    windows = spec.layer_windows or (0,) * spec.layers
    scale = spec.attn_scale or d**-0.5
    for i in range(spec.layers):
        n = norm(x, f"l{i}.ln1", f"l{i}.n1")
        qkv = lin(n, f"l{i}.qkv", f"l{i}.qkv_out", q + 2 * kv)
        kind = "l" if windows[i] else "g"
        attrs = {
            "heads": spec.heads,
            "head_dim": d,
            "scale": float(scale),
            "kv_heads": spec.num_kv_heads,
            "causal": spec.causal,
        }
        if windows[i]:
            attrs["window"] = int(windows[i])
        if paged:
            attrs["paged"] = True
        aw = {"rope_cos": f"rope.{kind}.cos", "rope_sin": f"rope.{kind}.sin"}
        if spec.qk_norm:
            aw.update(q_norm=f"l{i}.q_norm", k_norm=f"l{i}.k_norm")
            attrs["qk_eps"] = spec.eps
        ops.append(Op("attention", [qkv, "cu_seqlens"], buf(f"l{i}.ctx", q), aw, attrs))
        if spec.sandwich:
            a = lin(f"l{i}.ctx", f"l{i}.o", f"l{i}.attn_out", H)
            x1 = norm(a, f"l{i}.post1", f"l{i}.x1", res=x)
        else:
            x1 = lin(f"l{i}.ctx", f"l{i}.o", f"l{i}.x1", H, res=x)
        m = norm(x1, f"l{i}.ln2", f"l{i}.n2")
        h = lin(m, f"l{i}.ffn1", f"l{i}.ffn_h", 2 * I)
        ops.append(Op("glu", [h], buf(f"l{i}.glu", I), {}, {"act": spec.act}))
        if spec.sandwich:
            f = lin(f"l{i}.glu", f"l{i}.ffn2", f"l{i}.ffn_out", H)
            x = norm(f, f"l{i}.post2", f"l{i}.x2", res=x1)
        else:
            x = lin(f"l{i}.glu", f"l{i}.ffn2", f"l{i}.x2", H, res=x1)
    x = norm(x, "final_ln", "xf")
    append_pool(spec, ops, bufs, x)
    return Graph(ops, bufs)


def build_generate(spec: ModelSpec) -> Graph:
    """The graph of one generation step: the decoder stack over the step's packed tokens with the
    paged KV cache, then for the last token of each sequence the LM head (`lm_head.w` [V, H])
    and the sampler. Causal attention without sliding windows (the cache keeps every position)."""
    if not spec.causal or any(spec.layer_windows):
        raise ValueError("generation runs causal attention over every cached position")
    g = build_decoder(spec, paged=True)
    i = next(k for k, o in enumerate(g.ops) if o.kind == "pool")
    x = g.ops[i].inputs[0]
    ops = g.ops[:i]
    bufs = {n: b for n, b in g.buffers.items() if b.rows == "T"}
    bufs["last"] = Buffer("last", "B", spec.hidden)
    ops.append(Op("pool", [x, "cu_seqlens"], "last", {}, {"mode": "last"}))
    bufs["logits"] = Buffer("logits", "B", spec.vocab_size)
    lm = {"w": "lm_head.w", "b": "lm_head.b"}
    ops.append(Op("linear", ["last"], "logits", lm, {"act": "none"}))
    bufs["tokens"] = Buffer("tokens", "B", 1)
    ops.append(Op("sample", ["logits"], "tokens"))
    return Graph(ops, bufs, ("ids", "positions", "cu_seqlens"), "tokens")
