"""AMX-INT8 tile GEMM against vnni's, interleaved rounds, one thread, GOP/s from the calling thread's
CPU time (robust to other load; wall figures under load are not). Also the M crossover.

    python lab/cpu/amx_bench.py [--rounds 5] [--threads 1] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

from zoi import _cpu

SHAPES = [
    (M, N, K)
    for M in (4096, 1024, 128)
    for N, K in ((1152, 384), (384, 384), (1536, 384), (384, 1536))
]
CROSS = [
    (M, N, K) for M in (1, 2, 4, 8, 16, 32, 64) for N, K in ((384, 384), (1536, 384), (384, 1536))
]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    os.environ["ZOI_AMX_MIN_M"] = "1"  # the tile kernel at every M (the crossover rows)
    rows = []
    print(f"load {os.getloadavg()}")
    for pk in ("vnni", "amx"):
        g = _cpu.bench_peak_i8(pk, 1, 2_000_000 if pk == "amx" else 20_000_000)
        print(f"peak loop {pk}: {g:.0f} GOP/s wall (1 thread)")
    for M, N, K in SHAPES + CROSS:
        ops = 2 * M * N * K
        it = max(3, min(50, int(4e9 / ops)))
        res = {"vnni": [], "amx": []}
        for _ in range(a.rounds):
            for isa in ("vnni", "amx"):
                w, c = _cpu.bench_gemm("i8", M, N, K, isa, a.threads, it)
                res[isa].append(ops / c / 1e9 / a.threads)
        v, x = statistics.median(res["vnni"]), statistics.median(res["amx"])
        rows.append({"M": M, "N": N, "K": K, "vnni_gops_cpu": v, "amx_gops_cpu": x, "ratio": x / v})
        print(
            f"{M:>5} {N:>5} {K:>5}  vnni {v:7.0f}  amx {x:7.0f}  amx/vnni {x / v:5.2f}x  load {os.getloadavg()[0]:.1f}",
            flush=True,
        )
    if a.json:
        info = _cpu.cpu_info()
        with open(a.json, "w") as f:
            json.dump(
                {
                    "cpu": info["brand"],
                    "threads": a.threads,
                    "rounds": a.rounds,
                    "metric": "GOP/s per thread CPU time, median of interleaved rounds",
                    "load_end": os.getloadavg(),
                    "rows": rows,
                },
                f,
                indent=1,
            )


if __name__ == "__main__":
    main()
