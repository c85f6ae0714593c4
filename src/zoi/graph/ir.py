"""The IR: a short list of ops over packed tokens with static column counts (docs/ARCHITECTURE.md)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

# every op of the IR; "sample" (generation): one token per sequence from its row of logits
OP_KINDS = ("embed", "linear", "attention", "add_layernorm", "pool", "glu", "sample")
ACTS = (
    "none",
    "gelu",
    "gelu_tanh",
    "relu",
    "sigmoid",
    "tanh",
    "silu",
)  # a linear's "act" attribute
POOL_MODES = ("mean", "cls", "max", "splade", "last")  # splade: max over tokens of log1p(relu(x))


@dataclass
class Buffer:
    name: str
    rows: str  # "T" (tokens) or "B" (sequences)
    cols: int
    dtype: str = "f32"  # "i8": an INT8 copy of an activation (zoi.graph.fusion)

    def nbytes(self, max_tokens: int, max_batch: int) -> int:
        rows = max_tokens if self.rows == "T" else max_batch
        return rows * self.cols * (1 if self.dtype == "i8" else 4)


@dataclass
class Op:
    kind: str
    inputs: list[str]
    output: str
    weights: dict[str, str] = field(default_factory=dict)
    attrs: dict = field(default_factory=dict)

    @property
    def prefix(self) -> str:
        """A linear's weight prefix, e.g. 'l0.qkv' (its weights are prefix.w / prefix.b): the name
        the quantiser, the plans and the backends key a linear's tables by."""
        return self.weights["w"].rsplit(".", 1)[0]

    def __post_init__(self):
        if self.kind not in OP_KINDS:
            raise ValueError(f"unknown op kind {self.kind!r}: the IR has {', '.join(OP_KINDS)}")
        if self.kind in ("linear", "glu") and self.attrs.get("act", "none") not in ACTS:
            raise ValueError(
                f"unknown activation {self.attrs['act']!r} of linear {self.output!r}: "
                f"the IR has {', '.join(ACTS)}"
            )


@dataclass
class Graph:
    ops: list[Op]
    buffers: dict[str, Buffer]
    inputs: tuple[str, ...] = ("ids", "positions", "cu_seqlens")
    output: str = "pooled"

    def to_dict(self) -> dict:
        return {
            "ops": [asdict(o) for o in self.ops],
            "buffers": [asdict(b) for b in self.buffers.values()],
            "inputs": list(self.inputs),
            "output": self.output,
        }

    @classmethod
    def from_dict(cls, d: dict) -> Graph:
        bufs = {b["name"]: Buffer(**b) for b in d["buffers"]}
        return cls([Op(**o) for o in d["ops"]], bufs, tuple(d["inputs"]), d["output"])

    def linears(self) -> list[Op]:
        return [o for o in self.ops if o.kind == "linear"]
