"""What the head modules share and name: the heads' names in messages, and the pooling a head
reads. Below api / options / hybrid, so that none of them imports another to get these."""

from __future__ import annotations

import numpy as np


def a_(what: str) -> str:
    return ("an " if what[:1] in "aeiou" else "a ") + what


HEAD_NAMES = {
    "": "embedding (no task head)",
    "seq_cls": "sequence classification (cross-encoder)",
    "token_cls": "token classification",
    "splade": "SPLADE sparse (masked-LM)",
}


def score_pooling(spec) -> str:
    """The pooling of a head model's encoder as an embedding model: the rows its head reads
    ([CLS] for a seq_cls classifier, the last token for an LLM reranker)."""
    if spec.head != "seq_cls":
        return spec.pooling
    return "last" if spec.score_tokens else "cls"


def packed_chunks(cu: np.ndarray, max_tokens: int, max_seqs: int):
    """Consecutive sequences of a packed batch in chunks of at most max_tokens tokens (one
    sequence alone when it is longer) and max_seqs sequences: (s, e, a, z, sub) per chunk,
    sequences s..e-1, tokens a..z-1, sub their cu_seqlens from 0."""
    B = len(cu) - 1
    s = 0
    while s < B:
        e = int(np.searchsorted(cu, cu[s] + max_tokens, side="right")) - 1
        e = min(max(e, s + 1), s + max_seqs, B)
        a, z = int(cu[s]), int(cu[e])
        yield s, e, a, z, np.ascontiguousarray(cu[s : e + 1] - a, dtype=np.int32)
        s = e
