"""The reference backend: the golden numpy engine (zoi.numerics.reference) behind the
Backend interface, float32 by default or float64. Slow; every other backend is tested
against it, and device="reference" runs it."""

from __future__ import annotations

import numpy as np

from zoi.backends.base import SyncSubmit
from zoi.graph.compiled import CompiledModel
from zoi.numerics.reference import execute, l2_normalize


def run_graph(
    model: CompiledModel, ids, positions, cu_seqlens, dtype=np.float32, types=None, tasks=None
) -> dict[str, np.ndarray]:
    """Run a CompiledModel (its quantisation emulated); returns every buffer by name.
    tasks: int32 [B] task adapter per sequence (-1: none), for a model with adapters."""
    return execute(
        model.graph,
        model.weights,
        ids,
        positions,
        cu_seqlens,
        model.quant,
        dtype,
        types=types,
        tasks=tasks,
    )


class ReferenceBackend(SyncSubmit):
    """The numpy golden engine behind the Backend interface (zoi.backends.base), float32 by
    default, or float64."""

    name = "reference"

    def __init__(self, model: CompiledModel, dtype=np.float32):
        self.model = model
        self.dtype = dtype

    def run(self, ids, positions, cu_seqlens, normalize: bool) -> np.ndarray:
        return self._run(ids, positions, cu_seqlens, normalize, None)

    def _run(self, ids, positions, cu_seqlens, normalize: bool, tasks) -> np.ndarray:
        env = run_graph(self.model, ids, positions, cu_seqlens, self.dtype, tasks=tasks)
        out = env[self.model.graph.output]
        if normalize:
            out = l2_normalize(out)
        return np.ascontiguousarray(out, dtype=np.float32)

    def run_into(self, ids, positions, cu_seqlens, normalize: bool, out: np.ndarray) -> np.ndarray:
        out[: len(cu_seqlens) - 1] = self.run(ids, positions, cu_seqlens, normalize)
        return out

    def run_tasks_into(
        self, ids, positions, cu_seqlens, normalize: bool, out: np.ndarray, tasks
    ) -> np.ndarray:
        """Task adapters (zoi.backends.base.TaskRunner): run_into with each sequence's task."""
        out[: len(cu_seqlens) - 1] = self._run(ids, positions, cu_seqlens, normalize, tasks)
        return out

    def run_outputs(self, ids, positions, cu_seqlens, types=None, taps=()) -> dict:
        """Heads (zoi.backends.base.HeadRunner): the graph's output and each buffer of taps."""
        env = run_graph(self.model, ids, positions, cu_seqlens, self.dtype, types)
        names = (self.model.graph.output, *taps)
        return {n: np.ascontiguousarray(env[n], dtype=np.float32) for n in names}

    def memory(self) -> dict:
        return {
            "weights_bytes": self.model.weight_bytes(),
            "arena_bytes": self.model.plan.arena_bytes,
        }
