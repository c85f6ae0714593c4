"""What the head modules share and name: the heads' names in messages, and the pooling a head
reads. Below api / options / hybrid, so that none of them imports another to get these."""

from __future__ import annotations


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
