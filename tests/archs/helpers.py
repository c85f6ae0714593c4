"""Random-init checkpoints of the architectures of zoi.frontend.archs, awkward sizes on purpose
(hidden 40, 5 heads of 8, odd intermediate sizes, sequences longer than ModernBERT's window)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

ARCHS = ["mpnet", "modernbert", "electra", "albert"]

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
}

TEXTS = [
    "Hello world!",
    "",
    "a b c d e f g h i j k l m n o p q r s t u v w x y z " * 3,  # ~80 tokens: past the window
    "The quick brown fox.",
    "x",
    " ".join(["tokens"] * 37),
]


PREFIX = {"mpnet": "MPNet", "modernbert": "ModernBert", "electra": "Electra", "albert": "Albert"}


def build(arch: str, seed: int = 0, **overrides):
    from tests.conftest import random_hf_model

    kw = {**CONFIGS[arch], **overrides}
    vocab = 30522 if arch != "mpnet" else 30527
    p = PREFIX[arch]
    return random_hf_model(p + "Config", p + "Model", seed, vocab_size=vocab, **kw)


def checkpoint(arch: str, folder: Path, seed: int = 0, pooling: str | None = "mean", **kw):
    from tests.conftest import save_checkpoint

    model = build(arch, seed, **kw)
    return model, save_checkpoint(model, folder, pooling=pooling)


def hf_hidden(model, ids: np.ndarray) -> np.ndarray:
    import torch

    with torch.no_grad():
        x = torch.from_numpy(ids.astype(np.int64))[None]
        return model(input_ids=x, attention_mask=torch.ones_like(x)).last_hidden_state[0].numpy()


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
