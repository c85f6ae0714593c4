"""Build time of a GPU engine alone (no INT8 calibration), per bucket, cold Triton cache.

    python lab/gpu/build_parts.py int8 ART   # zoi.load(ART, device="cuda"): an INT8 artifact
    python lab/gpu/build_parts.py fp16       # zoi.compile(random-init minilm, precision="fp16")

Prints one line per bucket as it is built (seconds since the start), then a JSON summary.
"""

import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
T0 = time.perf_counter()

from zoi.backends.cuda.backend import CudaBackend  # noqa: E402

_orig = CudaBackend._build_bucket


def _timed(self, tb):
    t = time.perf_counter()
    _orig(self, tb)
    now = time.perf_counter()
    print(f"bucket {tb}: {now - t:.1f} s (at {now - T0:.1f} s)", flush=True)


CudaBackend._build_bucket = _timed


def main():
    import zoi

    prec = sys.argv[1]
    if prec == "int8":
        t = time.perf_counter()
        e = zoi.load(sys.argv[2], device="cuda")
    else:
        import bench

        d = tempfile.mkdtemp()
        bench.build_hf("minilm", d)
        t = time.perf_counter()
        e = zoi.compile(d, device="cuda", precision=prec)
    s = time.perf_counter() - t
    paths = {k: v.get("path") for k, v in e.backend.memory()["bucket_paths"].items()}
    print(json.dumps(dict(precision=prec, build_s=s, buckets=list(e.backend.buckets), paths=paths)))


if __name__ == "__main__":
    main()
