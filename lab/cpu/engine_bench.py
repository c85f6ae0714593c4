"""Whole-model latency of the native engine on MiniLM / BERT-base shapes (random weights).

    python lab/cpu/engine_bench.py [--model minilm|bert-base] [--precision int8|fp32] [--shapes 1x16,1x128,32x128]

Times `Engine.run_repeat` (the loop stays in C++) and the Python `CpuBackend.run` path; prints
p50 / p99 per call over repeated single calls and the mean of a C++ loop.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "cpu"))
from helpers import batch, make_model, minilm_spec  # noqa: E402

from zoi.backends.cpu import CpuBackend  # noqa: E402
from zoi.frontend.spec import ModelSpec  # noqa: E402


def bert_base_spec() -> ModelSpec:
    return ModelSpec(
        arch="bert",
        vocab_size=30522,
        hidden=768,
        layers=12,
        heads=12,
        intermediate=3072,
        max_positions=512,
        type_vocab_size=2,
        eps=1e-12,
        act="gelu",
        pooling="mean",
        name="bert-base",
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="minilm")
    ap.add_argument("--precision", default="int8")
    ap.add_argument("--shapes", default="1x16,1x128,32x128")
    ap.add_argument("--isa", default="")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--calls", type=int, default=200)
    a = ap.parse_args()
    spec = minilm_spec() if a.model == "minilm" else bert_base_spec()
    shapes = [tuple(int(v) for v in s.split("x")) for s in a.shapes.split(",")]
    max_tokens = max(b * s for b, s in shapes)
    model = make_model(
        spec, a.precision, max_tokens=max_tokens, max_batch=max(b for b, _ in shapes)
    )
    be = CpuBackend(model, isa=a.isa or None, nthreads=a.threads or None)
    print(f"{a.model} {a.precision} isa={be.isa} threads={be.engine.nthreads} mem={be.memory()}")
    for b, s in shapes:
        ids, pos, cu = batch([s] * b, spec.vocab_size, seed=1)
        out = np.empty((b, spec.hidden), np.float32)
        be.engine.run_repeat(ids, pos, cu, True, out, 5)
        n = a.calls if b * s <= 256 else max(20, a.calls // 10)
        ts = []
        for _ in range(n):
            t0 = time.perf_counter()
            be.run(ids, pos, cu, True)
            ts.append(time.perf_counter() - t0)
        ts = np.array(ts) * 1e3
        loop = be.engine.run_repeat(ids, pos, cu, True, out, n) / n * 1e3
        print(
            f"  {b}x{s}: p50 {np.median(ts):.3f} ms  p99 {np.percentile(ts, 99):.3f} ms  "
            f"C++ loop mean {loop:.3f} ms  ({b / np.median(ts) * 1e3:.1f} seq/s)"
        )


if __name__ == "__main__":
    main()
