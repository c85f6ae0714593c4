"""References from transformers for the head tests."""

from __future__ import annotations

import numpy as np


def hf_tokenizer(folder, max_len=None, strategy="longest_first"):
    from tokenizers import Tokenizer

    t = Tokenizer.from_file(str(folder / "tokenizer.json"))
    t.no_padding()
    if max_len:
        t.enable_truncation(max_len, strategy=strategy)
    else:
        t.no_truncation()
    return t


def max_len(model) -> int:
    cfg = model.config
    off = cfg.pad_token_id + 1 if cfg.model_type in ("roberta", "xlm-roberta") else 0
    return cfg.max_position_embeddings - off


def hf_logits(model, tok, inputs) -> list[np.ndarray]:
    """The model's logits ([labels] or [n, labels] per input) one input at a time."""
    import torch

    out = []
    arch = model.config.model_type
    for x in inputs:
        e = tok.encode(*x) if isinstance(x, tuple) else tok.encode(x)
        kw = {}
        if arch == "bert":
            kw["token_type_ids"] = torch.tensor([e.type_ids])
        elif arch != "distilbert":  # RoBERTa: one type; the HF tokenizer's B = 1 is not used
            kw["token_type_ids"] = torch.zeros(1, len(e.ids), dtype=torch.long)
        with torch.no_grad():
            out.append(model(input_ids=torch.tensor([e.ids]), **kw).logits[0].numpy())
    return out


def close(got, ref, rtol=2e-5):
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    assert got.shape == ref.shape, (got.shape, ref.shape)
    assert np.isfinite(got).all()
    scale = max(float(np.abs(ref).max()), 1e-3)
    err = float(np.abs(got - ref).max()) / scale
    assert err < rtol, f"max error {err:.2e} of the largest |value| {scale:.3g}"


def spearman(a, b) -> float:
    ra = np.argsort(np.argsort(a)).astype(np.float64)
    rb = np.argsort(np.argsort(b)).astype(np.float64)
    return float(np.corrcoef(ra, rb)[0, 1])
