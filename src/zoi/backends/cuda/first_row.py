"""The first row of each sequence quantised twice (LinearQuant.first_row; docs/QUANT.md) in
the CUDA backend's plan: the row map the linear kernel reads (written by the embedding kernel:
kernels/embed.py FR_MAP) and the linears that compute their first rows' second quantisation
in their own K loop (kernels/linear.py FIRST_ROW): no launch of its own."""

from __future__ import annotations

import logging

log = logging.getLogger("zoi")

FIRST_ROW_MAP = "#first_rows"  # int32 [T]: row -> the sequence it starts, or -1


def first_rows(model, launches: list, fallbacks: dict, warn: bool) -> list:
    """The first row of each sequence quantised twice (LinearQuant.first_row; zoi.numerics.
    primitives.first_row_residual): the embed launch marked extra["first_row_map"] (it also
    writes row -> sequence, shared by every such linear), and each such INT8 linear marked
    extra["first_row"]: its kernel computes q2 of the first rows in its K loop, from the fp16
    rows its int8 input is quantised from (L.ins[0]: every producer quantises the rows it
    stored, so q1 is the very code the GEMM reads; the arena keeps them live up to the linear).
    SPLADE's fused decoder does not run it: listed in the fallbacks ("<prefix>#q2") and warned
    of (warn: once per backend, from its fused plan). The one-launch forwards (persistent,
    megakernel) refuse such a launch list (persistent._layers): the per-op kernels run it."""
    quant = getattr(model, "quant", None) or {}
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
        if not out or out[0].kind != "embed":
            raise ValueError(
                f"{p}: the first-row residual needs the plan to start with the embedding "
                "launch (it writes the row map)"
            )
        out[0].extra["first_row_map"] = FIRST_ROW_MAP
        L.extra["first_row"] = True
        out.append(L)
    ignored = sorted(n[: -len("#q2")] for n in fallbacks if n.endswith("#q2"))
    if ignored and warn:
        log.warning(
            "zoi: device='cuda' runs %d INT8 linears without their first-row second "
            "quantisation (%s); their outputs follow the single-quantisation numerics",
            len(ignored),
            ", ".join(ignored),
        )
    return out
