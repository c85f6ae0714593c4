"""MiniLM forward (random weights, INT8, 6 layers), amx against vnni in one process, rounds
interleaved: ms per call from wall time, from the calling thread's CPU time (1 thread: the whole
forward runs on it) and from the process CPU time (all threads; the pool's spin-waits count too).

    python lab/cpu/amx_engine_ab.py [--shapes 32x128,8x128,1x128] [--threads 1] [--rounds 5] [--json f]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "cpu"))
from helpers import batch, make_model, minilm_spec  # noqa: E402

from zoi import _cpu  # noqa: E402
from zoi.backends.cpu import CpuBackend  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="32x128,8x128,1x128")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    spec = minilm_spec()
    shapes = [tuple(int(v) for v in s.split("x")) for s in a.shapes.split(",")]
    model = make_model(
        spec, "int8", max_tokens=max(b * s for b, s in shapes), max_batch=max(b for b, _ in shapes)
    )
    bes = {isa: CpuBackend(model, isa=isa, nthreads=a.threads) for isa in ("vnni", "amx")}
    print(f"cpu {_cpu.cpu_info()['brand']} threads={a.threads} load {os.getloadavg()}")
    rows = []
    for b, s in shapes:
        ids, pos, cu = batch([s] * b, spec.vocab_size, seed=1)
        outs = {}
        for isa, be in bes.items():
            outs[isa] = np.empty((b, spec.hidden), np.float32)
            be.engine.run_repeat(ids, pos, cu, True, outs[isa], 2)
        n = max(3, int(round(400 / (b * s) * 3)))
        res = {isa: {"wall": [], "thread": [], "proc": []} for isa in bes}
        for _ in range(a.rounds):
            for isa, be in bes.items():
                w0, t0, p0 = time.perf_counter(), time.thread_time(), time.process_time()
                be.engine.run_repeat(ids, pos, cu, True, outs[isa], n)
                w1, t1, p1 = time.perf_counter(), time.thread_time(), time.process_time()
                res[isa]["wall"].append((w1 - w0) / n * 1e3)
                res[isa]["thread"].append((t1 - t0) / n * 1e3)
                res[isa]["proc"].append((p1 - p0) / n * 1e3)
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
    if a.json:
        with open(a.json, "w") as f:
            json.dump(
                {
                    "cpu": _cpu.cpu_info()["brand"],
                    "model": "minilm-shape int8 random weights, 6 layers",
                    "rows": rows,
                },
                f,
                indent=1,
            )


if __name__ == "__main__":
    main()
