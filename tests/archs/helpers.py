"""Random-init checkpoints of the architectures of zoi.frontend.archs (and archs_rotary), awkward
sizes on purpose (hidden 40, 5 heads of 8, odd intermediate sizes, sequences longer than
ModernBERT's window; NomicBERT / GTE: hidden 90 / 70, heads of 18 / 14, GTE's RoPE scaled)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

ARCHS = ["mpnet", "modernbert", "electra", "albert"]
ROTARY = ["nomic_bert", "gte"]  # tests/archs/test_rotary_encoders.py

CONFIGS = {
    "mpnet": dict(
        hidden_size=40,
        num_hidden_layers=2,
        num_attention_heads=5,
        intermediate_size=71,
        max_position_embeddings=300,
    ),
    "modernbert": dict(
        hidden_size=40,
        num_hidden_layers=4,
        num_attention_heads=5,
        intermediate_size=37,
        max_position_embeddings=400,
        local_attention=16,  # |i - j| <= 8 on layers 1, 2
        global_attn_every_n_layers=3,
        pad_token_id=0,
        bos_token_id=101,
        eos_token_id=102,
        cls_token_id=101,
        sep_token_id=102,
    ),
    "electra": dict(
        hidden_size=40,
        embedding_size=24,
        num_hidden_layers=2,
        num_attention_heads=5,
        intermediate_size=71,
        max_position_embeddings=300,
    ),
    "albert": dict(
        hidden_size=40,
        embedding_size=24,
        num_hidden_layers=4,
        num_hidden_groups=2,
        num_attention_heads=5,
        intermediate_size=71,
        max_position_embeddings=300,
    ),
    "nomic_bert": dict(
        hidden_size=90,
        num_hidden_layers=2,
        num_attention_heads=5,
        intermediate_size=37,
        max_position_embeddings=300,
    ),
    "gte": dict(
        hidden_size=70,
        num_hidden_layers=2,
        num_attention_heads=5,
        intermediate_size=41,
        max_position_embeddings=300,
        type_vocab_size=2,
        pad_token_id=0,
        # gte-base-en-v1.5's fixed NTK (factor 2) as transformers writes it: base x 2, linear
        # factor 2^(2/d), d = 14
        rope_parameters={"rope_type": "linear", "rope_theta": 20000.0, "factor": 2 ** (2 / 14)},
    ),
}

TEXTS = [
    "Hello world!",
    "",
    "a b c d e f g h i j k l m n o p q r s t u v w x y z " * 3,  # ~80 tokens: past the window
    "The quick brown fox.",
    "x",
    " ".join(["tokens"] * 37),
]


PREFIX = {
    "mpnet": "MPNet",
    "modernbert": "ModernBert",
    "electra": "Electra",
    "albert": "Albert",
    "nomic_bert": "NomicBert",
    "gte": "Gte",
}


def build(arch: str, seed: int = 0, **overrides):
    from tests.conftest import random_hf_model

    kw = {**CONFIGS[arch], **overrides}
    if "rope_parameters" in kw:  # the config keeps (and edits) the dict it is given
        kw["rope_parameters"] = dict(kw["rope_parameters"])
    vocab = 30522 if arch != "mpnet" else 30527
    p = PREFIX[arch]
    return random_hf_model(p + "Config", p + "Model", seed, vocab_size=vocab, **kw)


def checkpoint(arch: str, folder: Path, seed: int = 0, pooling: str | None = "mean", **kw):
    from tests.conftest import save_checkpoint

    model = build(arch, seed, **kw)
    save_checkpoint(model, folder, pooling=pooling)
    if arch in ROTARY:  # BERT's WordPiece named: AutoTokenizer would take GTE's for XLM-R's
        tok = {"tokenizer_class": "BertTokenizerFast", "pad_token": "[PAD]", "unk_token": "[UNK]"}
        tok.update(cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]")
        (folder / "tokenizer_config.json").write_text(json.dumps(tok))
    return model, folder


def hf_hidden(model, ids: np.ndarray) -> np.ndarray:
    import torch

    with torch.no_grad():
        x = torch.from_numpy(ids.astype(np.int64))[None]
        return model(input_ids=x, attention_mask=torch.ones_like(x)).last_hidden_state[0].numpy()


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
