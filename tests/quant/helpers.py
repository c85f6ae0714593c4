"""A tiny random BERT (numpy only) and a word-hash tokenizer for fast quantisation tests."""

from __future__ import annotations

import numpy as np

from zoi.frontend.spec import ModelSpec


def tiny_spec(
    hidden: int = 24, layers: int = 2, heads: int = 3, inter: int = 40, vocab: int = 97
) -> ModelSpec:
    return ModelSpec(
        arch="bert",
        vocab_size=vocab,
        hidden=hidden,
        layers=layers,
        heads=heads,
        intermediate=inter,
        max_positions=32,
        type_vocab_size=2,
        eps=1e-12,
        act="gelu",
        pooling="mean",
        normalize=True,
        name="tiny",
    )


def tiny_weights(spec: ModelSpec, seed: int = 0, outliers: bool = True) -> dict[str, np.ndarray]:
    """Random weights; LayerNorm gains with a few large channels, as trained BERTs have."""
    r = np.random.default_rng(seed)
    H, I = spec.hidden, spec.intermediate

    def n(*s, sc=0.2):
        return (r.standard_normal(s) * sc).astype(np.float32)

    def ln():
        w = (1.0 + n(H, sc=0.1)).astype(np.float32)
        if outliers:
            w[r.choice(H, 2, replace=False)] *= 12.0
        return w, n(H, sc=0.1)

    w = {
        "embed.word": n(spec.vocab_size, H, sc=0.5),
        "embed.pos": n(spec.max_positions, H, sc=0.2),
        "embed.type": n(2, H, sc=0.1),
    }
    w["embed.ln.w"], w["embed.ln.b"] = ln()
    for i in range(spec.layers):
        w[f"l{i}.qkv.w"], w[f"l{i}.qkv.b"] = n(3 * H, H), n(3 * H, sc=0.05)
        w[f"l{i}.o.w"], w[f"l{i}.o.b"] = n(H, H), n(H, sc=0.05)
        w[f"l{i}.ln1.w"], w[f"l{i}.ln1.b"] = ln()
        w[f"l{i}.ffn1.w"], w[f"l{i}.ffn1.b"] = n(I, H), n(I, sc=0.05)
        w[f"l{i}.ffn2.w"], w[f"l{i}.ffn2.b"] = n(H, I), n(H, sc=0.05)
        w[f"l{i}.ln2.w"], w[f"l{i}.ln2.b"] = ln()
    return w


class WordTokenizer:
    """[CLS]=1, words hashed into [3, vocab), [SEP]=2; truncates to max_positions."""

    def __init__(self, vocab: int, max_positions: int = 32):
        self.vocab, self.max_positions = vocab, max_positions

    def encode_ids(self, texts: list[str]) -> list[np.ndarray]:
        out = []
        for t in texts:
            ids = [
                3 + (sum(ord(c) * 31**k for k, c in enumerate(wd)) % (self.vocab - 3))
                for wd in t.lower().split()
            ]
            out.append(np.array([1] + ids[: self.max_positions - 2] + [2], np.int32))
        return out


def texts(n: int, seed: int = 0) -> list[str]:
    r = np.random.default_rng(seed)
    words = "the a cat dog ran fast slow red blue house river model data text sky under over quietly".split()
    return [" ".join(r.choice(words, int(r.integers(1, 20)))) for _ in range(n)]
