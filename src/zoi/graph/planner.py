"""Liveness-based memory planning: every intermediate gets an offset in one arena.

Sizes are fixed by max_tokens / max_batch, so the arena is reserved once (ggml-alloc's
"plan memory, don't allocate it") and a call never allocates. A buffer is live from the op
that writes it to the last op that reads it; an op's output never shares bytes with its inputs.
"""

from __future__ import annotations

from dataclasses import dataclass

from zoi.graph.ir import Graph

ALIGN = 64


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


@dataclass
class Plan:
    offsets: dict[str, int]
    sizes: dict[str, int]
    live: dict[str, tuple[int, int]]  # buffer -> (first op index writing, last op index reading)
    arena_bytes: int
    max_tokens: int
    max_batch: int

    def to_dict(self) -> dict:
        return {
            "offsets": self.offsets,
            "sizes": self.sizes,
            "live": {k: list(v) for k, v in self.live.items()},
            "arena_bytes": self.arena_bytes,
            "max_tokens": self.max_tokens,
            "max_batch": self.max_batch,
        }

    @classmethod
    def from_dict(cls, d: dict) -> Plan:
        return cls(
            d["offsets"],
            d["sizes"],
            {k: tuple(v) for k, v in d["live"].items()},
            d["arena_bytes"],
            d["max_tokens"],
            d["max_batch"],
        )


def liveness(graph: Graph) -> dict[str, tuple[int, int]]:
    live: dict[str, list[int]] = {}
    for i, op in enumerate(graph.ops):
        for name in op.inputs:
            if name in live:
                live[name][1] = i
        live[op.output] = [i, i]
    live[graph.output][1] = len(graph.ops)  # the output survives the run
    pools = [op for op in graph.ops if op.kind == "pool"]
    if pools:  # so do the token states the pool reads (encode(output_value="token_embeddings")
        # reads them back after the run, also where Dense modules follow the pool)
        live[pools[-1].inputs[0]][1] = len(graph.ops)
    return {k: (v[0], v[1]) for k, v in live.items()}


def _place(
    order: list[str], live: dict[str, tuple[int, int]], sizes: dict[str, int]
) -> dict[str, int]:
    """Put each buffer, in `order`, at the lowest offset free of every already placed buffer
    whose live range overlaps its own."""
    placed: list[tuple[int, int, int, int]] = []  # (offset, size, first, last)
    offsets: dict[str, int] = {}
    for n in order:
        s0, e0 = live[n]
        busy = sorted((o, o + sz) for o, sz, s1, e1 in placed if s1 <= e0 and s0 <= e1)
        off = 0
        for a, b in busy:
            if off + sizes[n] <= a:
                break
            off = max(off, b)
        offsets[n] = off
        placed.append((off, sizes[n], s0, e0))
    return offsets


def plan_memory(graph: Graph, max_tokens: int, max_batch: int | None = None) -> Plan:
    """Offline placement (TFLite's arena planner): try a few orders (largest first, longest
    lived first, first use first), keep the smallest arena. On encoder graphs this reaches the
    lower bound, the peak of simultaneously live bytes (tests/test_planner.py checks it)."""
    if max_tokens < 1:
        raise ValueError("max_tokens must be >= 1")
    max_batch = max_tokens if max_batch is None else max_batch
    if max_batch < 1:
        raise ValueError("max_batch must be >= 1")
    live = liveness(graph)
    sizes = {n: _align(graph.buffers[n].nbytes(max_tokens, max_batch)) for n in live}
    orders = [
        sorted(live, key=lambda n: (-sizes[n], live[n][0])),
        sorted(live, key=lambda n: (-(live[n][1] - live[n][0]), -sizes[n])),
        sorted(live, key=lambda n: live[n][0]),
    ]
    best: dict[str, int] | None = None
    best_end = -1
    for order in orders:
        offsets = _place(order, live, sizes)
        end = max((offsets[n] + sizes[n] for n in offsets), default=0)
        if best is None or end < best_end:
            best, best_end = offsets, end
    return Plan(best or {}, sizes, live, max(best_end, 0), max_tokens, max_batch)


def place_buffers(
    live: dict[str, tuple[int, int]], sizes: dict[str, int]
) -> tuple[dict[str, int], int]:
    """The planner for any buffer list (a backend's own, e.g. the CUDA plan's int8 copies
    and quantize outputs): live ranges in launch indices, sizes in bytes (already aligned
    as the backend needs); the same orders as plan_memory, the smallest arena kept.
    Returns (offsets, arena bytes)."""
    orders = [
        sorted(live, key=lambda n: (-sizes[n], live[n][0])),
        sorted(live, key=lambda n: (-(live[n][1] - live[n][0]), -sizes[n])),
        sorted(live, key=lambda n: live[n][0]),
    ]
    best: dict[str, int] = {}
    best_end = -1
    for order in orders:
        offsets = _place(order, live, sizes)
        end = max((offsets[n] + sizes[n] for n in offsets), default=0)
        if best_end < 0 or end < best_end:
            best, best_end = offsets, end
    return best, max(best_end, 0)
