"""The quantiser's forward passes on the native CPU engine (zoi._cpu), both cores.

- `LinearInputs`: the FP32 engine over calibration batches, stopped before every linear so
  that its input is read from the engine's arena (`Engine.run_steps` + `Engine.arena`): the
  statistics of calibration (zoi.quant.calibrate), the FP32 yardstick (pooled outputs), the
  per-layer SQNR and the static scheme's observers all read the engine's own FP32 kernels'
  activations, one batch at a time (nothing of a batch is kept after it).
- `int8_engine`: a CpuBackend over candidate INT8 weights (the SmoothQuant search): the
  kernels the artifact will run, integer accumulation as zoi.numerics.primitives.

The arena is the planner's, liveness-planned: a linear's input is live (its bytes not yet
reused) right before the linear runs, which is when it is read; the view is valid until the
next run.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from zoi.graph.build import linear_prefix

# the native step each IR op becomes in an FP32 engine (one step per op: no int8 copies)
_STEP_KIND = {
    "embed": "embed",
    "linear": "gemm_f32",
    "attention": "attention",
    "add_layernorm": "layernorm",
    "pool": "pool",
    "glu": "glu",
}

Visit = Callable[[str, np.ndarray], None]


def _model(spec, weights: dict, precision: str, max_tokens: int, quant=None, graph=None):
    """A CompiledModel of spec (its own graph, or a copy of `graph`: a backend writes its
    fusion attributes on the ops) planned for max_tokens tokens."""
    import copy

    from zoi.graph.compiled import CompiledModel
    from zoi.graph.planner import plan_memory

    if graph is None:
        return CompiledModel.build(spec, weights, precision, max_tokens, max_tokens, quant or {})
    g = copy.deepcopy(graph)
    return CompiledModel(
        spec, g, plan_memory(g, max_tokens, max_tokens), precision, weights, quant or {}
    )


class LinearInputs:
    """The FP32 CPU engine of (spec, weights) for batches of at most max_tokens tokens.

    run(ids, positions, cu_seqlens, visit) calls visit(prefix, x) with the input x [rows, K]
    (a read-only float32 view into the arena, valid during the call) of every linear, in
    graph order, and returns the graph's output [B, H] (float32, not normalised)."""

    def __init__(
        self, spec, weights: dict, max_tokens: int, nthreads: int | None = None, graph=None
    ):
        from zoi.backends.cpu.backend import CpuBackend

        model = _model(spec, weights, "fp32", max_tokens, graph=graph)
        self.backend = CpuBackend(model, nthreads=nthreads)
        self.graph = model.graph
        plan, g = model.plan, model.graph
        eng = self.backend.engine
        kinds = [s["kind"] for s in eng.steps_info()]
        want = [_STEP_KIND.get(op.kind, op.kind) for op in g.ops]
        if kinds != want:  # the step index of an op is its index in the graph
            raise RuntimeError(
                f"the FP32 engine's steps {kinds} do not match the graph's ops {want}"
            )
        self.engine = eng
        self.num_steps = len(kinds)
        self.arena = eng.arena()
        # (step, prefix, input offset, columns, input rows "T" / "B")
        self.linears: list[tuple[int, str, int, int, str]] = []
        for i, op in enumerate(g.ops):
            if op.kind == "linear":
                b = g.buffers[op.inputs[0]]
                self.linears.append(
                    (i, linear_prefix(op), plan.offsets[op.inputs[0]], b.cols, b.rows)
                )
        ob = g.buffers[g.output]
        self.out = (plan.offsets[g.output], ob.cols, ob.rows)
        self.prefixes = [p for _, p, _, _, _ in self.linears]
        release_file_pages(weights)  # packed now: the file's pages need not stay resident

    def view(self, off: int, rows: int, cols: int) -> np.ndarray:
        return self.arena[off : off + rows * cols * 4].view(np.float32).reshape(rows, cols)

    def run(self, ids, positions, cu_seqlens, visit: Visit | None = None) -> np.ndarray:
        ids = np.ascontiguousarray(ids, dtype=np.int32)
        positions = np.ascontiguousarray(positions, dtype=np.int32)
        cu = np.ascontiguousarray(cu_seqlens, dtype=np.int32)
        T, B = len(ids), len(cu) - 1
        done = 0
        if visit is not None:
            for step, p, off, cols, rows in self.linears:
                self.engine.run_steps(ids, positions, cu, done, step)
                done = step
                visit(p, self.view(off, T if rows == "T" else B, cols))
        self.engine.run_steps(ids, positions, cu, done, self.num_steps)
        off, cols, rows = self.out
        return self.view(off, T if rows == "T" else B, cols).copy()


def release_file_pages(weights: dict) -> int:
    """Drop this process's resident pages of every file mapping the weights are views of (a
    checkpoint's safetensors): what is read again faults back from the page cache, so the
    compile's resident memory holds only what a step is using. Returns the bytes advised."""
    import mmap

    from zoi.backends.cpu.backend import _release_file_pages

    seen: dict[int, np.ndarray] = {}
    for a in weights.values():
        base = a
        while isinstance(base, np.ndarray):
            if isinstance(base, np.memmap) and isinstance(base.base, mmap.mmap):
                seen.setdefault(id(base.base), base)
                break
            base = base.base
    return _release_file_pages(list(seen.values()))


def l2_normalize(x: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length (float64 arithmetic, float32 result)."""
    x64 = np.asarray(x, np.float64)
    n = np.sqrt(np.einsum("ij,ij->i", x64, x64))[:, None]
    return (x64 / np.maximum(n, 1e-12)).astype(np.float32)


def int8_engine(spec, weights: dict, quant: dict, max_tokens: int, graph=None):
    """A CpuBackend for INT8 weights (LinearQuant per linear) and batches of max_tokens tokens."""
    from zoi.backends.cpu.backend import CpuBackend

    return CpuBackend(_model(spec, weights, "int8", max_tokens, quant, graph))


def batch_tokens(batches) -> int:
    """The largest batch (tokens): the engines' max_tokens."""
    return max((len(b[0]) for b in batches), default=1)
