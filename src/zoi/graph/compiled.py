"""CompiledModel: everything a backend needs (spec, graph, memory plan, weights, quantisation)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from zoi.frontend.spec import ModelSpec
from zoi.graph.build import build_graph
from zoi.graph.ir import Graph
from zoi.graph.planner import Plan, plan_memory
from zoi.graph.quantmode import QuantMode


@dataclass
class LinearQuant:
    """How one linear (weight prefix, e.g. 'l0.qkv') is quantised."""

    scheme: str = "dynamic"  # a QuantMode (zoi.graph.quantmode; a str enum): dynamic | static | dynamic_asym | fp32
    amax: float | None = None  # static scheme: calibrated activation absmax
    info: dict[str, Any] = field(
        default_factory=dict
    )  # sqnr_db, smooth alpha, ... (reporting only)
    # INT8 schemes: the first row of each sequence quantised twice, q1 = Q(x), q2 = Q(x - deq(q1))
    # per token (zoi.numerics.primitives.first_row_residual; docs/QUANT.md). Artifacts without the
    # key run without it.
    first_row: bool = False

    def __post_init__(self):
        self.scheme = QuantMode.coerce(self.scheme)  # unknown ones: the loader says so

    def to_dict(self) -> dict:
        d = {"scheme": str(self.scheme), "amax": self.amax, "info": self.info}
        # absent when off (the records of earlier artifacts unchanged) and on float linears
        if self.first_row and QuantMode.coerce(self.scheme).is_int8:
            d["first_row_residual"] = True
        return d

    @classmethod
    def from_dict(cls, d: dict) -> LinearQuant:
        return cls(
            d.get("scheme", "dynamic"),
            d.get("amax"),
            d.get("info", {}),
            bool(d.get("first_row_residual", False)),
        )


@dataclass
class CompiledModel:
    spec: ModelSpec
    graph: Graph
    plan: Plan
    precision: str  # "fp32" | "int8" | "fp16"
    weights: dict[str, np.ndarray]
    quant: dict[str, LinearQuant] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def build(
        cls,
        spec: ModelSpec,
        weights: dict[str, np.ndarray],
        precision: str,
        max_tokens: int,
        max_batch: int | None = None,
        quant: dict[str, LinearQuant] | None = None,
    ) -> CompiledModel:
        graph = build_graph(spec)
        plan = plan_memory(graph, max_tokens, max_batch)
        return cls(spec, graph, plan, precision, weights, quant or {})

    def position_rows(self) -> int:
        """Positions the model can take (the position table's rows; ModernBERT: its RoPE table's)."""
        w = self.weights.get("embed.pos")
        return (
            int(w.shape[0])
            if w is not None
            else self.spec.max_positions + self.spec.position_offset
        )

    def weight_bytes(self) -> int:
        return int(sum(w.nbytes for w in self.weights.values()))
