"""Decode speed of the CPU decoder backend through its public step API, one sequence, greedy:
the median step time of --new decode steps after a --prompt token prefill, --rounds times.
Runs on any zoi tree (the A/B of two builds: put one first on the path, e.g.
`PYTHONPATH=/tmp/oldzoi:$SITE python -S lab/cpu/decode_ab.py --precision w8a8`).

    python lab/cpu/decode_ab.py [--model ~/.cache/zoi/bench/decoders/smollm2-135m]
        [--precision int8] [--prompt 128] [--new 64] [--rounds 3] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np


def main() -> None:
    import zoi
    from zoi.decoder.api import SamplingParams
    from zoi.decoder.cpu import CpuBackend
    from zoi.decoder.loader import load_decoder

    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=str(Path.home() / ".cache/zoi/bench/decoders/smollm2-135m"))
    ap.add_argument("--precision", default="int8")
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    spec, w, _ = load_decoder(a.model)
    n = a.prompt + a.new + 1
    be = CpuBackend(
        spec,
        w,
        precision=a.precision,
        num_blocks=-(-n // 16) + 1,
        block_size=16,
        max_batch=1,
        max_seq_len=n,
        threads=a.threads,
    )
    ids = np.random.default_rng(0).integers(0, spec.vocab_size, a.prompt).astype(np.int32)
    rounds = []
    for r in range(a.rounds + 1):  # the first round warms up
        be.add(r, ids, SamplingParams(max_new_tokens=a.new, ignore_eos=True))
        t0 = time.perf_counter()
        be.step()
        ttft = time.perf_counter() - t0
        steps = []
        for _ in range(a.new - 1):
            t0 = time.perf_counter()
            ev = be.step()
            steps.append(time.perf_counter() - t0)
            if ev and ev[0].finish is not None:
                break
        if r:
            rounds.append((ttft * 1e3, float(np.median(steps)) * 1e3))
    out = {
        "zoi": zoi.__file__,
        "model": Path(a.model).name,
        "precision": a.precision,
        "isa": be.isa,
        "ttft_ms": float(np.median([t for t, _ in rounds])),
        "decode_ms_per_token": float(np.median([s for _, s in rounds])),
        "rounds": rounds,
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
