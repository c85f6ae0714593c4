"""A generation checkpoint as the one runtime's IR, for every device: its ModelSpec, its tensors
under the IR's names, and the CompiledModel of zoi.graph.build_decoder.build_generate (the decoder
stack over the paged KV cache, the LM head on each sequence's last token, the sampler) that the CPU
engine (zoi.backends.cpu) and the GPU's generation runtime (zoi.backends.cuda.generate) both build
from.
"""

from __future__ import annotations

import numpy as np

from zoi.decoder.api import DecoderSpec
from zoi.decoder.rope import rope_tables
from zoi.frontend.spec import ModelSpec
from zoi.numerics.primitives import quantize_weight


def model_spec(spec: DecoderSpec, max_seq_len: int) -> ModelSpec:
    """The IR's description of a generation checkpoint (positions up to max_seq_len)."""
    return ModelSpec(
        arch=spec.arch,
        vocab_size=spec.vocab_size,
        hidden=spec.hidden_size,
        layers=spec.num_layers,
        heads=spec.num_heads,
        intermediate=spec.intermediate_size,
        max_positions=max_seq_len,
        eps=spec.rms_norm_eps,
        act="silu",
        pooling="last",
        kv_heads=spec.num_kv_heads,
        head_size=spec.head_dim,
        norm="rmsnorm",
        causal=True,
        qk_norm=spec.qk_norm,
    )


def ir_weights(spec: DecoderSpec, w: dict[str, np.ndarray], max_seq_len: int) -> dict:
    """The checkpoint's tensors under the IR's names (zoi.frontend.archs_decoder's): q / k / v
    and gate / up concatenated, zero biases where the checkpoint has none, the RoPE tables of
    the first max_seq_len positions (every scaling type of zoi.decoder.reference) and the LM head."""
    f32 = np.float32

    def t(name: str) -> np.ndarray:
        return np.ascontiguousarray(w[name], f32)

    def zeros(n: int) -> np.ndarray:
        return np.zeros(n, f32)

    H = spec.hidden_size
    out = {"embed.word": t("model.embed_tokens.weight"), "lm_head.w": t("lm_head.weight")}
    for i in range(spec.num_layers):
        p, n = f"model.layers.{i}.", f"l{i}."
        a = p + "self_attn."
        qkv = [w[a + f"{x}_proj.weight"] for x in "qkv"]
        out[n + "qkv.w"] = np.concatenate(qkv).astype(f32)
        rows = sum(len(x) for x in qkv)
        bias = [a + f"{x}_proj.bias" for x in "qkv"]
        out[n + "qkv.b"] = (
            np.concatenate([w[b] for b in bias]).astype(f32) if bias[0] in w else zeros(rows)
        )
        out[n + "o.w"] = t(a + "o_proj.weight")
        out[n + "o.b"] = t(a + "o_proj.bias") if a + "o_proj.bias" in w else zeros(H)
        gu = [w[p + "mlp.gate_proj.weight"], w[p + "mlp.up_proj.weight"]]
        out[n + "ffn1.w"] = np.concatenate(gu).astype(f32)
        out[n + "ffn1.b"] = zeros(2 * spec.intermediate_size)
        out[n + "ffn2.w"] = t(p + "mlp.down_proj.weight")
        out[n + "ffn2.b"] = zeros(H)
        for k, src in (("ln1", "input_layernorm"), ("ln2", "post_attention_layernorm")):
            out[n + k + ".w"], out[n + k + ".b"] = t(p + src + ".weight"), zeros(H)
        if spec.qk_norm:
            out[n + "q_norm"] = t(a + "q_norm.weight")
            out[n + "k_norm"] = t(a + "k_norm.weight")
    out["final_ln.w"], out["final_ln.b"] = t("model.norm.weight"), zeros(H)
    cos, sin = rope_tables(spec, max_seq_len)
    out["rope.g.cos"] = np.ascontiguousarray(cos, f32)
    out["rope.g.sin"] = np.ascontiguousarray(sin, f32)
    return out


def quantize_linears(graph, weights: dict) -> dict:
    """W8A8: every linear's weight as INT8 per output channel with its scales (w_q, w_scale),
    the LM head included; the quantiser's records, one per linear (dynamic per-token inputs)."""
    from zoi.graph.compiled import LinearQuant

    quant = {}
    for op in graph.linears():
        p = op.prefix
        q, s = quantize_weight(weights.pop(f"{p}.w"))
        weights[f"{p}.w_q"], weights[f"{p}.w_scale"] = q, s
        quant[p] = LinearQuant("dynamic")
    return quant


def generate_model(
    spec: DecoderSpec,
    weights: dict[str, np.ndarray],
    max_seq_len: int,
    precision: str,
    max_tokens: int,
    max_batch: int,
    quantize: bool | None = None,
):
    """The CompiledModel of one generation step (build_generate) planned for max_tokens tokens of
    max_batch sequences; quantize (default: precision "int8"): W8A8's INT8 weights made here
    (the CPU); the GPU packs float32 weights itself (RMSNorm gains folded first)."""
    from zoi.graph.build_decoder import build_generate
    from zoi.graph.compiled import CompiledModel
    from zoi.graph.planner import plan_memory

    mspec = model_spec(spec, max_seq_len)
    graph = build_generate(mspec)
    w = ir_weights(spec, weights, max_seq_len)
    if quantize is None:
        quantize = precision == "int8"
    quant = quantize_linears(graph, w) if quantize else {}
    plan = plan_memory(graph, max_tokens, max_batch)
    return CompiledModel(mspec, graph, plan, precision, w, quant)
