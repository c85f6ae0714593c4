"""One kernel-compiling worker of a cold GPU build (prebuild.py): read the model the build
wrote, build a backend of the buckets named, exit. What it compiled stays in Triton's cache.

    python -m zoi.backends.cuda.prebuild_worker FOLDER BUCKETS DEVICE_INDEX
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from zoi.backends.cuda.backend import CudaBackend
from zoi.backends.cuda.options import CudaOptions
from zoi.backends.cuda.prebuild import _read_model


def main(folder: str, buckets: str, device_index: str) -> int:
    folder = Path(folder)
    model = _read_model(folder)
    opts = CudaOptions(**json.loads((folder / "options.json").read_text()))
    opts = opts.replace(device_index=int(device_index))
    CudaBackend(model, buckets=[int(b) for b in buckets.split(",")], options=opts)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
