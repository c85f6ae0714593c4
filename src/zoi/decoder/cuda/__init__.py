"""The decoder on the GPU: Triton kernels (kernels_*.py) and CudaDecoderBackend
(backend.py), an api.DecoderBackend with a static paged KV pool and CUDA-graph decode steps.

Importing this package imports nothing heavy; ``CudaDecoderBackend`` needs torch + triton at
construction (docs/DECODERS_GPU.md).
"""

from __future__ import annotations


def __getattr__(name):
    if name in ("CudaDecoderBackend", "CudaBackend"):  # CudaBackend: the name compile_decoder uses
        from zoi.decoder.cuda.backend import CudaDecoderBackend

        return CudaDecoderBackend
    raise AttributeError(name)
