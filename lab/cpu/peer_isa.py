"""Check that `zoi bench --peer-isa avx2`'s caps take effect in each peer library.

For every peer family, a child process runs with and without the environment that
zoi.bench.providers.isa_env gives it, and prints what the library itself reports:

- PyTorch: torch.backends.cpu.get_cpu_capability() and MKL's banner (MKL_VERBOSE=1) of one
  FP32 linear;
- CTranslate2: "Selected ISA" (CT2_VERBOSE=1) and MKL's banner of its INT8 GEMM;
- OpenVINO: the primitive types of the INT8 model's FullyConnected nodes (runtime model);
- ONNX Runtime: nothing to cap (MLAS dispatches by cpuid), listed as native.

Usage: python lab/cpu/peer_isa.py [--cache ~/.cache/zoi/bench]   (run `zoi bench` once first:
the CTranslate2 / OpenVINO conversions come from its cache)
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

from zoi.bench.models import default_cache_dir
from zoi.bench.providers import BY_NAME, isa_env

TORCH = """
import torch
print("aten capability:", torch.backends.cpu.get_cpu_capability())
with torch.inference_mode():
    torch.nn.Linear(384, 384)(torch.randn(8, 384))
"""
CT2 = """
import ctranslate2, numpy as np
e = ctranslate2.Encoder({d!r}, device="cpu", compute_type="int8", intra_threads=1)
sv = ctranslate2.StorageView.from_array
e.forward_batch(sv(np.full((1, 16), 1000, np.int32)), sv(np.array([16], np.int32)))
"""
OV = """
import openvino as ov
import numpy as np
c = ov.Core().compile_model({x!r}, "CPU", {{"INFERENCE_NUM_THREADS": 1, "INFERENCE_PRECISION_HINT": "f32"}})
names = {{n for i in c.inputs for n in i.get_names()}}
ids = np.full((1, 16), 1000, np.int64)
f = {{"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}}
c.create_infer_request().infer({{k: v for k, v in f.items() if k in names}})  # executors pick here
k = set()
for n in c.get_runtime_model().get_ordered_ops():
    rt = n.get_rt_info()
    lt = rt["layerType"].astype(str) if "layerType" in rt else ""
    if lt in ("FullyConnected", "MatMul", "MVN", "Softmax", "Subgraph"):
        k.add(lt + ":" + rt["primitiveType"].astype(str))
print("openvino primitives:", sorted(k))
"""
KEEP = re.compile(r"aten capability|Selected ISA|MKL_VERBOSE oneMKL|primitives:")


def child(code: str, env: dict) -> list[str]:
    e = {**os.environ, **env, "MKL_VERBOSE": "1", "CT2_VERBOSE": "1", "OMP_NUM_THREADS": "1"}
    r = subprocess.run(
        [sys.executable, "-c", code], env=e, capture_output=True, text=True, timeout=600
    )
    lines = [ln.strip() for ln in (r.stdout + r.stderr).splitlines() if KEEP.search(ln)]
    out = []
    for ln in lines:  # MKL's banner: keep the ISA part
        m = re.search(r"Intel\(R\) (Advanced Vector Extensions[^,]*)", ln)
        ln = "MKL: " + m.group(1) if "MKL_VERBOSE" in ln and m else ln
        if ln not in out:
            out.append(ln[:160])
    return out or [f"(no report; rc {r.returncode}: {r.stderr[-300:]})"]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cache", type=Path, default=default_cache_dir())
    a = ap.parse_args()
    m = a.cache / "minilm"
    ct2 = next(iter(sorted(m.glob("ctranslate2-*/int8"))), None)
    ovx = next(iter(sorted(m.glob("openvino-*/int8-*/*.xml"))), None)
    cases = [("torch-fp32", TORCH)]
    if ct2:
        cases.append(("ctranslate2-int8", CT2.format(d=str(ct2))))
    if ovx:
        cases.append(("openvino-int8", OV.format(x=str(ovx))))
    for name, code in cases:
        env, what = isa_env(BY_NAME[name], "avx2")
        print(f"{name}: cap = {what}")
        for label, e in (("native", {}), ("capped", env)):
            for ln in child(code, e):
                print(f"  {label:7s} {ln}")
    env, what = isa_env(BY_NAME["onnxruntime-int8"], "avx2")
    print(f"onnxruntime-int8: {what}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
