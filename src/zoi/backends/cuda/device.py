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


def init_device(obj, interpret: bool | None, index: int | None, what: str = "device='cuda'"):
    """The device half of a backend's construction, shared by the encoders' CudaBackend and
    the generation runtime: sets on obj ``torch``, ``eager`` (the Triton interpreter on torch
    CPU tensors: interpret=True, or TRITON_INTERPRET=1 without a GPU), ``dev``, ``sm``,
    ``device_name``, ``capability``, ``device_index`` and, on a GPU, ``drv`` / ``cu`` (the
    driver API), ``cu_dev``, ``ctx`` (the GPU's primary context), ``stream`` (our own) and
    ``tstream`` (torch's view of it, for Triton's launches)."""
    try:
        import torch
        import triton  # noqa: F401
    except ImportError as e:
        raise BackendUnavailableError(f"{what} needs torch and triton at compile time: {e}") from e
    obj.torch = torch
    env_interp = triton_interpreting()  # how triton was imported (options.py)
    obj.eager = (
        bool(interpret) if interpret is not None else (env_interp and not torch.cuda.is_available())
    )
    if obj.eager:
        if not env_interp:
            raise BackendUnavailableError(
                "interpret=True needs TRITON_INTERPRET=1 set before triton is imported"
            )
        obj.dev, obj.sm, obj.device_name = "cpu", 8, "triton interpreter (CPU)"
        obj.capability = (0, 0)
        obj.device_index = index  # recorded; the interpreter has no GPUs
        return
    if env_interp:
        raise BackendUnavailableError("TRITON_INTERPRET=1 is set: unset it to run on the GPU")
    from zoi.backends.cuda import driver as drv

    drv.require()
    if not torch.cuda.is_available():
        raise BackendUnavailableError(
            f"{what}: torch sees no CUDA device (driver missing or no GPU)"
        )
    obj.drv, obj.cu = drv, drv.cu
    torch.cuda.init()
    obj.device_index = device_index(torch, index)
    obj.dev = f"cuda:{obj.device_index}"  # every buffer explicitly on this GPU
    torch.empty(1, device=obj.dev)  # the runtime's primary context exists from here
    obj.cu_dev, obj.ctx = drv.primary_context(obj.device_index)
    cap = drv.capability(obj.cu_dev)
    if cap < (8, 0):
        raise BackendUnavailableError(f"{what} needs compute capability >= 8.0, found {cap}")
    obj.capability = cap
    obj.sm = drv.sm_count(obj.cu_dev)
    obj.device_name = drv.device_name(obj.cu_dev)
    obj.stream = drv.new_stream()
    obj.tstream = torch.cuda.ExternalStream(int(obj.stream), device=obj.dev)
