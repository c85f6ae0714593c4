"""MiniLM forward (random weights, INT8, 6 layers): the fused FFN1 -> FFN2 quantisation with the
FFN1 float rows in per-thread scratch (the plan's quant_out_only, zoi.graph.fusion: the default)
against the same rows written to the arena (FusionPolicy(quant_out_only=False)), per ISA, in one process, rounds
interleaved. Per call: the calling thread's CPU time of the whole forward (1 thread: all of it runs
there) and wall; and, from Engine.profile, the thread CPU time summed over the FFN1 GEMMs (the
steps marked y_scratch), median of `--rounds` profiles. Setup shared with amx_engine_ab.py:
engine_ab_common.py.

    python lab/cpu/yscratch_ab.py [--isas amx,vnni] [--shapes 32x128,8x128] [--threads 1] [--rounds 5] [--json f]
"""

from __future__ import annotations

import os
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import engine_ab_common as ab  # noqa: E402

from zoi.backends.cpu import CpuBackend  # noqa: E402
from zoi.graph.fusion import FusionPolicy  # noqa: E402


def _backend(model, isa, threads, flag):
    # the fusion pass's switch: FFN1's float rows in per-thread scratch ("1") or the arena ("0")
    return CpuBackend(
        model, isa=isa, nthreads=threads, fusion=FusionPolicy(quant_out_only=flag == "1")
    )


def main() -> None:
    ap = ab.parser("32x128,8x128")
    ap.add_argument("--isas", default="amx,vnni")
    a = ap.parse_args()
    shapes = ab.parse_shapes(a.shapes)
    spec, model = ab.minilm_int8(shapes)
    isas = a.isas.split(",")
    bes = {(i, f): _backend(model, i, a.threads, f) for i in isas for f in ("0", "1")}
    ffn1 = {}
    for k, be in bes.items():
        ffn1[k] = [
            j
            for j, s in enumerate(be.engine.steps_info())
            if s["kind"] == "gemm_i8" and s["writes_copy"]
        ]
        assert any(s["y_scratch"] for s in be.engine.steps_info()) == (k[1] == "1"), k
    load0 = os.getloadavg()
    print(f"cpu {ab.cpu_brand()} threads={a.threads} load {load0}", flush=True)
    rows = []
    for b, s in shapes:
        ids, pos, cu = ab.shape_batch(spec, b, s)
        outs = ab.warm(bes, ids, pos, cu, b, spec.hidden)
        n = ab.calls_per_round(b, s)
        res = {k: {"wall": [], "thread": [], "ffn1": []} for k in bes}
        for _ in range(a.rounds):
            for k, be in bes.items():
                t = ab.timed(be, ids, pos, cu, outs[k], n)
                res[k]["wall"].append(t["wall"])
                res[k]["thread"].append(t["thread"])
                prof = be.engine.profile(ids, pos, cu)
                res[k]["ffn1"].append(sum(prof[j][2] for j in ffn1[k]) * 1e3)
        for isa in isas:
            off, on = (isa, "0"), (isa, "1")
            row = {
                "isa": isa,
                "shape": f"{b}x{s}",
                "threads": a.threads,
                "calls_per_round": n,
                "rounds": a.rounds,
                "identical_outputs": bool(np.array_equal(outs[on], outs[off])),
                "load_after": os.getloadavg()[0],
            }
            for tag, k in (("arena", off), ("scratch", on)):
                for m in ("wall", "thread", "ffn1"):
                    row[f"{tag}_{m}_ms"] = statistics.median(res[k][m])
            row["scratch_over_arena_thread"] = row["scratch_thread_ms"] / row["arena_thread_ms"]
            row["scratch_over_arena_ffn1"] = row["scratch_ffn1_ms"] / row["arena_ffn1_ms"]
            rows.append(row)
            print(
                f"  {isa} {b}x{s}: forward thread arena {row['arena_thread_ms']:.2f} scratch {row['scratch_thread_ms']:.2f} ms "
                f"({row['scratch_over_arena_thread']:.3f}x) | FFN1 GEMMs thread arena {row['arena_ffn1_ms']:.2f} "
                f"scratch {row['scratch_ffn1_ms']:.2f} ms ({row['scratch_over_arena_ffn1']:.3f}x) | "
                f"identical={row['identical_outputs']} load {row['load_after']:.1f}",
                flush=True,
            )
    ab.write_json(
        a.json,
        rows,
        what="FFN1 float rows in per-thread scratch (the default) vs the arena (quant_out_only off)",
        load_before=list(load0),
    )


if __name__ == "__main__":
    main()
