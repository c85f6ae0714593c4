"""MiniLM forward (random weights, INT8, 6 layers), amx against vnni in one process, rounds
interleaved: ms per call from wall time, from the calling thread's CPU time (1 thread: the whole
forward runs on it) and from the process CPU time (all threads; the pool's spin-waits count too).
Setup shared with yscratch_ab.py: engine_ab_common.py.

    python lab/cpu/amx_engine_ab.py [--shapes 32x128,8x128,1x128] [--threads 1] [--rounds 5] [--json f]
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


def main() -> None:
    a = ab.parser("32x128,8x128,1x128").parse_args()
    shapes = ab.parse_shapes(a.shapes)
    spec, model = ab.minilm_int8(shapes)
    bes = {isa: CpuBackend(model, isa=isa, nthreads=a.threads) for isa in ("vnni", "amx")}
    print(f"cpu {ab.cpu_brand()} threads={a.threads} load {os.getloadavg()}")
    rows = []
    for b, s in shapes:
        ids, pos, cu = ab.shape_batch(spec, b, s)
        outs = ab.warm(bes, ids, pos, cu, b, spec.hidden)
        n = ab.calls_per_round(b, s)
        res = {isa: {"wall": [], "thread": [], "proc": []} for isa in bes}
        for _ in range(a.rounds):
            for isa, be in bes.items():
                for k, v in ab.timed(be, ids, pos, cu, outs[isa], n).items():
                    res[isa][k].append(v)
        cos = float(
            np.min(
                np.sum(outs["amx"] * outs["vnni"], 1)
                / np.linalg.norm(outs["amx"], axis=1)
                / np.linalg.norm(outs["vnni"], axis=1)
            )
        )
        same = bool(np.array_equal(outs["amx"], outs["vnni"]))
        row = {
            "shape": f"{b}x{s}",
            "threads": a.threads,
            "calls_per_round": n,
            "rounds": a.rounds,
            "identical_outputs": same,
            "min_cos": cos,
            "load_after": os.getloadavg()[0],
        }
        for isa in bes:
            for k in ("wall", "thread", "proc"):
                row[f"{isa}_{k}_ms"] = statistics.median(res[isa][k])
        rows.append(row)
        print(
            f"  {b}x{s}: vnni thread {row['vnni_thread_ms']:.2f} ms proc {row['vnni_proc_ms']:.2f} wall {row['vnni_wall_ms']:.2f} | "
            f"amx thread {row['amx_thread_ms']:.2f} proc {row['amx_proc_ms']:.2f} wall {row['amx_wall_ms']:.2f} | "
            f"amx/vnni thread {row['amx_thread_ms'] / row['vnni_thread_ms']:.2f}x proc {row['amx_proc_ms'] / row['vnni_proc_ms']:.2f}x "
            f"identical={same} load {row['load_after']:.1f}",
            flush=True,
        )
    ab.write_json(a.json, rows)


if __name__ == "__main__":
    main()
