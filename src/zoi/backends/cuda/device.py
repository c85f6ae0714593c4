"""Which GPU a CudaBackend is built on and bound to (CudaOptions.device_index; zoi.compile /
zoi.load with device="cuda:N", one engine per GPU for `zoi serve --gpus`).

While a backend is built, its GPU is the current device for torch and triton (kernels compile
and load there, buffers land there, graphs are captured there); the caller's device comes
back after. Per call nothing depends on the calling thread's current device: the driver-API
path makes the backend's own primary context current (callpath.py)."""

from __future__ import annotations

import contextlib

from zoi.backends.cuda.options import triton_interpreting
from zoi.errors import BackendUnavailableError


def on_device(options):
    """Context manager: GPU `options.device_index` current while a backend is built (a no-op
    without an index, in the interpreter, or where the index is bad: device_index() says)."""
    index = options.device_index if options is not None else None
    if index is None or triton_interpreting():
        return contextlib.nullcontext()
    try:
        import torch
    except ImportError:  # the backend says what is missing
        return contextlib.nullcontext()
    if not torch.cuda.is_available() or index >= torch.cuda.device_count():
        return contextlib.nullcontext()
    return torch.cuda.device(index)


def device_index(torch, index: int | None) -> int:
    """The GPU to build on: `index`, checked against the GPUs torch sees; None: the current."""
    if index is None:
        return int(torch.cuda.current_device())
    n = torch.cuda.device_count()
    if index >= n:
        raise BackendUnavailableError(
            f"device='cuda:{index}': torch sees {n} GPU(s) (ids 0..{n - 1}; "
            "CUDA_VISIBLE_DEVICES renumbers them)"
        )
    return int(index)
