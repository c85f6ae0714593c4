"""precision="fp8": every linear E4M3 (weights per output channel, activations per token,
zoi.numerics.fp8). Nothing to calibrate: both scales are dynamic (amax / 448), so an FP8
model is the FP32 weights plus one LinearQuant("fp8") per linear; the backend quantises the
weights when it packs them (the CUDA backend, sm_89+) or emulates them (device="reference").
The word embedding stays float (an embedding is a gather, not a GEMM)."""

from __future__ import annotations

from zoi.graph.build import build_graph, linear_prefix
from zoi.graph.compiled import LinearQuant
from zoi.graph.quantmode import QuantMode


def fp8_quant(spec) -> dict[str, LinearQuant]:
    """{linear prefix: LinearQuant(FP8)} for every linear of the model's graph."""
    g = build_graph(spec)
    return {
        linear_prefix(op): LinearQuant(QuantMode.FP8, None, {"weights": "fp8"})
        for op in g.ops
        if op.kind == "linear"
    }


def fp8_weight_bytes(weights: dict, quant: dict) -> int:
    """Bytes of the weights as an FP8 backend holds them: each FP8 linear's [N, K] as one
    byte per value plus a float32 scale per row, everything else as stored."""
    total = 0
    for n, a in weights.items():
        p = n[:-2] if n.endswith(".w") else None
        q = quant.get(p) if p is not None else None
        if q is not None and q.scheme == QuantMode.FP8:
            total += int(a.shape[0]) * int(a.shape[1]) + 4 * int(a.shape[0])
        else:
            total += int(a.nbytes)
    return total
