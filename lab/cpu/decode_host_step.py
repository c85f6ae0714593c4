"""Host cost of one decode step's bookkeeping (zoi.decoder.paged.PagedBackend.step) at B streams,
with a `_run` that does no device work: what the GPU decoder pays per step besides its graph
(H200, Qwen2.5-0.5B x32: step 1.94 ms vs graph 1.18 ms, bench/results/gpu_decode_bench_20261202T114508Z.json).

    python lab/cpu/decode_host_step.py --streams 32
"""

from __future__ import annotations

import argparse
import time
from types import SimpleNamespace

import numpy as np

from zoi.decoder.api import SamplingParams
from zoi.decoder.paged import PagedBackend


class _NoDevice(PagedBackend):
    def _run(self, rows, starts, counts, ids, samp, seeds):
        return (ids[np.cumsum(counts) - 1] + 1) % 1000  # one token per sequence


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--streams", type=int, default=32)
    ap.add_argument("--steps", type=int, default=2000)
    a = ap.parse_args(argv)
    spec = SimpleNamespace(vocab_size=1000, max_position_embeddings=1 << 20, eos_token_ids=(2,))
    be = _NoDevice(
        spec, num_blocks=a.streams * (a.steps // 16 + 4), block_size=16, max_batch=a.streams
    )
    for i in range(a.streams):
        be.add(
            i,
            np.arange(1, 9, dtype=np.int32),
            SamplingParams(max_new_tokens=a.steps + 1, ignore_eos=True),
        )
    be.step()  # prefill
    t0 = time.perf_counter()
    for _ in range(a.steps):
        be.step()
    us = (time.perf_counter() - t0) / a.steps * 1e6
    print(f"streams {a.streams}: {us:.1f} us per step of host bookkeeping")


if __name__ == "__main__":
    main()
