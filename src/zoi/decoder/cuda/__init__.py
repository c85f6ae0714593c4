"""The decoder on the GPU: CudaDecoderBackend (backend.py), an api.DecoderBackend over the GPU's
generation runtime (zoi.backends.cuda.generate: the decode kernels of zoi.backends.cuda.kernels, a
static paged KV pool, CUDA-graph decode steps) and the synthetic shapes of its benchmarks
(synth.py).

Importing this package imports nothing heavy; ``CudaDecoderBackend`` needs torch + triton at
construction (docs/DECODERS_GPU.md).
"""

from __future__ import annotations


def __getattr__(name):
    if name in ("CudaDecoderBackend", "CudaBackend"):  # CudaBackend: the name compile_decoder uses
        from zoi.decoder.cuda.backend import CudaDecoderBackend

        return CudaDecoderBackend
    raise AttributeError(name)
