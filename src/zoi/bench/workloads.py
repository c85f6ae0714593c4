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
    ids: str = "text"  # "text": real text's ids | "random": random ids of the model's vocabulary

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


def _random(model: str, b: int, s: int, devices=("cpu", "cuda")) -> Workload:
    return Workload(f"{model}-{b}x{s}", model, "fixed", b, s, 1, tuple(devices), ids="random")


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
    # the other architectures: random-init MPNet-base / ModernBERT-base shapes
    _fixed("mpnet-base", 1, 128, ("cpu",)),
    _fixed("mpnet-base", 32, 128, ("cpu",)),
    _fixed("modernbert-base", 1, 128, ("cpu",)),
    _fixed("modernbert-base", 32, 128, ("cpu",)),
    # decoder architectures run as encoders (EmbeddingGemma-300m, Qwen3-Embedding-0.6B shapes,
    # random init): their vocabularies are not the MiniLM tokenizer's, so random ids of the whole
    # vocabulary; CUDA rows where the CUDA backend runs these architectures
    _random("gemma-embed", 1, 128),
    _random("gemma-embed", 32, 128),
    _random("qwen3-embed", 1, 128),
    _random("qwen3-embed", 32, 128),
    # end to end: texts in host memory -> embeddings in host memory, tokenisation included
    _text("minilm", 1, 16),
    _text("minilm", 1, 128),
    _text("minilm", 32, 128),
    _text("minilm", 256, 128, ("cuda",)),
    # 1000 real texts of mixed lengths; padded peers run them in batches of 32 (ST's default)
    Workload("minilm-text-mixed", "minilm", "text-mixed", 1000, None, 32),
]

OPT_IN_MODELS = ("gemma-embed", "qwen3-embed")  # run only when named in --workloads
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
    else:  # the 0.3-0.6B shapes take most of an hour on 2 cores: named, not by default
        out = [w for w in ALL if w.model not in OPT_IN_MODELS]
    return [w for w in out if devices & set(w.devices)]


def random_batch(vocab: int, batch: int, seq: int, seed: int) -> list[np.ndarray]:
    """``batch`` rows of ``seq`` ids drawn uniformly from [1, vocab): every row of the embedding
    table but id 0 (the padding id of most vocabularies; never time zeros)."""
    rng = np.random.default_rng(seed)
    return list(rng.integers(1, vocab, size=(batch, seq), dtype=np.int64).astype(np.int32))


def inputs(
    w: Workload, tok: Tok, index: int, vocab: int | None = None
) -> list[np.ndarray] | list[str]:
    """Token ids of ``w``: real text of exactly ``seq`` tokens per row, random ids of the
    model's ``vocab`` (``ids="random"``), or 64 real texts at their natural lengths (mixed);
    the texts themselves for the text workloads."""
    if w.ids == "random":
        if vocab is None:
            raise ValueError(f"{w.name}: random ids need the model's vocabulary size")
        return random_batch(vocab, w.batch, w.seq, seed=index)
    if w.kind == "text":
        return exact_length_texts(tok, w.batch, w.seq, offset=index * 1000)
    if w.kind == "text-mixed":
        return natural_texts(tok, w.batch, max_len=256)
    if w.kind == "mixed":
        return natural_set(tok, w.batch, max_len=256)
    return exact_length_batch(tok, w.batch, w.seq, offset=index * 1000)
