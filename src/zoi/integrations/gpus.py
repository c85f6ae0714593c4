"""GPU placement for the scale-out paths: one engine per GPU, written for any number of GPUs.

The placement itself (`parse_gpus`, `resolve_gpus`, `visible_gpu_count`, ALL) lives in
zoi.backends.devices, below zoi.serve, which uses it too; it is re-exported here.
"""

from __future__ import annotations

from zoi.backends.devices import ALL, parse_gpus, resolve_gpus, visible_gpu_count

__all__ = ["ALL", "bind_cuda_device", "parse_gpus", "resolve_gpus", "visible_gpu_count"]


def bind_cuda_device(ordinal: int) -> None:
    """Make GPU `ordinal` (of those this process sees) current before an Engine is built on it.

    The CUDA backend builds on torch.cuda.current_device(); a process that serves one GPU of
    several (a Triton instance) sets it here.
    """
    import torch

    torch.cuda.set_device(int(ordinal))
