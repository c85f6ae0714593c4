"""Shared bits of the GPU decoder tests: the device the kernels run on (CPU tensors under the
Triton interpreter, CUDA when compiled) and numpy <-> torch moves."""

from __future__ import annotations

import numpy as np
import pytest
from tests import triton_mode

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

INTERP = triton_mode.interpreted()
if not INTERP and not torch.cuda.is_available():  # pragma: no cover - depends on the machine
    pytest.skip("ZOI_TRITON_COMPILED=1 needs a CUDA GPU", allow_module_level=True)
DEV = "cpu" if INTERP else "cuda"
gpu = pytest.mark.skipif(INTERP, reason="compiled kernels on a GPU (scripts/gpu_check.sh)")


def dev(a, dtype=None):
    t = torch.from_numpy(np.array(a, copy=True, order="C"))  # never aliases the numpy input
    if dtype is not None:
        t = t.to(dtype)
    return t.to(DEV)


def poisoned(shape, dtype):
    """A device tensor full of NaN (floats) or -7 (ints): a kernel that skips an element shows."""
    t = torch.empty(shape, dtype=dtype, device=DEV)
    t.fill_(float("nan") if dtype.is_floating_point else -7)
    return t


def host(t) -> np.ndarray:
    return t.detach().float().cpu().numpy() if t.dtype.is_floating_point else t.cpu().numpy()


def rel(got, want) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert np.isfinite(got).all(), "non-finite values in the output"
    return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-12))
