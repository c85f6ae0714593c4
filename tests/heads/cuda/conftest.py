"""The heads on device="cuda": the Triton kernels through the interpreter on the CPU unless
ZOI_TRITON_COMPILED=1 (tests/triton_mode.py; scripts/gpu_check.sh test runs this folder)."""

from tests import triton_mode

triton_mode.select()


def pytest_configure(config):
    triton_mode.configure(config)
