"""Peak RSS (VmHWM) of a fresh process that loads a saved INT8 artifact and encodes 1x128,
per ISA (ZOI_CPU_ISA forced), as `zoi bench` measures it (no torch imported).

    python lab/cpu/rss_fresh.py ARTIFACT_DIR [--isa vnni,avx2] [--max-tokens 4096] [--text]

Prints, per ISA, VmHWM after `import zoi`, after `zoi.load`, after 5 calls of 1x128, and the
engine's memory() (weights / arena / scratch bytes). The calls are `run_packed` of 128 ids, as
`zoi bench` times them; --text: `encode` of a 128-token text of real sentences instead (the
tokenizer in the path), and which of HF tokenizers / torch the process imported.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

CHILD = r"""
import json, sys
import numpy as np

def hwm():
    with open("/proc/self/status") as f:
        for ln in f:
            if ln.startswith(("VmHWM", "VmRSS")):
                k, v = ln.split(":")
                out[k + "_" + stage] = int(v.split()[0]) / 1024
out = {}
stage = "numpy"; hwm()
import zoi
stage = "import"; hwm()
e = zoi.load(sys.argv[1], device="cpu", max_tokens=int(sys.argv[2]))
stage = "load"; hwm()
n_tok = 128
if sys.argv[3] == "text":  # real words, as many as make 128 tokens (or 127: a word of 2)
    import zoi.data, pathlib
    words = (pathlib.Path(zoi.data.__file__).parent / "eval.txt").read_text().split()
    lo, hi = 1, len(words)
    while lo < hi:  # the most words whose tokens fit 128
        mid = (lo + hi + 1) // 2
        if e.tokenizer.count_tokens([" ".join(words[:mid])])[0] <= 128:
            lo = mid
        else:
            hi = mid - 1
    text = [" ".join(words[:lo])]
    n_tok = e.tokenizer.count_tokens(text)[0]
    for _ in range(5):
        y = e.encode(text, normalize_embeddings=False)
else:
    ids = (np.arange(128) * 7919 % 19000 + 1000).astype(np.int32)  # no numpy.random (libcrypto: +3 MB)
    pos = np.arange(128, dtype=np.int32)
    cu = np.array([0, 128], np.int32)
    for _ in range(5):
        y = e.run_packed(ids, pos, cu, normalize=False)
assert np.isfinite(y).all()
stage = "run"; hwm()
mem = {k: v for k, v in e.memory().items() if isinstance(v, (int, str))}
print(json.dumps({"rss_mb": out, "memory": mem, "torch": "torch" in sys.modules,
                  "tokenizers": "tokenizers" in sys.modules, "tokens": n_tok}))
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("artifact")
    ap.add_argument("--isa", default="vnni,avx512,avx2,scalar")
    ap.add_argument("--max-tokens", type=int, default=4096)
    ap.add_argument("--text", action="store_true", help="encode a 128-token text (tokenizer)")
    a = ap.parse_args()
    from zoi import _cpu

    for isa in a.isa.split(","):
        if not _cpu.isa_supported(isa):
            print(f"{isa}: not supported here")
            continue
        env = dict(os.environ, ZOI_CPU_ISA=isa)
        out = subprocess.run(
            [
                sys.executable,
                "-c",
                CHILD,
                a.artifact,
                str(a.max_tokens),
                "text" if a.text else "ids",
            ],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        r = json.loads(out.strip().splitlines()[-1])
        m, mem = r["rss_mb"], r["memory"]
        print(
            f"{isa:7s} max_tokens={a.max_tokens}: VmHWM numpy {m['VmHWM_numpy']:.1f} import {m['VmHWM_import']:.1f} "
            f"load {m['VmHWM_load']:.1f} run {m['VmHWM_run']:.1f} MB (VmRSS {m['VmRSS_run']:.1f}); "
            f"weights {mem.get('weights_bytes', 0) / 1e6:.1f} MB arena {mem.get('arena_bytes', 0) / 1e6:.1f} "
            f"scratch {mem.get('scratch_bytes', 0) / 1e6:.1f}; {'text' if a.text else 'ids'} of "
            f"{r['tokens']} tokens; imported: torch {r['torch']}, tokenizers {r['tokenizers']}"
        )


if __name__ == "__main__":
    main()
