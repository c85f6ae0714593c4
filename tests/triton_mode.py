"""Which Triton mode the CUDA tests run in: the interpreter on the CPU (TRITON_INTERPRET=1, CI)
unless a real GPU run asked for compiled kernels (ZOI_TRITON_COMPILED=1, scripts/gpu_check.sh).

The variable must be set before triton is imported, so the conftests of the folders that run
Triton kernels call `select()` at collection time and `configure(config)` in pytest_configure.
"""

from __future__ import annotations

import os


def select() -> None:
    if os.environ.get("ZOI_TRITON_COMPILED") != "1":
        os.environ.setdefault("TRITON_INTERPRET", "1")


def interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def configure(config) -> None:
    # the interpreter's own deprecation / divide-by-zero (inside tl.where) noise
    config.addinivalue_line(
        "filterwarnings", "ignore::DeprecationWarning:triton.runtime.interpreter"
    )
    config.addinivalue_line("filterwarnings", "ignore::RuntimeWarning:triton.runtime.interpreter")
