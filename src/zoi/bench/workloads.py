"""The workloads of BENCHMARKS.md and their inputs (the same token ids for every provider)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from zoi.bench.text import (
    Tok,
    exact_length_batch,
    exact_length_texts,
    natural_set,
    natural_texts,
)


@dataclass
class Workload:
    name: str  # "minilm-1x16", "minilm-mixed", "bert-base-32x128"
    model: str
    kind: str  # "fixed" | "mixed" (token ids in) | "text" | "text-mixed" (texts in)
    batch: int
    seq: int | None  # tokens per sequence (fixed shapes)
    peer_batches: int = 1  # padded batches the peers run it as (mixed: sorted into 4)
    devices: tuple[str, ...] = ("cpu", "cuda")

    @property
    def text(self) -> bool:
        """Texts in, embeddings out: every provider tokenises (its own way) inside the call."""
        return self.kind.startswith("text")

    def to_json(self) -> dict:
        d = asdict(self)
        d["devices"] = list(self.devices)
        return d


def _fixed(model: str, b: int, s: int, devices=("cpu", "cuda")) -> Workload:
    return Workload(f"{model}-{b}x{s}", model, "fixed", b, s, 1, tuple(devices))


def _text(model: str, b: int, s: int, devices=("cpu", "cuda")) -> Workload:
    return Workload(f"{model}-text-{b}x{s}", model, "text", b, s, 1, tuple(devices))


ALL: list[Workload] = [
    _fixed("minilm", 1, 16),
    _fixed("minilm", 1, 128),
    _fixed("minilm", 8, 128),
    _fixed("minilm", 32, 128),
    _fixed("minilm", 256, 128, ("cuda",)),
    Workload("minilm-mixed", "minilm", "mixed", 64, None, 4),
    _fixed("bert-base", 1, 128),
    _fixed("bert-base", 32, 128),
    _fixed("bert-base", 256, 128, ("cuda",)),
    # the other architectures (issue 20): random-init MPNet-base / ModernBERT-base shapes
    _fixed("mpnet-base", 1, 128, ("cpu",)),
    _fixed("mpnet-base", 32, 128, ("cpu",)),
    _fixed("modernbert-base", 1, 128, ("cpu",)),
    _fixed("modernbert-base", 32, 128, ("cpu",)),
    # end to end: texts in host memory -> embeddings in host memory, tokenisation included
    _text("minilm", 1, 16),
    _text("minilm", 1, 128),
    _text("minilm", 32, 128),
    _text("minilm", 256, 128, ("cuda",)),
    # 1000 real texts of mixed lengths; padded peers run them in batches of 32 (ST's default)
    Workload("minilm-text-mixed", "minilm", "text-mixed", 1000, None, 32),
]

QUICK = ("minilm-1x16", "minilm-1x128", "minilm-8x128", "minilm-mixed")


def select(names: list[str] | None, quick: bool, devices: set[str]) -> list[Workload]:
    if names:
        known = {w.name: w for w in ALL}
        bad = [n for n in names if n not in known]
        if bad:
            raise ValueError(f"unknown workload(s) {bad}; known: {sorted(known)}")
        out = [known[n] for n in names]
    elif quick:
        out = [w for w in ALL if w.name in QUICK]
    else:
        out = list(ALL)
    return [w for w in out if devices & set(w.devices)]


def inputs(w: Workload, tok: Tok, index: int) -> list[np.ndarray] | list[str]:
    """Token ids of ``w``: real text of exactly ``seq`` tokens per row, or 64 real texts at
    their natural lengths (mixed); the texts themselves for the text workloads."""
    if w.kind == "text":
        return exact_length_texts(tok, w.batch, w.seq, offset=index * 1000)
    if w.kind == "text-mixed":
        return natural_texts(tok, w.batch, max_len=256)
    if w.kind == "mixed":
        return natural_set(tok, w.batch, max_len=256)
    return exact_length_batch(tok, w.batch, w.seq, offset=index * 1000)
