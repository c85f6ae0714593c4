"""AMX-INT8 tile GEMM against vnni's, interleaved rounds, one thread, GOP/s from the calling thread's
CPU time (robust to other load; wall figures under load are not). Also the M crossover.

    python lab/cpu/amx_bench.py [--rounds 5] [--threads 1] [--json out.json] [--nt]

--nt: instead, the streaming-store A/B of the tile epilogue at large M (CpuOptions.amx_nt_bytes 0 vs 1),
quantise + pack + GEMM through k_linear_i8 into a 64-byte aligned y, one thread, thread CPU time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

from zoi import _cpu
from zoi.backends.cpu.options import CpuOptions

SHAPES = [
    (M, N, K)
    for M in (4096, 1024, 128)
    for N, K in ((1152, 384), (384, 384), (1536, 384), (384, 1536))
]
CROSS = [
    (M, N, K) for M in (1, 2, 4, 8, 16, 32, 64) for N, K in ((384, 384), (1536, 384), (384, 1536))
]


def nt_ab(rounds: int) -> None:
    import time

    import numpy as np

    rng = np.random.default_rng(0)
    print(f"load {os.getloadavg()}")
    for M, N, K in ((4096, 1536, 384), (4096, 1152, 384), (4096, 384, 1536), (2048, 1152, 384)):
        x = rng.standard_normal((M, K)).astype(np.float32)
        w = rng.integers(-127, 128, (N, K)).astype(np.int8)
        ws, b = np.full(N, 0.01, np.float32), np.zeros(N, np.float32)
        buf = np.empty(M * N + 16, np.float32)
        off = (-buf.ctypes.data % 64) // 4
        y = buf[off : off + M * N].reshape(M, N)
        r: dict[str, list[float]] = {"0": [], "1": []}
        for _ in range(rounds):
            for nt in ("0", "1"):
                CpuOptions(amx_nt_bytes=int(nt)).apply()
                t0 = time.thread_time()
                for _ in range(5):
                    _cpu.k_linear_i8(x, w, ws, b, "none", None, -1.0, y, "amx", 1)
                r[nt].append((time.thread_time() - t0) / 5 * 1e3)
        a, c = statistics.median(r["0"]), statistics.median(r["1"])
        print(
            f"{M:>5} {N:>5} {K:>5}  plain stores {a:6.2f} ms  streaming {c:6.2f} ms  {c / a:4.2f}x"
        )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", default="")
    ap.add_argument("--nt", action="store_true")
    a = ap.parse_args()
    if a.nt:
        nt_ab(a.rounds)
        return
    CpuOptions(amx_min_m=1).apply()  # the tile kernel at every M (the crossover rows)
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
