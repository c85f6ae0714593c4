"""End-to-end fidelity of the opt-in INT8 attention (Engine.set_attention_precision) on the real
all-MiniLM-L6-v2: one INT8 artifact (`zoi compile` of the bundled model, e.g. the bench cache),
encoded on the CPU with attention mode 0 (FP32), 1 (INT8 q.k^T), 2 (INT8 q.k^T and p.v) and 3
(AMX-BF16 q.k^T and p.v),
each against the FP32 engine, per held-out domain (zoi.quant.fidelity.domain_report: mean / min
cosine, top-10 / top-1 neighbour agreement), as `zoi eval` reports them.

    python lab/cpu/attn_fidelity.py [--int8 DIR] [--fp32 DIR|bundled] [--modes 0,1,2,3] [--out JSON]

--fp32: an FP32 artifact run on the CPU (default: the int8 folder's sibling fp32/), or
"bundled" to compile the bundled model on the reference backend (what `zoi eval` does; slower).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np


def newest_cached() -> Path | None:
    root = Path.home() / ".cache" / "zoi" / "bench" / "minilm"
    c = sorted(root.glob("*/int8/zoi.json"), key=lambda p: p.stat().st_mtime)
    return c[-1].parent if c else None


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--int8", default=None)
    ap.add_argument("--fp32", default=None)
    ap.add_argument("--modes", default="0,1,2,3")
    ap.add_argument("--domains", default="")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    import zoi
    from zoi.data import default_domains, domain_texts
    from zoi.quant.fidelity import domain_report

    i8_dir = Path(a.int8) if a.int8 else newest_cached()
    if i8_dir is None:
        print("no INT8 artifact: pass --int8 (zoi compile ... --precision int8)", file=sys.stderr)
        return 2
    q = zoi.load(str(i8_dir), device="cpu")
    if a.fp32 == "bundled":
        f = zoi.compile(q.model.meta.get("source"), device="reference", precision="fp32")
        fsrc = "bundled model, reference backend"
    else:
        fdir = Path(a.fp32) if a.fp32 else i8_dir.parent / "fp32"
        f = zoi.load(str(fdir), device="cpu")
        fsrc = f"{fdir} (cpu)"
    eng = q.backend.engine
    doms = [d for d in a.domains.split(",") if d] or list(default_domains(False))
    texts = {d: domain_texts(d) for d in doms}
    ref = {d: np.asarray(f.encode(t, normalize_embeddings=True)) for d, t in texts.items()}
    rep = {
        "what": "INT8 attention modes end to end (Engine.set_attention_precision)",
        "int8_artifact": str(i8_dir),
        "fp32": fsrc,
        "isa": q.backend.isa,
        "cpu": platform.processor() or platform.machine(),
        "loadavg_start": os.getloadavg(),
        "modes": {},
    }
    for mode in (int(m) for m in a.modes.split(",")):
        eng.set_attention_precision(mode)
        t0 = time.perf_counter()
        per = {}
        for d, t in texts.items():
            e = np.asarray(q.encode(t, normalize_embeddings=True))
            r = domain_report(ref[d], e, t, 3)
            per[d] = {k: r[k] for k in ("texts", "cos_mean", "cos_min", "top10", "top1")}
        rep["modes"][str(mode)] = {"domains": per, "seconds": round(time.perf_counter() - t0, 2)}
        print(
            f"mode {mode}: "
            + "; ".join(
                f"{d} {v['cos_mean']:.5f}/{v['cos_min']:.5f}/{v['top10']:.4f}/{v['top1']:.4f}"
                for d, v in per.items()
            ),
            flush=True,
        )
    eng.set_attention_precision(0)
    rep["loadavg_end"] = os.getloadavg()
    if a.out:
        Path(a.out).write_text(json.dumps(rep, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
