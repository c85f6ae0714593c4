"""The first row of each sequence quantised twice (LinearQuant.first_row; docs/QUANT.md) in
the CUDA backend's plan: the launches that write the first rows' second quantisation (kernels/
quantize.py) and the row map the linear kernel reads (kernels/linear.py first_row_term)."""

from __future__ import annotations

import logging

from zoi.backends.cuda.weights import align

log = logging.getLogger("zoi")

FIRST_ROW_MAP = "#first_rows"  # int32 [T]: row -> the sequence it starts, or -1


def first_rows(model, launches: list, fallbacks: dict, warn: bool, Launch, max_batch: int) -> list:
    """The first row of each sequence quantised twice (LinearQuant.first_row; zoi.numerics.
    primitives.first_row_residual): one "first_row_map" launch after the embedding (row ->
    sequence, shared by every such linear), and before each such INT8 linear a "first_row"
    launch writing (q2 int8 [max_batch, K], s2 fp32 [max_batch]) from the fp16 rows its int8
    input is quantised from (every producer quantises the rows it stored, so q1 is recomputed
    bit for bit); the linear adds the term in its GEMM (kernels/linear.py first_row_term).
    SPLADE's fused decoder does not run it: listed in the fallbacks ("<prefix>#q2") and warned
    of (warn: once per backend, from its fused plan). The one-launch forwards (persistent,
    megakernel) refuse such a launch list (persistent._layers): the per-op kernels run it.
    Launch, max_batch: plan.py's launch class and the model's max_batch (passed in: plan.py
    imports this module)."""
    quant = getattr(model, "quant", None) or {}
    mb = max_batch
    out: list = []
    for L in launches:
        p = L.extra.get("prefix")
        lq = quant.get(p) if L.kind == "linear" else None
        if lq is None or not getattr(lq, "first_row", False) or not L.mode.is_int8:
            out.append(L)
            continue
        if L.extra.get("splade") or L.extra.get("rows") == "B":
            fallbacks[f"{p}#q2"] = (
                f"{p}: one quantisation per row (its kernel has no first-row term)"
            )
            out.append(L)
            continue
        if not any(x.kind == "first_row_map" for x in out):
            out.insert(1, Launch("first_row_map", out[0].op, FIRST_ROW_MAP, [], n=1))
        fr = Launch(
            "first_row", L.op, f"{p}#q2", [L.ins[0]], mode=L.mode, static_amax=L.static_amax,
            n=L.k, k=L.k,
        )  # fmt: skip
        fr.extra.update(prefix=p, amax=L.quant == 1, out_bytes=first_row_bytes(mb, L.k))
        L.extra["first_row"] = fr.out
        out += [fr, L]
    ignored = sorted(n[: -len("#q2")] for n in fallbacks if n.endswith("#q2"))
    if ignored and warn:
        log.warning(
            "zoi: device='cuda' runs %d INT8 linears without their first-row second "
            "quantisation (%s); their outputs follow the single-quantisation numerics",
            len(ignored),
            ", ".join(ignored),
        )
    return out


def first_row_bytes(max_batch: int, K: int) -> int:
    """Bytes of a "first_row" buffer: q2 int8 [max_batch, K], then s2 fp32 [max_batch] at
    align(max_batch * K)."""
    return align(max_batch * K) + max_batch * 4
