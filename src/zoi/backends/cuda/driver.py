"""The CUDA driver API (cuda.bindings) as the per-call path uses it: no framework involved.

Every call's return code is checked. Handles are kept as the binding's objects so that a call
converts nothing (a conversion costs microseconds in Python).
"""

from __future__ import annotations

import ctypes

import numpy as np

from zoi.errors import BackendUnavailableError

try:
    from cuda.bindings import driver as cu
except ImportError as e:  # pragma: no cover - depends on the machine
    cu = None
    _IMPORT_ERROR = e
else:
    _IMPORT_ERROR = None

_OK = None if cu is None else cu.CUresult.CUDA_SUCCESS


class CudaError(RuntimeError):
    pass


def check(res):
    """cuda.bindings returns (err, *values): raise on err, return the value(s)."""
    err = res[0]
    if err != _OK:
        _, name = cu.cuGetErrorName(err)
        _, msg = cu.cuGetErrorString(err)
        raise CudaError(
            f"CUDA driver error {int(err)} {name.decode() if isinstance(name, bytes) else name}: "
            f"{msg.decode() if isinstance(msg, bytes) else msg}"
        )
    if len(res) == 1:
        return None
    return res[1] if len(res) == 2 else res[1:]


def require():
    if cu is None:
        raise BackendUnavailableError(
            f"device='cuda' needs cuda-bindings (pip install 'zoi[gpu]'): {_IMPORT_ERROR}"
        )


def primary_context(ordinal: int = 0):
    """The device's primary context, the one the CUDA runtime (torch, triton) uses."""
    check(cu.cuInit(0))
    dev = check(cu.cuDeviceGet(ordinal))
    ctx = check(cu.cuDevicePrimaryCtxRetain(dev))
    check(cu.cuCtxSetCurrent(ctx))
    return dev, ctx


def device_name(dev) -> str:
    raw = check(cu.cuDeviceGetName(256, dev))
    return raw.split(b"\0", 1)[0].decode()


def sm_count(dev) -> int:
    return int(
        check(
            cu.cuDeviceGetAttribute(
                cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev
            )
        )
    )


def capability(dev) -> tuple[int, int]:
    ma = check(
        cu.cuDeviceGetAttribute(
            cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev
        )
    )
    mi = check(
        cu.cuDeviceGetAttribute(
            cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev
        )
    )
    return int(ma), int(mi)


def mem_info() -> tuple[int, int]:
    free, total = check(cu.cuMemGetInfo())
    return int(free), int(total)


class Pinned:
    """Page-locked host memory (cuMemHostAlloc) with a numpy view of its bytes."""

    def __init__(self, nbytes: int):
        self.nbytes = int(nbytes)
        self.ptr = int(check(cu.cuMemHostAlloc(self.nbytes, 0)))
        self.bytes = np.ctypeslib.as_array((ctypes.c_uint8 * self.nbytes).from_address(self.ptr))

    def view(self, dtype, offset: int, count: int) -> np.ndarray:
        return self.bytes[offset : offset + count * np.dtype(dtype).itemsize].view(dtype)

    def free(self) -> None:
        if self.ptr:
            check(cu.cuMemFreeHost(self.ptr))
            self.ptr = 0


def new_stream():
    return check(cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING.value))


def begin_capture(stream) -> None:
    check(
        cu.cuStreamBeginCapture(stream, cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
    )


def end_capture(stream):
    """-> (CUgraph, CUgraphExec, number of nodes)"""
    graph = check(cu.cuStreamEndCapture(stream))
    _, n = check(cu.cuGraphGetNodes(graph, 0))
    gexec = check(cu.cuGraphInstantiate(graph, 0))
    return graph, gexec, int(n)


def new_event():
    """An event for ordering only (no timing: cheaper to record and to wait on)."""
    return check(cu.cuEventCreate(cu.CUevent_flags.CU_EVENT_DISABLE_TIMING.value))
