"""Does overlapping tokenising with the CPU forward pay on this host?

`python lab/cpu/cpu_overlap_ab.py [--precision int8] [--texts 1000] [--rounds 8] [--out F]`

Two ways to run the same `encode(texts)` (1000 real texts of mixed lengths, the default
arena), A/B interleaved in one process:

- sync: the CPU backend as shipped (SyncSubmit): chunk i+1 is tokenised (on the pool) after
  chunk i's forward returns;
- overlap: submit hands the forward to one blocking worker thread (a queue, no spinning), so
  the caller tokenises chunk i+1 while the forward of chunk i runs on the pool.

The outputs are checked equal, bit for bit. Reported: p50 / min per call and the ratio, with
the machine's foreign load (other processes) during the run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np


class ThreadedSubmit:
    """submit: the wrapped backend's run_into on one worker thread; wait: its result."""

    def __init__(self, inner):
        self.inner, self.name = inner, inner.name
        self.ex = ThreadPoolExecutor(max_workers=1)

    def submit(self, ids, positions, cu, normalize, out):
        return self.ex.submit(self.inner.run_into, ids, positions, cu, normalize, out)

    def wait(self, ticket):
        return ticket.result()

    def run_into(self, *a):
        return self.inner.run_into(*a)

    def memory(self):
        return self.inner.memory()


def main(argv=None) -> int:
    import zoi
    from zoi.bench.sysinfo import LoadMeter
    from zoi.bench.text import Tok, natural_texts
    from zoi.engine import default_model_path

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--precision", default="int8")
    ap.add_argument("--texts", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=None)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    model = str(default_model_path())
    texts = natural_texts(Tok(model), a.texts, max_len=256)
    eng = zoi.compile(model, device="cpu", precision=a.precision, max_tokens=a.max_tokens)
    sync, over = eng.backend, ThreadedSubmit(eng.backend)
    ref = eng.encode(texts)
    eng.backend = over
    assert np.array_equal(eng.encode(texts), ref), "overlap changed the output"
    ns = {"sync": [], "overlap": []}
    meter = LoadMeter()
    meter.start()
    for r in range(a.rounds):
        for k in ("sync", "overlap") if r % 2 == 0 else ("overlap", "sync"):
            eng.backend = sync if k == "sync" else over
            t0 = time.perf_counter_ns()
            eng.encode(texts)
            ns[k].append(time.perf_counter_ns() - t0)
    foreign = meter.stop()
    eng.backend = sync
    res = {
        "precision": a.precision,
        "texts": len(texts),
        "chunks_max_tokens": eng.max_tokens,
        "threads": os.environ.get("ZOI_NUM_THREADS") or os.cpu_count(),
        "p50_ms": {k: float(np.median(v)) / 1e6 for k, v in ns.items()},
        "min_ms": {k: float(np.min(v)) / 1e6 for k, v in ns.items()},
        "foreign_cores": round(foreign, 2),
        "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    res["overlap_over_sync_p50"] = res["p50_ms"]["overlap"] / res["p50_ms"]["sync"]
    res["overlap_over_sync_min"] = res["min_ms"]["overlap"] / res["min_ms"]["sync"]
    print(json.dumps(res, indent=1))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
