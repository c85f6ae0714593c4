"""Where the host time of a GPU decode step goes: Qwen2.5-0.5B shape, INT8, 32 streams,
the decode loop of lab/gpu/decode_bench.py once plain and once under cProfile (top functions by
own time). The step's host share = decode_step_ms - graph_us_b32.

    python lab/gpu/decode_profile.py [--streams 32] [--precision int8]
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import decode_bench  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--streams", type=int, default=32)
    ap.add_argument("--precision", default="int8")
    ap.add_argument("--model", default="qwen2.5-0.5b")
    a = ap.parse_args(argv)
    print(json.dumps(decode_bench.streams(a.model, a.precision, a.streams, 128, 128)))
    from zoi.decoder.cuda import CudaDecoderBackend

    pr = cProfile.Profile()
    orig = CudaDecoderBackend.step

    def step(self):  # profile the steps only, not the build
        pr.enable()
        try:
            return orig(self)
        finally:
            pr.disable()

    CudaDecoderBackend.step = step
    res = decode_bench.streams(a.model, a.precision, a.streams, 128, 64)
    CudaDecoderBackend.step = orig
    print("under cProfile:", json.dumps(res))
    pstats.Stats(pr).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
