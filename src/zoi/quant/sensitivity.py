"""Per-layer sensitivity: SQNR (dB) of each quantised linear's output against FP32, and the
mixed-precision choice that keeps the worst layers in FP32.

`layer_sqnr` runs the FP32 model (the smoothed float weights) over calibration batches and,
at every linear, also computes the emulated INT8 output from the same input; signal and noise
energies are summed over all tokens: SQNR = 10 log10(sum y^2 / sum (y - y_q)^2).
`choose_fallback` keeps a linear in FP32 when its SQNR is under the threshold, worst first,
as long as the weights stay within the byte budget.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from zoi.numerics.reference import linear_apply
from zoi.quant.detforward import run_graph
from zoi.quant.detmath import fixed_sum


def layer_sqnr(
    graph,
    float_weights: dict,
    q_weights: dict,
    quant: dict,
    batches: Sequence,
    progress: bool = False,
) -> dict[str, float]:
    sig: dict[str, float] = {}
    noise: dict[str, float] = {}

    def tap(p, x, y):
        lq = quant.get(p)
        if lq is None or getattr(lq, "scheme", "fp32") == "fp32":
            yq = linear_apply(x, q_weights, p, _as_int8(lq))
        else:
            yq = linear_apply(x, q_weights, p, lq)
        y64 = y.astype(np.float64)
        d = y64 - yq
        sig[p] = sig.get(p, 0.0) + float(fixed_sum(y64 * y64))
        noise[p] = noise.get(p, 0.0) + float(fixed_sum(d * d))

    from tqdm.auto import tqdm

    total = int(sum(len(b[0]) for b in batches))
    with tqdm(
        total=total, desc="per-layer SQNR", unit="tok", disable=not progress, leave=False
    ) as bar:
        for ids, pos, cu in batches:
            run_graph(graph, float_weights, ids, pos, cu, tap=tap)
            bar.update(len(ids))
    return {
        p: (
            float("inf")
            if noise[p] == 0
            else 10.0 * float(np.log10(max(sig[p], 1e-300) / noise[p]))
        )
        for p in sig
    }


class _Dyn:
    scheme = "dynamic"
    amax = None


def _as_int8(lq):
    return lq if lq is not None and getattr(lq, "scheme", "fp32") != "fp32" else _Dyn()


def fallback_cost(n: int, k: int) -> int:
    """Extra bytes of keeping an [n, k] linear in FP32 instead of int8 weights + f32 scales."""
    return n * k * 4 - (n * k + 4 * n)


def choose_fallback(
    sqnr: dict[str, float], threshold_db: float, costs: dict[str, int], budget_bytes: float | None
) -> list[str]:
    """Prefixes to keep in FP32: SQNR < threshold, worst first, within budget_bytes (None: no cap)."""
    chosen: list[str] = []
    left = float("inf") if budget_bytes is None else float(budget_bytes)
    for p in sorted(sqnr, key=lambda q: sqnr[q]):
        if not sqnr[p] < threshold_db:
            break
        if costs[p] <= left:
            chosen.append(p)
            left -= costs[p]
    return chosen
