"""ModelSpec: the architecture-neutral description of an encoder (docs/ARCHITECTURE.md)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

SUPPORTED_ACTS = ("gelu", "gelu_tanh", "relu")
SUPPORTED_POOLING = ("mean", "cls", "max")


@dataclass(frozen=True)
class ModelSpec:
    arch: str  # "bert" | "distilbert" | "roberta"
    vocab_size: int
    hidden: int
    layers: int
    heads: int
    intermediate: int
    max_positions: int  # usable tokens per sequence, [CLS]/[SEP] included
    position_offset: int = 0  # RoBERTa: pad_token_id + 1
    type_vocab_size: int = 0  # 0: no token-type table
    eps: float = 1e-12
    act: str = "gelu"
    pooling: str = "mean"
    normalize: bool = False
    name: str = "model"

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> ModelSpec:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise ValueError(f"unknown ModelSpec fields {sorted(unknown)}")
        return cls(**d)

    def replace(self, **kw) -> ModelSpec:
        return dataclasses.replace(self, **kw)
