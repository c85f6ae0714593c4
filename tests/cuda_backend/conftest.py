"""Kernel tests run the Triton kernels on the CPU through the interpreter (TRITON_INTERPRET=1).

The variable must be set before triton is imported, so it is set here, at collection time,
unless a real GPU run asked for compiled kernels (ZOI_TRITON_COMPILED=1, scripts/gpu_check.sh).
"""

import os

if os.environ.get("ZOI_TRITON_COMPILED") != "1":
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_configure(config):
    # the interpreter's own deprecation / divide-by-zero (inside tl.where) noise
    config.addinivalue_line(
        "filterwarnings", "ignore::DeprecationWarning:triton.runtime.interpreter"
    )
    config.addinivalue_line("filterwarnings", "ignore::RuntimeWarning:triton.runtime.interpreter")
