"""A/B of the FP32 GEMM of two builds of the native core, interleaved: per round, one child
process per build times every shape (`_cpu.bench_gemm("f32", ...)`: random data, packed weights,
through the thread pool), the order of the builds alternating between rounds; medians over rounds
of the wall time and of the calling thread's CPU time, and the fraction of the FP32 FMA peak that
the wall time reaches (--peak, GFLOP/s per core: 233 / 2 on the 2-core Zen 4 host).

    python lab/cpu/gemm_f32_ab.py --so base=/tmp/base/_cpu.so [--so new=INSTALLED]
        [--set minilm|decode|all] [--threads 1,2] [--rounds 5] [--isa vnni]

A build is LABEL=PATH of a `_cpu` extension (INSTALLED: the one `import zoi` loads). The weights of
the decode shapes (M <= 8) are larger than the L3 where N is the MLP's, so those stream from memory
as in a model; the smaller ones stay cache-resident here (the attention projections).

    python lab/cpu/gemm_f32_ab.py --so base=... --so new=INSTALLED --rounds 5 \
        --script "lab/cpu/profile_ops.py --precision fp32 --threads 2 --runs 30" --keys gemm_f32,total

runs a whole lab script under each build instead (zoi's Python with that build's native core),
the builds interleaved per round, and prints the medians of the numbers on the output lines that
start with a --keys word (profile_ops: n, wall ms, CPU ms; the ratio is of wall ms) or of the JSON keys named by --keys
(decode_ab.py: ttft_ms, decode_ms_per_token).
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys

MINILM = [  # (M, N, K, act): MiniLM-L6 1x128 qkv, o, ffn1 (GELU), ffn2
    (128, 1152, 384, "none"),
    (128, 384, 384, "none"),
    (128, 1536, 384, "gelu"),
    (128, 384, 1536, "none"),
]
DECODE = [  # one-row generation: Qwen2.5-0.5B (K = 896, I = 4864) and SmolLM2-135M (K = 576)
    (1, 1152, 896, "none"),
    (1, 9728, 896, "none"),
    (1, 896, 4864, "none"),
    (4, 9728, 896, "none"),
    (8, 9728, 896, "none"),
    (8, 896, 4864, "none"),
    (1, 3072, 576, "none"),
    (1, 576, 1536, "none"),
]

CHILD = r"""
import importlib.machinery, importlib.util, json, sys
path, isa, nts, shapes = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4])
if path == "INSTALLED":
    from zoi import _cpu
else:
    loader = importlib.machinery.ExtensionFileLoader("_cpu", path)
    spec = importlib.util.spec_from_loader("_cpu", loader)
    _cpu = importlib.util.module_from_spec(spec)
    loader.exec_module(_cpu)
out = []
for nt in nts:
    for M, N, K, act in shapes:
        it = max(3, min(200, int(3e9 / (2 * M * N * K + 4 * N * K * 50))))
        _cpu.bench_gemm("f32", M, N, K, isa, nt, 2, act)  # warm: pages, caches, clocks
        w, c = _cpu.bench_gemm("f32", M, N, K, isa, nt, it, act)
        out.append([nt, M, N, K, act, w, c])
