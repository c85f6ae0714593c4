"""In-process A/B of INT8 artifacts on the real MiniLM (e.g. 8-bit weights against 7-bit):
interleaved rounds, one thread, process CPU time per call (robust to other load).

    ZOI_CPU_ISA=avx2 ZOI_NUM_THREADS=1 python lab/cpu/w7_engine_ab.py ART_A ART_B [--rounds 5]

Token ids are MiniLM's real vocabulary range; shapes 1x16, 1x128, 32x128. Prints, per shape and
round, the median CPU ms of each artifact and B / A; the outputs' max difference is printed too
(7-bit weights change the model, so it is not zero across bit widths).
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--shapes", default="1x16,1x128,32x128")
    args = ap.parse_args()
    import zoi
    from zoi import _cpu

    engs = {
        k: zoi.load(p, device="cpu", max_tokens=4096) for k, p in (("A", args.a), ("B", args.b))
    }
    print("isa", _cpu.active_isa())
    for shape in args.shapes.split(","):
        nb, nt = (int(v) for v in shape.split("x"))
        rng = np.random.default_rng(0)
        ids = rng.integers(1000, 29000, nb * nt).astype(np.int32)
        pos = np.tile(np.arange(nt, dtype=np.int32), nb)
        cu = (np.arange(nb + 1) * nt).astype(np.int32)
        calls = max(3, int(3000 / (nb * nt)))
        outs = {k: e.run_packed(ids, pos, cu, normalize=True) for k, e in engs.items()}
        ratios = []
        for r in range(args.rounds):
            med = {}
            for k in ("A", "B") if r % 2 == 0 else ("B", "A"):
                ts = []
                for _ in range(calls):
                    t0 = time.process_time()
                    engs[k].run_packed(ids, pos, cu, normalize=True)
                    ts.append(time.process_time() - t0)
                med[k] = float(np.median(ts)) * 1e3
            ratios.append(med["B"] / med["A"])
            print(
                f"{shape} round {r}: A {med['A']:.2f} ms, B {med['B']:.2f} ms, B/A {ratios[-1]:.3f}"
            )
        d = float(np.abs(outs["A"] - outs["B"]).max())
        print(
            f"{shape}: B/A median {np.median(ratios):.3f} (min {min(ratios):.3f}, max {max(ratios):.3f}); max |A - B| {d:.2e}"
        )


if __name__ == "__main__":
    main()
