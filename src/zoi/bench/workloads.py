"""The workloads of BENCHMARKS.md and their inputs (the same token ids for every provider)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from zoi.bench.text import Tok, exact_length_batch, natural_set


@dataclass
class Workload:
    name: str  # "minilm-1x16", "minilm-mixed", "bert-base-32x128"
    model: str
    kind: str  # "fixed" | "mixed"
    batch: int
    seq: int | None  # tokens per sequence (fixed shapes)
    peer_batches: int = 1  # padded batches the peers run it as (mixed: sorted into 4)
    devices: tuple[str, ...] = ("cpu", "cuda")

    def to_json(self) -> dict:
        d = asdict(self)
        d["devices"] = list(self.devices)
        return d


def _fixed(model: str, b: int, s: int, devices=("cpu", "cuda")) -> Workload:
    return Workload(f"{model}-{b}x{s}", model, "fixed", b, s, 1, tuple(devices))


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


def inputs(w: Workload, tok: Tok, index: int) -> list[np.ndarray]:
    """Token ids of ``w``: real text of exactly ``seq`` tokens per row, or 64 real texts at
    their natural lengths (mixed)."""
    if w.kind == "mixed":
        return natural_set(tok, w.batch, max_len=256)
    return exact_length_batch(tok, w.batch, w.seq, offset=index * 1000)
