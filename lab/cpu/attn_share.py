"""Share of attention in the MiniLM-shaped INT8 forward, per attention mode
(Engine.set_attention_precision: 0 FP32, 1 INT8 q.k^T, 2 INT8 q.k^T and p.v, 3 AMX-BF16 q.k^T and p.v), thread 0's CPU time per
step (Engine.profile), modes interleaved run by run, medians; the load average recorded.

    python lab/cpu/attn_share.py [--shapes 1x16,1x128,8x128,32x128] [--modes 0,1,2,3]
                                 [--threads 1] [--runs 7] [--isa vnni] [--out JSON]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "cpu"))
from helpers import batch, make_model, minilm_spec  # noqa: E402

from zoi.backends.cpu import CpuBackend  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="1x16,1x128,8x128,32x128")
    ap.add_argument("--modes", default="0,1,2,3")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--isa", default="")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    spec = minilm_spec()
    modes = [int(m) for m in a.modes.split(",")]
    rep = {
        "what": "attention share of the MiniLM-shaped INT8 forward (random weights), "
        "thread 0 CPU ms per op kind, medians",
        "threads": a.threads,
        "runs": a.runs,
        "shapes": {},
    }
    for shape in a.shapes.split(","):
        b, s = (int(v) for v in shape.split("x"))
        model = make_model(spec, "int8", max_tokens=b * s, max_batch=b)
        be = CpuBackend(model, isa=a.isa or None, nthreads=a.threads)
        rep["isa"] = be.isa
        ids, pos, cu = batch([s] * b, spec.vocab_size, 1)
        load0 = os.getloadavg()
        per = {m: [] for m in modes}
        for m in modes:  # warm-up
            be.engine.set_attention_precision(m)
            be.engine.profile(ids, pos, cu)
        for _ in range(a.runs):
            for m in modes:
                be.engine.set_attention_precision(m)
                per[m].append(be.engine.profile(ids, pos, cu))
        be.engine.set_attention_precision(0)
        row = {"loadavg_start": load0, "loadavg_end": os.getloadavg(), "modes": {}}
        for m, runs in per.items():
            kinds = [k for k, _, _ in runs[0]]
            cpu = np.array([[c for _, _, c in r] for r in runs])  # [runs, steps]
            att = np.median(cpu[:, [i for i, k in enumerate(kinds) if k == "attention"]].sum(1))
            tot = np.median(cpu.sum(1))
            by = {}
            for k in sorted(set(kinds)):
                by[k] = round(
                    float(np.median(cpu[:, [i for i, x in enumerate(kinds) if x == k]].sum(1)))
                    * 1e3,
                    3,
                )
            row["modes"][str(m)] = {
                "attention_ms": round(float(att) * 1e3, 3),
                "total_ms": round(float(tot) * 1e3, 3),
                "attention_share": round(float(att / tot), 4),
                "by_kind_ms": by,
            }
            print(
                f"{shape} mode {m}: attention {att * 1e3:.3f} ms of {tot * 1e3:.3f} ms "
                f"({100 * att / tot:.1f}%)  load {load0[0]:.1f}",
                flush=True,
            )
        rep["shapes"][shape] = row
        del be, model
    if a.out:
        Path(a.out).write_text(json.dumps(rep, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
