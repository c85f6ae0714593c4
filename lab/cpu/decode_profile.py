"""Per-step profile of one generation step on the CPU engine (thread 0's wall and CPU time per
step kind, medians over steps): a prefill of --prompt tokens, then --steps decode steps of one
sequence, greedy.

    python lab/cpu/decode_profile.py [--model ~/.cache/zoi/bench/decoders/smollm2-135m]
        [--precision int8] [--prompt 128] [--steps 32] [--threads 2]

The bench's decode workloads write their random-init checkpoints of real shapes under
~/.cache/zoi/bench/decoders/ (`zoi bench --workloads smollm2-135m-decode ...`).
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path

import numpy as np

from zoi.decoder.cpu import CpuBackend
from zoi.decoder.loader import load_decoder


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=str(Path.home() / ".cache/zoi/bench/decoders/smollm2-135m"))
    ap.add_argument("--precision", default="int8")
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--isa", default="")
    a = ap.parse_args()
    spec, w, _ = load_decoder(a.model)
    n = a.prompt + a.steps + 1
    be = CpuBackend(
        spec,
        w,
        precision=a.precision,
        num_blocks=-(-n // 16),
        block_size=16,
        max_batch=1,
        max_seq_len=n,
        threads=a.threads,
        isa=a.isa or None,
    )
    eng = be.engine
    tables = np.arange(-(-n // 16), dtype=np.int32)[None, :]
    row = np.zeros(1, np.int32)
    ids = np.random.default_rng(0).integers(0, spec.vocab_size, a.prompt).astype(np.int32)
    prefill = eng.profile_gen(
        ids, row, np.zeros(1, np.int32), np.array([a.prompt], np.int32), tables
    )
    runs = []
    for s in range(a.steps):
        one = np.array([int(ids[s % a.prompt])], np.int32)
        runs.append(
            eng.profile_gen(
                one, row, np.array([a.prompt + s], np.int32), np.ones(1, np.int32), tables
            )
        )
    kinds = [k for k, _, _ in runs[0]]
    wall = np.median(np.array([[x for _, x, _ in r] for r in runs]), axis=0)
    cpu = np.median(np.array([[c for _, _, c in r] for r in runs]), axis=0)
    by = defaultdict(lambda: [0.0, 0.0, 0])
    for k, x, c in zip(kinds, wall, cpu, strict=True):
        by[k][0] += x
        by[k][1] += c
        by[k][2] += 1
    print(f"{Path(a.model).name} {a.precision} isa={be.isa} threads={eng.nthreads}")
    print(
        f"prefill {a.prompt} tokens: {sum(x for _, x, _ in prefill) * 1e3:.2f} ms (thread-0 wall)"
    )
    print(f"decode step, median of {a.steps}:")
    print(f"{'step':<16}{'n':>4}{'wall ms':>10}{'cpu ms':>10}")
    for k, (x, c, m) in sorted(by.items(), key=lambda kv: -kv[1][0]):
        print(f"{k:<16}{m:>4}{x * 1e3:>10.3f}{c * 1e3:>10.3f}")
    print(f"{'total':<16}{len(kinds):>4}{wall.sum() * 1e3:>10.3f}{cpu.sum() * 1e3:>10.3f}")


if __name__ == "__main__":
    main()
