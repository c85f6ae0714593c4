"""A tiny BERT spec and a word-hash tokenizer for fast quantisation tests (weights: tests/fixtures.py)."""

from __future__ import annotations

import numpy as np
from tests.fixtures import tiny_weights  # noqa: F401  (re-exported)

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
