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

# The rule of the first-row residual an artifact records as "first_row_residual" (an INT8 linear's
# quant record): 2, the second step fixed to a_scale * 2**-8 (zoi.numerics.primitives.
# first_row_residual). `true` was the per-token amax step of earlier versions: refused on load.
FIRST_ROW_RULE = 2


@dataclass
class LinearQuant:
    """How one linear (weight prefix, e.g. 'l0.qkv') is quantised."""

    scheme: str = "dynamic"  # a QuantMode (zoi.graph.quantmode; a str enum): dynamic | static | dynamic_asym | fp32
    amax: float | None = None  # static scheme: calibrated activation absmax
    info: dict[str, Any] = field(
        default_factory=dict
    )  # sqnr_db, smooth alpha, ... (reporting only)
    # INT8 schemes: the first row of each sequence quantised twice, q1 = Q(x), q2 = the residual
    # x - deq(q1) at the fixed step a_scale * 2**-8 (zoi.numerics.primitives.first_row_residual;
    # docs/QUANT.md). Artifacts without the key run without it.
    first_row: bool = False

    def __post_init__(self):
        self.scheme = QuantMode.coerce(self.scheme)  # unknown ones: the loader says so

    def to_dict(self) -> dict:
        d = {"scheme": str(self.scheme), "amax": self.amax, "info": self.info}
        # absent when off (the records of earlier artifacts unchanged) and on float linears
        if self.first_row and QuantMode.coerce(self.scheme).is_int8:
            d["first_row_residual"] = FIRST_ROW_RULE
        return d

    @classmethod
    def from_dict(cls, d: dict) -> LinearQuant:
        return cls(
            d.get("scheme", "dynamic"),
            d.get("amax"),
            d.get("info", {}),
            _first_row_rule(d.get("first_row_residual")),
        )


def _first_row_rule(v) -> bool:
    """A quant record's "first_row_residual": absent / false -> off, FIRST_ROW_RULE -> on; the
    earlier rule (true) and unknown values are refused, so that no artifact runs numerics other
    than those it was compiled (and its SmoothQuant search scored) with."""
    from zoi.errors import CheckpointError

    if v is None or v is False:
        return False
    if type(v) is int and v == FIRST_ROW_RULE:
        return True
    if v is True or (type(v) is int and v == 1):
        raise CheckpointError(
            "this artifact was compiled with the first-row residual of an earlier zoi version "
            '("first_row_residual": true, a per-token amax step), which this version no longer '
            "runs (it fixes the step to a_scale * 2**-8, docs/QUANT.md): recompile the model "
            '(zoi.compile(MODEL, precision="int8", quant_config={"first_row_residual": True}))'
        )
    raise CheckpointError(
        f'unknown first-row residual rule "first_row_residual": {v!r} in the artifact (this '
        f"version runs rule {FIRST_ROW_RULE}): load it with the zoi version that wrote it, or "
        "recompile the model with this one"
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
