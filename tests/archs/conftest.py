"""tests/archs/test_cuda_archs.py runs Triton kernels: through the interpreter on the CPU unless
ZOI_TRITON_COMPILED=1 (tests/triton_mode.py)."""

from tests import triton_mode

triton_mode.select()


def pytest_configure(config):
    triton_mode.configure(config)
