"""RoPE of the decoders, as transformers' ROPE_INIT_FUNCTIONS compute it (float32): the inverse
frequencies of every scaling type the loader accepts and the one cos / sin table every backend
reads (the IR's `rope.g.cos` / `rope.g.sin`: the CPU engine, the GPU kernels, the numpy reference).
"""

from __future__ import annotations

import math

import numpy as np

from zoi.decoder.api import DecoderSpec


def rope_inv_freq(spec: DecoderSpec) -> np.ndarray:
    """inv_freq [head_dim / 2] float32, as transformers computes it (float32 torch arithmetic).
    'dynamic' equals the default below max_position_embeddings, where zoi caps the context."""
    dim = spec.head_dim
    base = np.float32(spec.rope_theta)
    inv = np.float32(1.0) / (
        base ** (np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / np.float32(dim))
    )
    inv = inv.astype(np.float32)
    sc = spec.rope_scaling or {}
    t = sc.get("rope_type", "default")
    if t == "linear":
        inv = (inv / np.float32(sc["factor"])).astype(np.float32)
    elif t == "llama3":
        factor, lo, hi = sc["factor"], sc["low_freq_factor"], sc["high_freq_factor"]
        old = sc["original_max_position_embeddings"]
        low_wl, high_wl = old / lo, old / hi
        wavelen = (np.float32(2 * math.pi) / inv).astype(np.float32)
        llama = np.where(wavelen > low_wl, inv / np.float32(factor), inv).astype(np.float32)
        smooth = ((np.float32(old) / wavelen - np.float32(lo)) / np.float32(hi - lo)).astype(
            np.float32
        )
        smoothed = ((1 - smooth) * llama / np.float32(factor) + smooth * llama).astype(np.float32)
        medium = ~(wavelen < high_wl) & ~(wavelen > low_wl)
        inv = np.where(medium, smoothed, llama).astype(np.float32)
    elif t not in ("default", "dynamic"):
        raise ValueError(f"rope_type {t!r} is not supported")
    return inv


def rope_cos_sin(inv_freq: np.ndarray, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin [T, head_dim / 2] float32 of the angles float32(pos * inv_freq), as transformers."""
    f = (positions.astype(np.float32)[:, None] * inv_freq[None, :]).astype(np.float32)
    return np.cos(f).astype(np.float32), np.sin(f).astype(np.float32)


def rope_tables(spec: DecoderSpec, n: int) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin [n, head_dim / 2] float32 of positions 0..n-1: the one RoPE table every backend
    reads (the CPU engine's and the GPU kernels' `rope.g.cos` / `rope.g.sin`)."""
    return rope_cos_sin(rope_inv_freq(spec), np.arange(n))
