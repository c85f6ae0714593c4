"""Per-op profile of the MiniLM-shaped forward under one ISA (default avx2), and an A/B of two builds.

    python lab/cpu/avx2_ops.py [--isa avx2] [--shapes 1x16,1x128,32x128] [--precisions int8,fp32]
        [--threads 1] [--runs 10] [--rounds 3] [--base DIR] [--json OUT]

Thread 0's CPU time (CLOCK_THREAD_CPUTIME_ID, robust to other load) per engine step, medians over
`--runs` profiled forwards, summed by op: the GEMMs by linear (qkv / o / ffn1 / ffn2), attention,
layernorm (+ its fused quantise), quantise, embed (+ LayerNorm + quantise), pool. GELU runs inside
the FFN1 GEMM's epilogue, so its share is measured apart: the FFN1 GEMM alone (`bench_gemm`, same
M x 1536 x 384, one thread, CPU time) with act gelu against act none, interleaved, the difference
x layers ("gelu" below, taken out of "gemm ffn1").

--base DIR: DIR is a `src` tree (a `zoi` package with its own built `_cpu`, e.g. main's, exported
and built apart); every round runs the base build and this one in fresh processes, alternately, and
records whether their pooled outputs are bit-identical. The load average is recorded around every
measurement. Each worker is this script with --worker.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LIN = ("qkv", "o", "ffn1", "ffn2")


def _use_tree(src: str | None) -> None:
    """import zoi from `src` instead of the editable install (drop scikit-build's finders)."""
    if src:
        sys.meta_path[:] = [f for f in sys.meta_path if "ScikitBuild" not in type(f).__name__]
        sys.path.insert(0, src)
    sys.path.insert(0, str(ROOT / "tests" / "cpu"))
    sys.path.insert(0, str(ROOT))


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def worker(a) -> dict:
    _use_tree(a.tree)
    import numpy as np
    from helpers import batch, make_model, minilm_spec

    import zoi
    from zoi import _cpu
    from zoi.backends.cpu import CpuBackend

    spec = minilm_spec()
    b, s = (int(v) for v in a.shape.split("x"))
    kw = {}
    if a.scheme == "dynamic_asym":  # as the real artifact: asymmetric rows, SmoothQuant act_mul
        kw = dict(
            default_scheme="dynamic_asym",
            act_transforms={f"l{i}.{p}": "mul" for i in range(6) for p in LIN},
        )
    model = make_model(spec, a.precision, max_tokens=b * s, max_batch=b, **kw)
    be = CpuBackend(model, isa=a.isa, nthreads=a.threads)
    ids, pos, cu = batch([s] * b, spec.vocab_size, 1)
    out = be.run(ids, pos, cu, False)
    digest = hashlib.sha256(out.tobytes()).hexdigest()[:16]
    for _ in range(2):
        be.engine.profile(ids, pos, cu)
    load0 = os.getloadavg()[0]
    runs = [be.engine.profile(ids, pos, cu) for _ in range(a.runs)]
    load1 = os.getloadavg()[0]
    kinds = [k for k, _, _ in runs[0]]
    cpu = np.median(np.array([[c for _, _, c in r] for r in runs]), axis=0)
    wall = np.median(np.array([[w for _, w, _ in r] for r in runs]), axis=0)
    gk = "gemm_i8" if a.precision == "int8" else "gemm_f32"
    by: dict[str, float] = defaultdict(float)
    gi = 0
    for k, c in zip(kinds, cpu, strict=True):
        if k == gk:
            by[f"gemm {LIN[gi % 4]}"] += c
            gi += 1
        else:
            by[k] += c
    # GELU: the FFN1 GEMM alone with and without it, interleaved
    M = b * s
    it = max(1, int(2e8 // (M * 1536 * 384)))
    kind = "i8" if a.precision == "int8" else "f32"
    d = []
    for _ in range(a.gelu_rounds):
        g = _cpu.bench_gemm(kind, M, 1536, 384, a.isa, 1, it, "gelu")[1]
        n = _cpu.bench_gemm(kind, M, 1536, 384, a.isa, 1, it, "none")[1]
        d.append(g - n)
    gelu = max(0.0, float(np.median(d))) * spec.layers
    by["gelu (in gemm ffn1)"] = gelu
    by["gemm ffn1"] -= gelu
    return {
        "zoi": str(Path(zoi.__file__).parent),
        "isa": be.isa,
        "threads": be.engine.nthreads,
        "shape": a.shape,
        "precision": a.precision,
        "scheme": a.scheme if a.precision == "int8" else None,
        "runs": a.runs,
        "load_before": load0,
        "load_after": load1,
        "output_sha256_16": digest,
        "total_cpu_ms": float(cpu.sum()) * 1e3,
        "total_wall_ms": float(wall.sum()) * 1e3,
        "ops_cpu_ms": {k: v * 1e3 for k, v in sorted(by.items(), key=lambda kv: -kv[1])},
        "gelu_ffn1_delta_ms_per_layer": [x * 1e3 for x in d],
    }


def _run_worker(tree: str | None, a, shape: str, precision: str) -> dict:
    cmd = [
        sys.executable,
        __file__,
        "--worker",
        "--shape",
        shape,
        "--precision",
        precision,
        "--isa",
        a.isa,
        "--threads",
        str(a.threads),
        "--runs",
        str(a.runs),
        "--scheme",
        a.scheme,
        "--gelu-rounds",
        str(a.gelu_rounds),
    ]
    if tree:
        cmd += ["--tree", tree]
    r = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if r.returncode:
        raise SystemExit(f"worker failed ({' '.join(cmd)}):\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--isa", default="avx2")
    ap.add_argument("--shapes", default="1x16,1x128,32x128")
    ap.add_argument("--precisions", default="int8,fp32")
    ap.add_argument("--scheme", default="dynamic", choices=["dynamic", "dynamic_asym"])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--gelu-rounds", type=int, default=3)
    ap.add_argument("--base", default="", help="a src tree with main's zoi + _cpu: A/B against it")
    ap.add_argument("--json", default="")
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--tree", default="")
    ap.add_argument("--shape", default="1x128")
    ap.add_argument("--precision", default="int8")
    a = ap.parse_args()
    if a.worker:
        print(json.dumps(worker(a)))
        return
    builds = [("this", None)] + ([("base", a.base)] if a.base else [])
    rows = []
    for rnd in range(a.rounds):
        for shape in a.shapes.split(","):
            for prec in a.precisions.split(","):
                order = builds if rnd % 2 == 0 else builds[::-1]
                for name, tree in order:
                    r = _run_worker(tree, a, shape, prec)
                    r.update(build=name, round=rnd)
                    rows.append(r)
                    ops = "  ".join(f"{k} {v:.2f}" for k, v in r["ops_cpu_ms"].items())
                    print(
                        f"[{rnd}] {name:<4} {prec} {shape:>6} total {r['total_cpu_ms']:8.2f} ms cpu  "
                        f"load {r['load_before']:.1f}  out {r['output_sha256_16']}  | {ops}",
                        flush=True,
                    )
    git = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    doc = {
        "what": "per-op thread-0 CPU time of the MiniLM-shaped forward (random weights), lab/cpu/avx2_ops.py",
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"cpu": _cpu_model(), "nproc": os.cpu_count(), "platform": platform.platform()},
        "git_head": git.stdout.strip(),
        "args": {
            k: v for k, v in vars(a).items() if k not in ("worker", "tree", "shape", "precision")
        },
        "rows": rows,
    }
    if a.json:
        Path(a.json).write_text(json.dumps(doc, indent=1) + "\n")
        print("wrote", a.json)


if __name__ == "__main__":
    main()
