"""Per-op tests: each kernel of every backend (reference, cpu per ISA, cuda under the Triton
interpreter or compiled on a GPU: tests/triton_mode.py) against zoi.numerics."""

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
