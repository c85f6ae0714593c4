"""Backends run a CompiledModel: reference (numpy), cpu (zoi._cpu native core), cuda (Triton + graphs).

Each satisfies the `Backend` protocol (zoi.backends.base); `make_backend` builds one.
"""

from __future__ import annotations

import functools
import logging

from zoi.backends.base import Backend
from zoi.errors import BackendUnavailableError
from zoi.graph.compiled import CompiledModel

log = logging.getLogger("zoi")

DEVICES = ("auto", "cpu", "cuda", "reference")


@functools.lru_cache(maxsize=1)
def cuda_status() -> tuple[bool, str]:
    """(usable, reason): a CUDA driver with a device, and triton importable. Never imports torch."""
    try:
        from cuda.bindings import driver  # type: ignore
    except ImportError:
        return False, "cuda-bindings is not installed (pip install 'zoi[gpu]')"
    try:
        (err,) = driver.cuInit(0)
        if int(err) != 0:
            return False, f"no usable CUDA driver (cuInit: {err})"
        err, n = driver.cuDeviceGetCount()
        if int(err) != 0 or n == 0:
            return False, "no CUDA device found"
    except Exception as e:  # driver library missing
        return False, f"no usable CUDA driver ({e})"
    try:
        import triton  # noqa: F401
    except ImportError:
        return False, "triton is not installed (pip install 'zoi[gpu]')"
    return True, f"{n} CUDA device(s)"


def cpu_info() -> dict | None:
    """What zoi's native CPU core sees on this CPU: its feature flags (bools) and
    "best_isa", the kernels it picks unless CpuOptions.isa (ZOI_CPU_ISA) forces others; None
    when the core is not built."""
    try:
        from zoi import _cpu
    except ImportError:
        return None
    return dict(_cpu.cpu_info())


def split_device(device: str) -> tuple[str, int | None]:
    """'cuda:1' -> ('cuda', 1); 'cuda' / 'cpu' / ... -> (device, None). Only CUDA devices
    take an index (the GPU's ordinal among those this process sees)."""
    if not isinstance(device, str) or ":" not in device:
        return device, None
    kind, _, idx = device.partition(":")
    if kind != "cuda":
        raise ValueError(
            f"device {device!r}: only 'cuda' takes a device index (cuda:0, cuda:1 ...); "
            f"use {kind!r}"
        )
    if not idx.isdigit():
        raise ValueError(f"device {device!r}: the index after 'cuda:' must be an integer >= 0")
    return kind, int(idx)


def check_device_index(index: int | None) -> None:
    """A cuda:N index names a GPU this process sees (clear error otherwise)."""
    if index is None:
        return
    from zoi.backends.devices import visible_gpu_count

    n = visible_gpu_count()
    if index >= n:
        raise BackendUnavailableError(
            f"device='cuda:{index}': this process sees {n} GPU(s) (ids 0..{n - 1}; "
            "CUDA_VISIBLE_DEVICES renumbers them)"
            if n
            else f"device='cuda:{index}': no GPU is visible"
        )


def resolve_device(device: str) -> str:
    if device not in DEVICES:
        raise ValueError(f"device must be one of {', '.join(DEVICES)}, got {device!r}")
    if device == "auto":
        ok, why = cuda_status()
        picked = "cuda" if ok else "cpu"
        log.warning("zoi: device='auto' picked %s (%s)", picked, why if ok else f"no GPU: {why}")
        return picked
    if device == "cuda":
        ok, why = cuda_status()
        if not ok:
            raise BackendUnavailableError(
                f"device='cuda' is not usable here: {why}. Use device='cpu' or 'auto'."
            )
    return device


def make_backend(
    model: CompiledModel,
    device: str,
    device_index: int | None = None,
    threads: int | None = None,
    cuda_options=None,
    cpu_options=None,
) -> Backend:
    """device_index: the GPU of a cuda backend (None: the current device); threads: a cpu
    backend's engine threads (None: the process pool's); cuda_options: the CUDA backend's
    CudaOptions (None: its defaults; zoi.compile / zoi.load pass CudaOptions.from_env());
    cpu_options: the CPU core's CpuOptions (zoi.backends.cpu.options; None: CpuBackend takes
    the environment's as it is created)."""
    if device_index is not None and device != "cuda":
        raise ValueError(f"device_index is for device='cuda', not {device!r}")
    if threads is not None and device != "cpu":
        raise ValueError(f"threads is for device='cpu', not {device!r}")
    if cpu_options is not None and device != "cpu":
        raise ValueError(f"cpu_options is for device='cpu', not {device!r}")
    if device == "reference":
        from zoi.backends.reference import ReferenceBackend

        return ReferenceBackend(model)
    if device == "cpu":
        try:
            from zoi.backends.cpu import CpuBackend
        except ImportError as e:
            raise BackendUnavailableError(
                f"the native CPU core is not built ({e}); reinstall with `pip install -e .` or use device='reference'"
            ) from e
        return CpuBackend(model, nthreads=threads, options=cpu_options)
    if device == "cuda":
        from zoi.backends.arch_support import check_cuda
        from zoi.backends.cuda import CudaBackend
        from zoi.backends.cuda.options import CudaOptions

        check_cuda(model)
        opts = (cuda_options or CudaOptions()).replace(device_index=device_index)
        return CudaBackend(model, options=opts)
    raise ValueError(f"unknown device {device!r}")
