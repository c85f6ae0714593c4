"""A decoder folder -> GGUF (Q8_0 or F32) for llama.cpp, the CPU peer of the decode benchmark.

llama-cpp-python's wheel does not ship llama.cpp's convert_hf_to_gguf.py, so this writes the
file with the `gguf` package's writer: llama / qwen2 / qwen3 architectures, the GPT-2 style BPE
vocabulary of tokenizer.json (padded with unused tokens to the model's vocab_size), llama's q/k
rows permuted to llama.cpp's interleaved RoPE as convert_hf_to_gguf does.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from zoi.decoder.loader import load_decoder


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    # convert_hf_to_gguf.LlamaModel.permute
    return (
        w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    )


def write_gguf(folder, dst, qtype: str = "Q8_0") -> Path:
    import gguf

    spec, w, folder = load_decoder(folder)
    if spec.rope_scaling:
        raise NotImplementedError(
            f"{folder}: rope_scaling {spec.rope_scaling} is not exported to GGUF"
        )
    dst = Path(dst)
    arch = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}[spec.arch]
    wr = gguf.GGUFWriter(str(dst), arch)
    wr.add_name(folder.name)
    wr.add_context_length(spec.max_position_embeddings)
    wr.add_embedding_length(spec.hidden_size)
    wr.add_block_count(spec.num_layers)
    wr.add_feed_forward_length(spec.intermediate_size)
    wr.add_head_count(spec.num_heads)
    wr.add_head_count_kv(spec.num_kv_heads)
    wr.add_key_length(spec.head_dim)
    wr.add_value_length(spec.head_dim)
    wr.add_rope_dimension_count(spec.head_dim)
    wr.add_rope_freq_base(spec.rope_theta)
    wr.add_layer_norm_rms_eps(spec.rms_norm_eps)
    q = gguf.GGMLQuantizationType.Q8_0 if qtype == "Q8_0" else gguf.GGMLQuantizationType.F32
    wr.add_file_type(
        gguf.LlamaFileType.MOSTLY_Q8_0 if qtype == "Q8_0" else gguf.LlamaFileType.ALL_F32
    )
    # vocabulary
    tj = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = tj["model"]["vocab"]
    added = {t["content"]: t["id"] for t in tj.get("added_tokens", [])}
    toks = [f"[PAD{i}]" for i in range(spec.vocab_size)]
    types = [gguf.TokenType.UNUSED] * spec.vocab_size
    for t, i in vocab.items():
        if i < spec.vocab_size:
            toks[i], types[i] = t, gguf.TokenType.NORMAL
    for t, i in added.items():
        if i < spec.vocab_size:
            toks[i], types[i] = t, gguf.TokenType.CONTROL
    merges = tj["model"].get("merges", [])
    merges = [m if isinstance(m, str) else " ".join(m) for m in merges]
    wr.add_tokenizer_model("gpt2")
    wr.add_tokenizer_pre("default")
    wr.add_token_list(toks)
    wr.add_token_types(types)
    wr.add_token_merges(merges)
    if spec.eos_token_ids:
        wr.add_eos_token_id(spec.eos_token_ids[0])
    wr.add_add_bos_token(False)

    def put(name: str, a: np.ndarray, quant: bool = True) -> None:
        a = np.ascontiguousarray(a, np.float32)
        if quant and a.ndim == 2 and q != gguf.GGMLQuantizationType.F32 and a.shape[1] % 32 == 0:
            wr.add_tensor(name, gguf.quants.quantize(a, q), raw_dtype=q)
        else:
            wr.add_tensor(name, a)

    put("token_embd.weight", w["model.embed_tokens.weight"])
    put("output_norm.weight", w["model.norm.weight"])
    if not spec.tie_word_embeddings:
        put("output.weight", w["lm_head.weight"])
    for i in range(spec.num_layers):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        qw, kw = w[p + "self_attn.q_proj.weight"], w[p + "self_attn.k_proj.weight"]
        if arch == "llama":
            qw, kw = _permute(qw, spec.num_heads), _permute(kw, spec.num_kv_heads)
        put(b + "attn_norm.weight", w[p + "input_layernorm.weight"])
        put(b + "attn_q.weight", qw)
        put(b + "attn_k.weight", kw)
        put(b + "attn_v.weight", w[p + "self_attn.v_proj.weight"])
        put(b + "attn_output.weight", w[p + "self_attn.o_proj.weight"])
        if spec.attention_bias:
            put(b + "attn_q.bias", w[p + "self_attn.q_proj.bias"])
            put(b + "attn_k.bias", w[p + "self_attn.k_proj.bias"])
            put(b + "attn_v.bias", w[p + "self_attn.v_proj.bias"])
        if spec.qk_norm:
            put(b + "attn_q_norm.weight", w[p + "self_attn.q_norm.weight"])
            put(b + "attn_k_norm.weight", w[p + "self_attn.k_norm.weight"])
        put(b + "ffn_norm.weight", w[p + "post_attention_layernorm.weight"])
        put(b + "ffn_gate.weight", w[p + "mlp.gate_proj.weight"])
        put(b + "ffn_up.weight", w[p + "mlp.up_proj.weight"])
        put(b + "ffn_down.weight", w[p + "mlp.down_proj.weight"])
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    return dst
