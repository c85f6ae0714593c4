"""The GPU decoder tests run the Triton kernels through the interpreter on the CPU unless
ZOI_TRITON_COMPILED=1 (tests/triton_mode.py; scripts/gpu_check.sh sets it on the H200)."""

import zlib

import numpy as np
import pytest
from tests import triton_mode

triton_mode.select()


def pytest_configure(config):
    triton_mode.configure(config)


@pytest.fixture
def rng(request):
    return np.random.default_rng(zlib.crc32(request.node.name.encode()))
