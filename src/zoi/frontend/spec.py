"""ModelSpec: the architecture-neutral description of an encoder (docs/ARCHITECTURE.md)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

SUPPORTED_ACTS = ("gelu", "gelu_tanh", "relu")  # the FFN activation (`act`)
SUPPORTED_POOLING = ("mean", "cls", "max")  # `pooling`


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

    def __post_init__(self):
        if self.act not in SUPPORTED_ACTS:
            raise ValueError(
                f"ModelSpec.act {self.act!r} is not supported; zoi runs {', '.join(SUPPORTED_ACTS)}"
            )
        if self.pooling not in SUPPORTED_POOLING:
            raise ValueError(
                f"ModelSpec.pooling {self.pooling!r} is not supported; zoi runs "
                f"{', '.join(SUPPORTED_POOLING)}"
            )

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
