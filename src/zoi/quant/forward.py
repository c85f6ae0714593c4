"""The quantiser's view of the numpy executor (`zoi.numerics.reference.execute`).

`run_graph` returns the pooled output of a (graph, weights, quant) triple and lets the
caller tap the input and output of every linear (observer statistics, SmoothQuant alpha
search, per-layer SQNR) without building an engine. There is one numpy implementation of
each op, in `zoi.numerics.reference`.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from zoi.numerics.reference import execute, l2_normalize

Tap = Callable[[str, np.ndarray, np.ndarray], None]


def run_graph(
    graph,
    weights: dict,
    ids: np.ndarray,
    positions: np.ndarray,
    cu_seqlens: np.ndarray,
    quant: dict | None = None,
    normalize: bool = False,
    tap: Tap | None = None,
    override: Callable[[str, np.ndarray], np.ndarray | None] | None = None,
    matmul_exact: bool = True,
) -> np.ndarray:
    """Run the graph in float32; returns pooled [B, H] (L2-normalised when normalize)."""
    env = execute(
        graph, weights, ids, positions, cu_seqlens, quant, np.float32, tap, override, matmul_exact
    )
    out = env[graph.output]
    return l2_normalize(out) if normalize else out