print(json.dumps(out))
"""

SCRIPT = r"""
import importlib.machinery, importlib.util, runpy, sys
path, argv = sys.argv[1], sys.argv[2:]
if path != "INSTALLED":  # this build's core in place of the installed one, before zoi imports it
    loader = importlib.machinery.ExtensionFileLoader("zoi._cpu", path)
    spec = importlib.util.spec_from_loader("zoi._cpu", loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    sys.modules["zoi._cpu"] = mod
    import zoi
    zoi._cpu = mod
sys.argv = argv
runpy.run_path(argv[0], run_name="__main__")
"""


def _num(v: str) -> bool:
    try:
        float(v)
    except ValueError:
        return False
    return True


def run_script(a, builds) -> None:
    keys = a.keys.split(",")
    got: dict[str, dict[str, list]] = {}
    for r in range(a.rounds):
        order = builds if r % 2 == 0 else builds[::-1]
        for label, path in order:
            cmd = [sys.executable, "-c", SCRIPT, path, *shlex.split(a.script)]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            for line in out.splitlines():
                tok = line.split()
                if tok and tok[0] in keys:
                    nums = [float(v) for v in tok[1:] if _num(v)]  # profile_ops: n, wall ms, CPU ms
                    got.setdefault(tok[0], {}).setdefault(label, []).append(nums)
                elif line.startswith("{"):
                    d = json.loads(line)
                    for k in keys:
                        if k in d:
                            got.setdefault(k, {}).setdefault(label, []).append([float(d[k])])
    for k, by in got.items():
        line = f"{k:<22}"
        meds = []
        for label, _ in builds:
            cols = list(zip(*by[label], strict=True))
            med = [statistics.median(c) for c in cols]
            meds.append(med[1] if len(med) > 1 else med[0])  # profile_ops: wall ms after n
            line += f" | {label} " + " ".join(f"{v:9.3f}" for v in med)
        if len(meds) == 2:
            line += f" | {meds[1] / meds[0]:.3f}x"
        print(line, f"({a.rounds} rounds)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--so", action="append", required=True, help="LABEL=PATH (PATH: a _cpu .so or INSTALLED)"
    )
    ap.add_argument("--set", default="all", choices=("minilm", "decode", "all"))
    ap.add_argument("--shapes", default="", help="M,N,K[,act];... instead of --set")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--isa", default="")
    ap.add_argument("--peak", type=float, default=116.5, help="FP32 GFLOP/s of one core")
    ap.add_argument(
        "--script", default="", help="a lab script and its arguments, run under each build"
    )
    ap.add_argument("--keys", default="gemm_f32,total", help="output lines / JSON keys to collect")
    a = ap.parse_args()
    builds = [s.split("=", 1) for s in a.so]
    if a.script:
        run_script(a, builds)
        return
    shapes = {"minilm": MINILM, "decode": DECODE, "all": MINILM + DECODE}[a.set]
    if a.shapes:
        shapes = [
            [int(v) for v in sh.split(",")[:3]] + [(sh.split(",") + ["none"])[3]]
            for sh in a.shapes.split(";")
        ]
    nts = [int(t) for t in a.threads.split(",")]
    res: dict[tuple, dict[str, list]] = {}
    for r in range(a.rounds):
        order = builds if r % 2 == 0 else builds[::-1]
        for label, path in order:
            cmd = [sys.executable, "-c", CHILD, path, a.isa, json.dumps(nts), json.dumps(shapes)]
            rows = json.loads(
                subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            )
            for nt, M, N, K, act, w, c in rows:
                res.setdefault((nt, M, N, K, act), {}).setdefault(label, []).append((w, c))
    labels = [b[0] for b in builds]
    head = f"{'nt':>2} {'M':>4} {'N':>6} {'K':>5} {'act':>5}"
    for lb in labels:
        head += f" | {lb + ' ms':>10} {'cpu ms':>8} {'%peak':>5} {'GB/s':>5}"
    print(head)
    for (nt, M, N, K, act), by in res.items():
        line = f"{nt:>2} {M:>4} {N:>6} {K:>5} {act:>5}"
        for lb in labels:
            w = statistics.median(x[0] for x in by[lb])
            c = statistics.median(x[1] for x in by[lb])
            flops, wbytes = 2 * M * N * K, 4 * N * K
            line += f" | {w * 1e3:>10.4f} {c * 1e3:>8.4f} {100 * flops / w / 1e9 / (a.peak * nt):>5.1f} {wbytes / w / 1e9:>5.1f}"
        if len(labels) == 2:
            line += f" | {statistics.median(x[0] for x in by[labels[1]]) / statistics.median(x[0] for x in by[labels[0]]):.3f}x"
        print(line)


if __name__ == "__main__":
    main()
