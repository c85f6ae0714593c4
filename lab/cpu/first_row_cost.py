"""CPU cost of the first-row residual at inference (QuantConfig.first_row_residual): the real
MiniLM INT8 compiled twice (off / on, the same calibration budget), then `encode` p50 in ms at
1x16, 1x128, 8x128 and 32x128 (texts in), the two engines interleaved round by round so that
load changes hit both alike. Prints one JSON line with the CPU and the ISA.

    python lab/cpu/first_row_cost.py [--rounds 5] [--calls 40]"""

import argparse
import json
import platform
import time

import numpy as np

import zoi
from zoi import _cpu


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=40)
    a = ap.parse_args()
    text = " ".join(["the quick brown fox jumps over the lazy dog"] * 14)
    shapes = {
        "1x16": ["hello world, a short query of sixteen tokens or so ok"],
        "1x128": [text],
        "8x128": [text] * 8,
        "32x128": [text] * 32,
    }
    engines = {}
    for fr in (False, True):
        t0 = time.perf_counter()
        engines[fr] = zoi.compile(
            device="cpu", precision="int8", quant_config={"first_row_residual": fr}
        )
        print(f"first_row_residual={fr}: compiled in {time.perf_counter() - t0:.1f} s", flush=True)
    times = {(fr, s): [] for fr in engines for s in shapes}
    for _ in range(a.rounds):
        for name, texts in shapes.items():
            calls = max(3, a.calls // (1 + len(texts) // 8))
            for fr, eng in engines.items():
                eng.encode(texts)
                for _ in range(calls):
                    t = time.perf_counter()
                    eng.encode(texts)
                    times[(fr, name)].append(time.perf_counter() - t)
    res = {}
    for name in shapes:
        off = float(np.median(times[(False, name)])) * 1e3
        on = float(np.median(times[(True, name)])) * 1e3
        res[name] = {"off_ms": round(off, 3), "on_ms": round(on, 3), "on/off": round(on / off, 3)}
        print(f"{name}: off {off:.3f} ms, on {on:.3f} ms, x{on / off:.3f}", flush=True)
    cpu = next(
        (ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if "model name" in ln),
        platform.processor(),
    )
    print(json.dumps({"cpu": cpu, "isa": _cpu.active_isa(), "p50": res}))


if __name__ == "__main__":
    main()
