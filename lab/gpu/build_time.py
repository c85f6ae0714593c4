"""Compile time of a minilm engine on the GPU (target: under 60 s), cold and warm.

    python lab/gpu/build_time.py --out $OUT/build_time.json [--precisions int8,fp16]

Each build runs in its own process: `zoi.compile(<minilm>, device="cuda", precision=p)`.
"cold": fresh Triton cache and fresh zoi cache (no path cache: every small bucket builds and
times both paths); "warm": the same caches again (Triton's compiled kernels, and the path cache,
so only each bucket's winner is built). Reports seconds and each bucket's path / cached flag
(memory()["bucket_paths"]). minilm: ZOI_MINILM_DIR (the real model's FP16 copy), else bundled.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHILD = r"""
import json, os, sys, time
t0 = time.perf_counter()
import zoi
t1 = time.perf_counter()
e = zoi.compile(os.environ.get("ZOI_MINILM_DIR") or None, device="cuda", precision=sys.argv[1])
t2 = time.perf_counter()
be = e.backend
mem = be.memory()
print(json.dumps(dict(import_s=t1 - t0, compile_s=t2 - t1, buckets=list(be.buckets),
                      bucket_paths=mem.get("bucket_paths"), max_tokens=be.max_tokens)))
"""


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="gpu_out/build_time.json")
    ap.add_argument("--precisions", default="int8,fp16")
    args = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for prec in args.precisions.split(","):
            env = dict(
                os.environ, TRITON_CACHE_DIR=f"{d}/triton-{prec}", ZOI_CACHE_DIR=f"{d}/zoi-{prec}"
            )
            for run in ("cold", "warm"):
                t0 = time.perf_counter()
                p = subprocess.run([sys.executable, "-c", CHILD, prec], env=env,
                                   capture_output=True, text=True, timeout=280)  # fmt: skip
                wall = time.perf_counter() - t0
                if p.returncode != 0:
                    print(p.stderr[-3000:], flush=True)
                    rows.append(dict(precision=prec, run=run, error=p.stderr[-2000:]))
                    continue
                r = json.loads(p.stdout.strip().splitlines()[-1])
                r.update(precision=prec, run=run, process_s=wall)
                rows.append(r)
                paths = {k: (v.get("path"), v.get("cached")) if isinstance(v, dict) else v
                         for k, v in (r.get("bucket_paths") or {}).items()}  # fmt: skip
                print(f"{prec} {run}: compile {r['compile_s']:.1f} s (process {wall:.1f} s) "
                      f"buckets {r['buckets']} paths {paths}", flush=True)  # fmt: skip
                Path(args.out).parent.mkdir(parents=True, exist_ok=True)
                Path(args.out).write_text(json.dumps(dict(gpu_rows=rows), indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
