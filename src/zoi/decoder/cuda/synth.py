"""Random-init decoders in memory (no folder, no tokenizer) of the benchmark shapes
(zoi.decoder.synthetic.SHAPES): the GPU tests and lab/gpu/decode_bench.py build 1B-parameter
models without writing gigabytes. Scaled as zoi.decoder.synthetic.write_decoder scales them."""

from __future__ import annotations

import numpy as np

from zoi.decoder.api import DecoderSpec
from zoi.decoder.synthetic import SHAPES


def shape_spec(name: str, layers: int | None = None, vocab: int | None = None) -> DecoderSpec:
    s = dict(SHAPES[name])
    heads, hidden = s["heads"], s["hidden"]
    return DecoderSpec(
        arch=s["arch"],
        vocab_size=vocab or s["vocab"],
        hidden_size=hidden,
        intermediate_size=s["inter"],
        num_layers=layers or s["layers"],
        num_heads=heads,
        num_kv_heads=s["kv_heads"],
        head_dim=hidden // heads,
        rms_norm_eps=s.get("eps", 1e-6),
        rope_theta=s.get("rope_theta", 10000.0),
        rope_scaling=s.get("rope_scaling"),
        max_position_embeddings=s.get("max_pos", 2048),
        tie_word_embeddings=s.get("tie", False),
        attention_bias=s["arch"] == "qwen2",
    )


def random_weights(spec: DecoderSpec, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    H, D, KVH, Hd, I = (
        spec.num_heads,
        spec.head_dim,
        spec.num_kv_heads,
        spec.hidden_size,
        spec.intermediate_size,
    )

    def normal(shape, scale):
        a = rng.standard_normal(shape, dtype=np.float32)
        a *= np.float32(scale)
        return a

    def gain(n):
        return 1.0 + normal(n, 0.2)

    w = {"model.embed_tokens.weight": normal((spec.vocab_size, Hd), 0.7)}
    for i in range(spec.num_layers):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = gain(Hd)
        w[p + "post_attention_layernorm.weight"] = gain(Hd)
        for n, rows in (("q", H * D), ("k", KVH * D), ("v", KVH * D)):
            w[p + f"self_attn.{n}_proj.weight"] = normal((rows, Hd), Hd**-0.5)
            if spec.attention_bias:
                w[p + f"self_attn.{n}_proj.bias"] = normal(rows, 0.3)
        w[p + "self_attn.o_proj.weight"] = normal((Hd, H * D), (H * D) ** -0.5)
        if spec.qk_norm:
            w[p + "self_attn.q_norm.weight"] = gain(D)
            w[p + "self_attn.k_norm.weight"] = gain(D)
        w[p + "mlp.gate_proj.weight"] = normal((I, Hd), Hd**-0.5)
        w[p + "mlp.up_proj.weight"] = normal((I, Hd), Hd**-0.5)
        w[p + "mlp.down_proj.weight"] = normal((Hd, I), I**-0.5)
    w["model.norm.weight"] = gain(Hd)
    w["lm_head.weight"] = (
        w["model.embed_tokens.weight"]
        if spec.tie_word_embeddings
        else normal((spec.vocab_size, Hd), 2.8 * Hd**-0.5)
    )
    return w
