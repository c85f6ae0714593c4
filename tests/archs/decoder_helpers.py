"""Random-init checkpoints of the decoder architectures run as encoders (zoi.frontend.archs_decoder),
awkward sizes on purpose: grouped KV heads (6 over 2), a head width that is not hidden / heads,
odd intermediate sizes, sliding windows shorter than the texts, bidirectional Gemma3."""

from __future__ import annotations

import json
from pathlib import Path

DECODER_ARCHS = ["qwen3", "gemma3", "llama", "qwen2", "mistral"]

# (config class, model class, config); transformers 5 writes every default into config.json
DECODER_CONFIGS = {
    "qwen3": (
        "Qwen3Config",
        "Qwen3Model",
        dict(
            hidden_size=40,
            num_hidden_layers=2,
            num_attention_heads=6,
            num_key_value_heads=2,
            head_dim=12,
            intermediate_size=37,
            max_position_embeddings=300,
        ),
    ),
    "gemma3": (
        "Gemma3TextConfig",
        "Gemma3TextModel",
        dict(
            hidden_size=42,
            num_hidden_layers=3,
            num_attention_heads=3,
            num_key_value_heads=1,
            head_dim=16,
            intermediate_size=37,
            max_position_embeddings=300,
            sliding_window=9,  # bidirectional: |i - j| <= 4 on the sliding layers
            layer_types=["sliding_attention", "full_attention", "sliding_attention"],
            use_bidirectional_attention=True,
            query_pre_attn_scalar=20,
        ),
    ),
    "llama": (
        "LlamaConfig",
        "LlamaModel",
        dict(
            hidden_size=40,
            num_hidden_layers=2,
            num_attention_heads=5,
            num_key_value_heads=5,
            intermediate_size=37,
            max_position_embeddings=300,
        ),
    ),
    "qwen2": (
        "Qwen2Config",
        "Qwen2Model",
        dict(
            hidden_size=48,
            num_hidden_layers=2,
            num_attention_heads=6,
            num_key_value_heads=3,
            intermediate_size=53,
            max_position_embeddings=300,
        ),
    ),
    "mistral": (
        "MistralConfig",
        "MistralModel",
        dict(
            hidden_size=40,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=10,
            intermediate_size=37,
            max_position_embeddings=300,
            sliding_window=11,  # causal: 0 <= i - j < 11
        ),
    ),
}


def build_decoder(arch: str, seed: int = 0, **overrides):
    from tests.conftest import random_hf_model

    c, m, kw = DECODER_CONFIGS[arch]
    return random_hf_model(c, m, seed, vocab_size=30522, **{**kw, **overrides})


def decoder_checkpoint(arch: str, folder: Path, seed: int = 0, pooling: str | None = "mean", **kw):
    """A decoder-architecture base model saved as a sentence-transformers folder with `pooling`
    (sentence-transformers' name: mean, lasttoken, cls) or as a plain folder (pooling None)."""
    from tests.conftest import save_checkpoint

    model = build_decoder(arch, seed, **kw)
    save_checkpoint(model, folder, pooling="mean" if pooling else None)
    # the test tokenizer is BERT's WordPiece: name its class, or transformers' AutoTokenizer
    # would read it as the architecture's own (Qwen2Tokenizer, with an out-of-vocabulary pad)
    tok_cfg = {
        "tokenizer_class": "BertTokenizerFast",
        "pad_token": "[PAD]",
        "unk_token": "[UNK]",
        "cls_token": "[CLS]",
        "sep_token": "[SEP]",
        "mask_token": "[MASK]",
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(tok_cfg))
    if pooling and pooling != "mean":
        p = folder / "1_Pooling" / "config.json"
        cfg = json.loads(p.read_text())
        for k in list(cfg):
            if k.startswith("pooling_mode"):
                cfg[k] = False
        cfg[f"pooling_mode_{pooling}" if pooling != "lasttoken" else "pooling_mode_lasttoken"] = (
            True
        )
        if pooling == "cls":
            cfg["pooling_mode_cls_token"] = True
        p.write_text(json.dumps(cfg))
    return model, folder


def add_dense(folder: Path, dims: list[int], seed: int = 0, bias: bool = False) -> list:
    """Append sentence-transformers Dense modules (Identity activation, EmbeddingGemma's) and a
    Normalize after the Pooling module; returns the torch Linear layers (for the expected output)."""
    import torch
    from safetensors.torch import save_file

    torch.manual_seed(seed)
    mods = json.loads((folder / "modules.json").read_text())
    mods = [m for m in mods if not m["type"].endswith("Normalize")]
    layers = []
    for k, (din, dout) in enumerate(zip(dims, dims[1:], strict=False)):
        lin = torch.nn.Linear(din, dout, bias=bias)
        path = folder / f"{2 + k}_Dense"
        path.mkdir(exist_ok=True)
        cfg = {
            "in_features": din,
            "out_features": dout,
            "bias": bias,
            "activation_function": "torch.nn.modules.linear.Identity",
        }
        (path / "config.json").write_text(json.dumps(cfg))
        state = {"linear." + k2: v.contiguous() for k2, v in lin.state_dict().items()}
        save_file(state, path / "model.safetensors")
        mods.append(
            {
                "idx": len(mods),
                "name": str(len(mods)),
                "path": f"{2 + k}_Dense",
                "type": "sentence_transformers.models.Dense",
            }
        )
        layers.append(lin)
    mods.append(
        {
            "idx": len(mods),
            "name": str(len(mods)),
            "path": "",
            "type": "sentence_transformers.models.Normalize",
        }
    )
    (folder / "modules.json").write_text(json.dumps(mods))
    return layers
