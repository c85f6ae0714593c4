"""Per-layer sensitivity: SQNR (dB) of each quantised linear's output against FP32, and the
mixed-precision choice that keeps the worst layers in FP32.

`layer_sqnr` runs the FP32 CPU engine (zoi.quant.native.LinearInputs) over calibration
batches and, at every linear, computes its FP32 output (numpy) and its INT8 output (the CPU
core's INT8 linear kernel, whose integers are zoi.numerics.primitives') from the same input;
signal and noise energies are summed over all tokens: SQNR = 10 log10(sum y^2 / sum (y -
y_q)^2). Two linears' products run at a time on the two
workers of zoi.quant.blas, summed in the order of the graph.
`choose_fallback` keeps a linear in FP32 when its SQNR is under the threshold, worst first,
as long as the weights stay within the byte budget.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

from zoi.numerics.reference import linear_apply
from zoi.quant import blas


def layer_sqnr(
    runner,
    batches: Mapping[str, Sequence],
    float_weights: dict,
    q_weights: dict,
    quant: dict,
    transform: Callable[[str, np.ndarray], np.ndarray] | None = None,
    out_scale: Mapping[str, np.ndarray | None] | None = None,
    progress: bool = False,
) -> dict[str, dict[str, float]]:
    """{group: {prefix: SQNR dB}} over each group's batches. float_weights: the FP32 model the
    engine runs (runner's); q_weights: the INT8 linears, rounded from a smoothed copy of it;
    transform(p, x): the input buffer the INT8 linear p reads, from the engine's x (None: x
    itself); out_scale[p] [N]: the smoothed linear's output over the FP32 one's (None: 1).
    The smoothed FP32 output is the FP32 one times out_scale (SmoothQuant keeps the
    function; a qkv's V rows carry 1 / s of the o after it)."""
    from tqdm.auto import tqdm

    def energies(p: str, x: np.ndarray) -> tuple[float, float]:
        y = linear_apply(x, float_weights, p, None)
        m = None if out_scale is None else out_scale.get(p)
        if m is not None:
            y *= m
        xs = x if transform is None else transform(p, x)
        yq = _int8_linear(xs, q_weights, p, _as_int8(quant.get(p)))
        y64 = y.astype(np.float64)
        d = y64 - yq
        return float(np.sum(y64 * y64)), float(np.sum(d * d))

    out: dict[str, dict[str, float]] = {}
    total = int(sum(len(b[0]) for bs in batches.values() for b in bs))
    with tqdm(
        total=total, desc="per-layer SQNR", unit="tok", disable=not progress, leave=False
    ) as bar:
        for group, bs in batches.items():
            sig: dict[str, float] = {}
            noise: dict[str, float] = {}
            pending: list = []

            def visit(p, x, sig=sig, noise=noise, pending=pending):
                pending.append((p, blas.submit(energies, p, x.copy())))
                if len(pending) > blas.WORKERS:  # a bounded number of copies in flight
                    _add(sig, noise, *_take(pending))

            for ids, pos, cu in bs:
                runner.run(ids, pos, cu, visit)
                while pending:  # summed in the graph's order, batch after batch
                    _add(sig, noise, *_take(pending))
                bar.update(len(ids))
            out[group] = {
                p: (
                    float("inf")
                    if noise[p] == 0
                    else 10.0 * float(np.log10(max(sig[p], 1e-300) / noise[p]))
                )
                for p in sig
            }
    return out


def _int8_linear(x: np.ndarray, w: dict, p: str, lq) -> np.ndarray:
    """The INT8 linear p on x through the CPU core's own kernel (one thread, on the caller's:
    zoi._cpu.k_linear_i8): its integers are those of zoi.numerics.primitives' emulation, at a
    fraction of numpy's cost."""
    from zoi import _cpu

    def f32(k):
        a = w.get(p + k)
        return None if a is None else np.ascontiguousarray(a, np.float32)

    wq = np.ascontiguousarray(w[p + ".w_q"], np.int8)
    y = np.empty((x.shape[0], wq.shape[0]), np.float32)
    static = float(lq.amax) if lq.scheme == "static" else -1.0
    _cpu.k_linear_i8(
        np.ascontiguousarray(x, np.float32),
        wq,
        f32(".w_scale"),
        f32(".b"),
        "none",
        None,
        static,
        y,
        "",
        1,
        lq.scheme == "dynamic_asym",
        f32(".act_shift"),
        f32(".act_mul"),
    )
    return y


def _take(pending: list) -> tuple:
    p, fut = pending.pop(0)
    return (p, *fut.result())


def _add(sig: dict, noise: dict, p: str, s: float, n: float) -> None:
    sig[p] = sig.get(p, 0.0) + s
    noise[p] = noise.get(p, 0.0) + n


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
