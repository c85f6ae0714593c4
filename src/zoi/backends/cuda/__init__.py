"""GPU backend: Triton kernels, one device arena, one CUDA graph per token-count bucket,
per-call path through the CUDA driver API (see backend.py and docs/GPU.md)."""

from __future__ import annotations


def __getattr__(name: str):
    if name == "CudaBackend":
        from zoi.backends.cuda.backend import CudaBackend

        return CudaBackend
    raise AttributeError(name)


__all__ = ["CudaBackend"]
