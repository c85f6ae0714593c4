"""GPU placement for the scale-out paths: one engine per GPU, written for any number of GPUs.

The placement itself (`parse_gpus`, `resolve_gpus`, `visible_gpu_count`, ALL) lives in
zoi.backends.devices, below zoi.serve, which uses it too; it is re-exported here.
"""

from __future__ import annotations

from zoi.backends.devices import ALL, parse_gpus, resolve_gpus, visible_gpu_count

__all__ = ["ALL", "bind_cuda_device", "parse_gpus", "resolve_gpus", "visible_gpu_count"]


def bind_cuda_device(ordinal: int) -> None:
    """Make GPU `ordinal` (of those this process sees) torch's current device.

    Not needed to build an engine there: zoi.load / zoi.compile with device="cuda:N" build
    and bind the engine on GPU N whatever the current device (a Triton instance loads with
    "cuda:<model_instance_device_id>"). Kept for code that wants torch on that GPU too.
    """
    import torch

    torch.cuda.set_device(int(ordinal))
