"""ModelSpec -> IR -> memory plan."""

from zoi.graph.build import build_graph, linear_prefix
from zoi.graph.compiled import CompiledModel, LinearQuant
from zoi.graph.ir import Buffer, Graph, Op
from zoi.graph.planner import Plan, plan_memory

__all__ = [
    "Buffer",
    "CompiledModel",
    "Graph",
    "LinearQuant",
    "Op",
    "Plan",
    "build_graph",
    "linear_prefix",
    "plan_memory",
]
