"""INT8 / FP32 GEMM throughput against the register-only peak loop of the same machine.

    python lab/cpu/gemm_bench.py [--isa vnni] [--threads 1] [--iters 20]

Reports, per shape, GOP/s from wall time and from the calling thread's CPU time (robust to
other load on the machine: a descheduled thread accrues no CPU time) and the fraction of the
peak measured the same way. Shapes: the MiniLM / BERT-base linears at several token counts.
"""

from __future__ import annotations

import argparse
import time

from zoi import _cpu

SHAPES = [  # (M, N, K): qkv, o, ffn1, ffn2 of MiniLM (H=384, I=1536) and BERT-base ffn
    (16, 1152, 384),
    (128, 1152, 384),
    (128, 384, 384),
    (128, 1536, 384),
    (128, 384, 1536),
    (512, 1152, 384),
    (512, 384, 384),
    (512, 1536, 384),
    (512, 384, 1536),
    (4096, 1152, 384),
    (4096, 1536, 384),
    (4096, 384, 1536),
    (128, 3072, 768),
    (128, 768, 3072),
]


def peak(isa: str, nt: int) -> tuple[float, float]:
    w0, c0 = time.perf_counter(), time.thread_time()
    g = _cpu.bench_peak_i8(isa, nt, 20_000_000)
    w1, c1 = time.perf_counter(), time.thread_time()
    ops = g * 1e9 * (w1 - w0)
    return g, ops / nt / (c1 - c0) / 1e9  # wall GOP/s (all threads), CPU GOP/s per thread


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--isa", default=_cpu.active_isa())
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--kind", default="i8")
    a = ap.parse_args()
    pw, pc = peak(a.isa, a.threads)
    print(
        f"isa={a.isa} threads={a.threads}: peak loop {pw:.0f} GOP/s wall, {pc:.0f} GOP/s per thread (CPU time)"
    )
    print(
        f"{'M':>5} {'N':>5} {'K':>5} {'ms':>8} {'GOP/s':>7} {'%peak':>6} {'cpu GOP/s/thr':>14} {'%peak':>6}"
    )
    for M, N, K in SHAPES:
        it = max(3, min(a.iters, int(2e9 / (2 * M * N * K))))
        w, c = _cpu.bench_gemm(a.kind, M, N, K, a.isa, a.threads, it)
        ops = 2 * M * N * K
        print(
            f"{M:>5} {N:>5} {K:>5} {w * 1e3:>8.3f} {ops / w / 1e9:>7.0f} {100 * ops / w / 1e9 / pw:>5.0f}% "
            f"{ops / c / 1e9 / a.threads:>14.0f} {100 * ops / c / 1e9 / a.threads / pc:>5.0f}%"
        )


if __name__ == "__main__":
    main()
