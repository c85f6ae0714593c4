"""GPU check of CudaBackend.submit / wait (lab): the tiny INT8 model of
tests/cuda_backend/test_submit.py (so its kernels are compiled once for both), every chunk of
a pipelined loop (two tickets in flight) against run(), and host-observed µs per chunk of
sequential run() vs the pipelined loop (small kernels: this measures the call path).

    ZOI_TRITON_COMPILED=1 PYTHONPATH=src:. python lab/gpu/submit_check.py --out gpu_submit.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]

from tests.cuda_backend.cuda_helpers import batch, tiny_model  # noqa: E402

from zoi.backends.cuda.backend import CudaBackend  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="gpu_submit.json")
    ap.add_argument("--iters", type=int, default=300)
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    be = CudaBackend(tiny_model("int8", max_tokens=64, max_batch=16), buckets=[16, 64],
                     persistent_max=0)  # fmt: skip
    built = time.perf_counter() - t0
    rng = np.random.default_rng(5)
    cases = [batch(lens, seed=rng) for lens in ([3], [20, 5], [40, 11, 1], [7] * 9, [16])]
    want = [be.run(*c, True) for c in cases]
    H = be.spec.hidden
    outs = [np.full((16, H), np.nan, np.float32) for _ in range(2)]
    bad = 0
    seq_us, pipe_us = [], []
    for _ in range(3):  # alternating rounds
        t = time.perf_counter()
        for i in range(a.iters):
            be.run(*cases[i % len(cases)], True)
        seq_us.append((time.perf_counter() - t) / a.iters * 1e6)
        t = time.perf_counter()
        pending = []
        for i in range(a.iters):
            c = i % len(cases)
            o = outs[i % 2]
            pending.append((c, be.submit(*cases[c], True, o), o))
            if len(pending) == 2:
                j, tk, o2 = pending.pop(0)
                be.wait(tk)
                bad += not np.array_equal(o2[: len(want[j])], want[j])
        for j, tk, o2 in pending:
            be.wait(tk)
            bad += not np.array_equal(o2[: len(want[j])], want[j])
        pipe_us.append((time.perf_counter() - t) / a.iters * 1e6)
    r = {
        "device": be.device_name,
        "build_s": round(built, 1),
        "iters": a.iters,
        "mismatches": int(bad),
        "run_us_per_chunk": [round(x, 2) for x in seq_us],
        "pipelined_us_per_chunk": [round(x, 2) for x in pipe_us],
        "memory": {k: v for k, v in be.memory().items() if k in ("pinned_bytes", "graph_nodes")},
    }
    print(json.dumps(r), flush=True)
    Path(a.out).write_text(json.dumps(r, indent=1))
    return 0 if bad == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
