"""The activation arena: one device buffer holding every activation of a forward (placed by
liveness), the per-row amax / a_scale / zero-point rows, the attention tile table, the call's
input staging (header + cu_seqlens, ids, positions) and the pooled output (fp32 [max_batch,
out_dim]: the hidden size, or the width of the last Dense module)."""

from __future__ import annotations

import numpy as np

from zoi.backends.cuda.first_row import FIRST_ROW_MAP
from zoi.backends.cuda.weights import ALIGN, align
from zoi.graph.planner import place_buffers


def place(launches, T) -> tuple[dict, dict, int]:
    """Liveness over one launch list (fp16 rows of T tokens, int8 for the "#q" copies; a launch
    whose extra says "out_bytes": that many, e.g. SPLADE's fp32 [max_batch, V] or the pooled
    rows the Dense modules read), placed by the
    graph's planner (zoi.graph.planner.place_buffers): (offsets, columns, bytes)."""
    cols: dict[str, int] = {}
    live: dict[str, list[int]] = {}
    fixed: dict[str, int] = {}
    for i, L in enumerate(launches):
        reads = L.ins + ([L.res] if L.res else [])
        if L.kind == "linear" and L.prequant:
            reads = [L.extra["qname"]] + reads[1:]
        if L.extra.get("first_row"):  # the row map and the fp16 rows its q2 is computed from
            reads = reads + [FIRST_ROW_MAP, L.ins[0]]
        for n in reads:
            if n in live:
                live[n][1] = i
        if L.kind != "pool" or L.extra.get("out_bytes"):  # a pool writes the output rows
            cols[L.out] = L.n
            live[L.out] = [i, i]
            if L.extra.get("out_bytes"):
                fixed[L.out] = int(L.extra["out_bytes"])
            if L.extra.get("first_row_map"):  # the embed kernel's int32 row map
                cols[FIRST_ROW_MAP], live[FIRST_ROW_MAP] = 1, [i, i]
                fixed[FIRST_ROW_MAP] = T * 4
            if L.kind != "quantize" and L.extra.get("q"):  # the int8 copy it also writes
                cols[L.extra["q"]] = L.n
                live[L.extra["q"]] = [i, i]
    sizes = {
        n: align(fixed[n] if n in fixed else T * c * (1 if n.endswith("#q") else 2))
        for n, c in cols.items()
    }
    offs, total = place_buffers({n: tuple(v) for n, v in live.items()}, sizes)
    return offs, cols, total


def header_ints(max_batch: int) -> int:
    """int32 slots of the call header [normalize, B, T, 0] + cu_seqlens, padded to ALIGN."""
    return align((4 + max_batch + 1) * 4) // 4


class Arena:
    """Places the plans' activations (they share the region: one plan runs at a time) and
    carves the device views every launch reads. Each plan dict gets "offs", "cols" and
    "amax_row" (its row in the amax region for each per-row vector)."""

    def __init__(self, plans: list[dict], torch, dev: str, T: int, Bmax: int, out_dim: int):
        self.torch = torch
        act_bytes, n_amax = 0, 1
        for plan in plans:
            plan["offs"], plan["cols"], nb = place(plan["launches"], T)
            act_bytes = max(act_bytes, nb)
            # atomic first: the embed kernel zeroes rows [0, n_atomic); then the a_scale / zp
            # rows of the int8 copies (zp rows hold int32)
            names = plan["atomic"] + plan["direct"] + plan["scales"]
            plan["amax_row"] = {n: i for i, n in enumerate(names)}
            n_amax = max(n_amax, len(names))
        self.hdr_ints = header_ints(Bmax)
        self.in_ints = self.hdr_ints + 2 * T
        regions = [
            ("act", act_bytes),
            ("amax", n_amax * T * 4),
            ("tcum", Bmax * 4),
            ("in", self.in_ints * 4),
            ("out", Bmax * out_dim * 4),
        ]
        roff, total = {}, 0
        for name, nb in regions:
            roff[name] = total
            total = align(total + max(nb, 4))
        self.buf = torch.zeros(total, dtype=torch.uint8, device=dev)  # the one arena
        self.bytes = total
        self.act_bytes = act_bytes
        self.offsets = roff
        ab = self.buf[roff["amax"] : roff["amax"] + n_amax * T * 4].view(torch.float32)
        self.amax_region = ab.view(n_amax, T)
        self.tcum = self.buf[roff["tcum"] : roff["tcum"] + Bmax * 4].view(torch.int32)
        self.d_in = self.buf[roff["in"] : roff["in"] + self.in_ints * 4].view(torch.int32)
        d_out = self.buf[roff["out"] : roff["out"] + Bmax * out_dim * 4].view(torch.float32)
        self.d_out = d_out.view(Bmax, out_dim)

    def f32(self, plan: dict, name: str, rows: int, cols: int):
        """The fp32 [rows, cols] view of a buffer placed by its byte size (SPLADE's pooled
        [B, V]); an error past the bytes placed for it."""
        o, nb = plan["offs"][name], rows * cols * 4
        have = next(int(L.extra.get("out_bytes", 0)) for L in plan["launches"] if L.out == name)
        if nb > have:
            raise ValueError(f"{name}: fp32 [{rows}, {cols}] exceeds the {have} bytes placed")
        return self.buf[o : o + nb].view(self.torch.float32).view(rows, cols)

    def first_row_map(self, plan: dict, rows: int):
        """The int32 [rows] row -> sequence map of the first-row residual."""
        o = plan["offs"][FIRST_ROW_MAP]
        return self.buf[o : o + rows * 4].view(self.torch.int32)

    def act(self, plan: dict, name: str, rows: int):
        """The [rows, cols] view of one activation (fp16, or int8 for a "#q" copy, fp8 for
        an "@fp8#q" one)."""
        c, o = plan["cols"][name], plan["offs"][name]
        if name.endswith("@fp8#q"):  # an FP8 copy (plan: QuantMode.FP8)
            return self.buf[o : o + rows * c].view(self.torch.float8_e4m3fn).view(rows, c)
        if name.endswith("#q"):
            return self.buf[o : o + rows * c].view(self.torch.int8).view(rows, c)
        return self.buf[o : o + rows * c * 2].view(self.torch.float16).view(rows, c)


def carve(torch, dev: str, bufs: dict) -> tuple[dict, object, int]:
    """One zeroed device buffer for a runtime's own buffer list, placed by the graph's planner:
    bufs {name: (shape, dtype, (first, last))} with live ranges in the runtime's launch phases
    (two buffers share bytes only when their ranges do not meet). Returns ({name: the typed view
    of its shape}, the whole uint8 buffer, its bytes)."""
    nbytes = {
        n: int(np.prod(s, dtype=np.int64)) * torch.empty((), dtype=d).element_size()
        for n, (s, d, _) in bufs.items()
    }
    offs, total = place_buffers(
        {n: tuple(b[2]) for n, b in bufs.items()},
        {n: align(max(nb, 1)) for n, nb in nbytes.items()},
    )
    buf = torch.zeros(max(total, ALIGN), dtype=torch.uint8, device=dev)
    views = {n: buf[offs[n] : offs[n] + nbytes[n]].view(d).view(s) for n, (s, d, _) in bufs.items()}
    return views, buf, total
