"""Random-init decoder checkpoints as Hugging Face folders (config.json, model.safetensors,
tokenizer.json, tokenizer_config.json with a chat template), written with numpy only: the tests
compare them against transformers, the benchmarks run real models' shapes.

The weights are scaled so that logits are peaked (greedy decoding is then decided by margins far
above FP32 rounding), unlike the library's std-0.02 init whose logits are nearly uniform.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

# real models' shapes (config.json of the Hub checkpoints; weights random)
SHAPES = {
    "smollm2-135m": dict(
        arch="llama",
        vocab=49152,
        hidden=576,
        inter=1536,
        layers=30,
        heads=9,
        kv_heads=3,
        tie=True,
        rope_theta=100000.0,
        max_pos=8192,
        eps=1e-5,
    ),
    "qwen2.5-0.5b": dict(
        arch="qwen2",
        vocab=151936,
        hidden=896,
        inter=4864,
        layers=24,
        heads=14,
        kv_heads=2,
        tie=True,
        rope_theta=1000000.0,
        max_pos=32768,
        eps=1e-6,
    ),
    "llama-3.2-1b": dict(
        arch="llama",
        vocab=128256,
        hidden=2048,
        inter=8192,
        layers=16,
        heads=32,
        kv_heads=8,
        tie=True,
        rope_theta=500000.0,
        max_pos=131072,
        eps=1e-5,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 32.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    ),
}

_ARCH = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}


def _corpus() -> list[str]:
    rng = np.random.default_rng(7)
    syll = [
        "ka",
        "zo",
        "mi",
        "ra",
        "te",
        "lu",
        "ne",
        "so",
        "pi",
        "da",
        "gro",
        "ven",
        "shi",
        "qua",
        "ber",
        "é",
        "ü",
        "ñ",
        "日本",
        "语",
        "😀",
        "—",
        "ß",
        "ø",
    ]
    words = ["".join(rng.choice(syll, rng.integers(1, 4))) for _ in range(3000)]
    lines = []
    for _ in range(1500):
        n = int(rng.integers(3, 14))
        lines.append(" ".join(rng.choice(words, n)) + rng.choice([".", "!", "?", ",", ":"]))
    return lines


def write_tokenizer(dst: Path, vocab: int) -> int:
    """A byte-level BPE tokenizer.json trained on a synthetic corpus (at most `vocab` entries);
    returns its size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tr = trainers.BpeTrainer(
        vocab_size=min(vocab, 20000),
        special_tokens=SPECIALS,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(_corpus(), tr)
    tok.save(str(dst / "tokenizer.json"))
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": "<|im_end|>",
        "bos_token": None,
        "pad_token": "<|endoftext|>",
        "chat_template": CHATML,
        "model_max_length": 1 << 20,
    }
    (dst / "tokenizer_config.json").write_text(json.dumps(cfg, indent=1))
    return tok.get_vocab_size()


def write_decoder(
    dst,
    arch: str = "llama",
    vocab: int | None = None,
    hidden: int = 64,
    inter: int = 160,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    head_dim: int | None = None,
    tie: bool = False,
    rope_theta: float = 10000.0,
    rope_scaling: dict | None = None,
    max_pos: int = 512,
    eps: float = 1e-6,
    seed: int = 0,
    eos: bool = False,
    attention_bias: bool = False,
) -> Path:
    """A random-init checkpoint folder; vocab None: the tokenizer's own size (trained to ~400)."""
    from safetensors.numpy import save_file

    dst = Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    tv = write_tokenizer(dst, vocab or 400)
    V = vocab or tv
    D = head_dim or hidden // heads
    rng = np.random.default_rng(seed)

    def lin(n, k):
        return (rng.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32)

    def gain(n):
        return (1.0 + 0.2 * rng.standard_normal(n)).astype(np.float32)

    w = {"model.embed_tokens.weight": (0.7 * rng.standard_normal((V, hidden))).astype(np.float32)}
    bias = arch == "qwen2" or attention_bias
    for i in range(layers):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = gain(hidden)
        w[p + "post_attention_layernorm.weight"] = gain(hidden)
        w[p + "self_attn.q_proj.weight"] = lin(heads * D, hidden)
        w[p + "self_attn.k_proj.weight"] = lin(kv_heads * D, hidden)
        w[p + "self_attn.v_proj.weight"] = lin(kv_heads * D, hidden)
        w[p + "self_attn.o_proj.weight"] = lin(hidden, heads * D)
        if bias:
            for n, m in (("q", heads * D), ("k", kv_heads * D), ("v", kv_heads * D)):
                w[p + f"self_attn.{n}_proj.bias"] = (0.3 * rng.standard_normal(m)).astype(
                    np.float32
                )
            if arch != "qwen2":
                w[p + "self_attn.o_proj.bias"] = (0.1 * rng.standard_normal(hidden)).astype(
                    np.float32
                )
        if arch == "qwen3":
            w[p + "self_attn.q_norm.weight"] = gain(D)
            w[p + "self_attn.k_norm.weight"] = gain(D)
        w[p + "mlp.gate_proj.weight"] = lin(inter, hidden)
        w[p + "mlp.up_proj.weight"] = lin(inter, hidden)
        w[p + "mlp.down_proj.weight"] = lin(hidden, inter)
    w["model.norm.weight"] = gain(hidden)
    if not tie:
        w["lm_head.weight"] = (0.7 * rng.standard_normal((V, hidden)) / np.sqrt(hidden) * 4).astype(
            np.float32
        )
    save_file(w, str(dst / "model.safetensors"), metadata={"format": "pt"})
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(dst / "tokenizer.json"))
    cfg = {
        "architectures": [_ARCH[arch]],
        "model_type": arch,
        "vocab_size": V,
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": D,
        "hidden_act": "silu",
        "rms_norm_eps": eps,
        "rope_theta": rope_theta,
        "rope_scaling": rope_scaling,
        "max_position_embeddings": max_pos,
        "tie_word_embeddings": tie,
        "torch_dtype": "float32",
        "bos_token_id": None,
        "eos_token_id": tok.token_to_id("<|im_end|>") if eos else None,
        "pad_token_id": tok.token_to_id("<|endoftext|>"),
    }
    if arch == "llama":
        cfg["attention_bias"] = attention_bias
        cfg["mlp_bias"] = False
    if arch == "qwen3":
        cfg["attention_bias"] = attention_bias
    if arch in ("qwen2", "qwen3"):
        cfg["use_sliding_window"] = False
    (dst / "config.json").write_text(json.dumps(cfg, indent=1))
    return dst


def write_shape(dst, name: str, seed: int = 0) -> Path:
    """A random-init checkpoint of a real model's shape (SHAPES)."""
    s = dict(SHAPES[name])
    return write_decoder(dst, arch=s.pop("arch"), seed=seed, **s)
