"""Per-op profile of the native engine (thread 0's wall and CPU time per step, summed by kind).

    python lab/cpu/profile_ops.py [--model minilm|bert-base] [--shape 1x128] [--threads 1] [--runs 20]
    python lab/cpu/profile_ops.py --artifact DIR [--shape 1x128] [--threads 2]   (a zoi.save'd
        artifact, e.g. the bench's Qwen3-Embedding shape under ~/.cache/zoi/bench/qwen3-embed/)

CPU time (CLOCK_THREAD_CPUTIME_ID) is robust to other load on the machine; wall is what a
caller sees. Medians over runs.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "cpu"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from engine_bench import bert_base_spec  # noqa: E402
from helpers import batch, make_model, minilm_spec  # noqa: E402

from zoi.backends.cpu import CpuBackend  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="minilm")
    ap.add_argument("--precision", default="int8")
    ap.add_argument("--shape", default="1x128")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--isa", default="")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--steps", action="store_true", help="also print the first layer step by step")
    ap.add_argument("--artifact", default="", help="profile a saved artifact instead")
    a = ap.parse_args()
    b, s = (int(v) for v in a.shape.split("x"))
    if a.artifact:
        import zoi

        be = zoi.load(a.artifact, device="cpu").backend
        model, spec, a.model = be.model, be.model.spec, Path(a.artifact).name
        a.precision = model.precision
        if a.threads != be.engine.nthreads:
            be = CpuBackend(model, isa=a.isa or None, nthreads=a.threads)
    else:
        spec = minilm_spec() if a.model == "minilm" else bert_base_spec()
        model = make_model(spec, a.precision, max_tokens=b * s, max_batch=b)
        be = CpuBackend(model, isa=a.isa or None, nthreads=a.threads)
    ids, pos, cu = batch([s] * b, spec.vocab_size, 1)
    for _ in range(3):
        be.engine.profile(ids, pos, cu)
    runs = [be.engine.profile(ids, pos, cu) for _ in range(a.runs)]
    wall = np.median(np.array([[w for _, w, _ in r] for r in runs]), axis=0)
    cpu = np.median(np.array([[c for _, _, c in r] for r in runs]), axis=0)
    kinds = [k for k, _, _ in runs[0]]
    by = defaultdict(lambda: [0.0, 0.0, 0])
    for k, w, c in zip(kinds, wall, cpu, strict=True):
        by[k][0] += w
        by[k][1] += c
        by[k][2] += 1
    print(f"{a.model} {a.precision} {a.shape} isa={be.isa} threads={be.engine.nthreads}")
    print(f"{'op':<12}{'n':>4}{'wall ms':>10}{'cpu ms':>10}")
    for k, (w, c, n) in sorted(by.items(), key=lambda kv: -kv[1][0]):
        print(f"{k:<12}{n:>4}{w * 1e3:>10.3f}{c * 1e3:>10.3f}")
    if a.steps:
        for i, (k, w, c) in enumerate(zip(kinds, wall, cpu, strict=True)):
            if i < 12:
                print(f"  step {i:>2} {k:<10} wall {w * 1e3:8.3f} ms  cpu {c * 1e3:8.3f} ms")
    print(f"{'total':<12}{len(kinds):>4}{wall.sum() * 1e3:>10.3f}{cpu.sum() * 1e3:>10.3f}")
    if a.precision == "int8":
        gemm_c = sum(c for k, c in zip(kinds, cpu, strict=True) if k == "gemm_i8")
        ops = (
            2
            * b
            * s
            * sum(w.shape[0] * w.shape[1] for n, w in model.weights.items() if n.endswith(".w_q"))
        )
        print(
            f"gemm_i8: {ops / 1e9:.2f} GOP in {gemm_c * 1e3:.3f} ms thread-0 CPU -> "
            f"{ops / gemm_c / 1e9 / be.engine.nthreads:.0f} GOP/s per thread"
        )


if __name__ == "__main__":
    main()
