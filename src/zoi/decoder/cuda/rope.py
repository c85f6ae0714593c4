"""RoPE tables for the GPU decoder: inv_freq exactly as transformers' ROPE_INIT_FUNCTIONS compute
it (fp32), and the cos / sin table the kernels read ([max_seq_len, head_dim // 2] fp32 each).

Supported ``rope_scaling`` types: None / default, linear, llama3, yarn, and dynamic up to
max_position_embeddings (dynamic NTK rescales with the batch's length beyond it, which a
per-sequence paged cache cannot follow: refused there with a clear error).
"""

from __future__ import annotations

import math

import numpy as np

from zoi.errors import InputError


def _default(theta: float, dim: int) -> np.ndarray:
    return (
        1.0 / (np.float32(theta) ** (np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim)))
    ).astype(np.float32)


def inv_freq(spec, max_seq_len: int | None = None) -> tuple[np.ndarray, float]:
    """(inv_freq [head_dim // 2] fp32, attention_factor) of the spec's rope."""
    rs = dict(spec.rope_scaling or {})
    kind = rs.get("rope_type", rs.get("type", "default")) or "default"
    theta = float(rs.get("rope_theta", spec.rope_theta))
    dim = int(spec.head_dim * float(rs.get("partial_rotary_factor", 1.0)))
    if dim != spec.head_dim:
        raise InputError(
            f"rope: partial_rotary_factor {rs['partial_rotary_factor']} is not supported"
        )
    inv = _default(theta, dim)
    if kind == "default":
        return inv, 1.0
    if kind == "linear":
        return (inv / np.float32(rs["factor"])).astype(np.float32), 1.0
    if kind == "dynamic":
        if max_seq_len is not None and max_seq_len > spec.max_position_embeddings:
            raise InputError(
                f"rope_scaling 'dynamic' changes with the sequence length beyond "
                f"max_position_embeddings ({spec.max_position_embeddings}); compile with "
                f"max_seq_len <= {spec.max_position_embeddings}"
            )
        return inv, 1.0
    if kind == "llama3":
        factor = np.float32(rs["factor"])
        lo_f, hi_f = float(rs["low_freq_factor"]), float(rs["high_freq_factor"])
        old = float(rs["original_max_position_embeddings"])
        lo_wl, hi_wl = old / lo_f, old / hi_f
        wavelen = (np.float32(2 * math.pi) / inv).astype(np.float32)
        il = np.where(wavelen > lo_wl, inv / factor, inv).astype(np.float32)
        smooth = ((np.float32(old) / wavelen - np.float32(lo_f)) / np.float32(hi_f - lo_f)).astype(
            np.float32
        )
        smoothed = ((1 - smooth) * il / factor + smooth * il).astype(np.float32)
        medium = ~(wavelen < hi_wl) & ~(wavelen > lo_wl)
        return np.where(medium, smoothed, il).astype(np.float32), 1.0
    if kind == "yarn":
        factor = rs.get("factor")
        orig = rs["original_max_position_embeddings"]
        if factor is None:
            factor = spec.max_position_embeddings / orig
        factor = float(factor)

        def mscale(s, m=1.0):
            return 1.0 if s <= 1 else 0.1 * m * math.log(s) + 1.0

        att = rs.get("attention_factor")
        if att is None:
            m, mad = rs.get("mscale"), rs.get("mscale_all_dim")
            att = float(mscale(factor, m) / mscale(factor, mad)) if m and mad else mscale(factor)
        fast, slow = rs.get("beta_fast") or 32, rs.get("beta_slow") or 1

        def corr(rot):
            return (dim * math.log(orig / (rot * 2 * math.pi))) / (2 * math.log(theta))

        lo, hi = corr(fast), corr(slow)
        if rs.get("truncate", True):
            lo, hi = math.floor(lo), math.ceil(hi)
        lo, hi = max(lo, 0), min(hi, dim - 1)
        if lo == hi:
            hi += 0.001
        ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - lo) / (hi - lo), 0, 1).astype(
            np.float32
        )
        pos = (
            np.float32(theta) ** (np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim))
        ).astype(np.float32)
        extra = 1 - ramp
        out = (1.0 / (np.float32(factor) * pos)) * (1 - extra) + (1.0 / pos) * extra
        return out.astype(np.float32), float(att)
    raise InputError(
        f"rope_scaling type {kind!r} is not supported on the GPU decoder "
        "(default, linear, llama3, yarn, dynamic)"
    )


def cos_sin(spec, max_seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin [max_seq_len, head_dim // 2] fp32: transformers' fp32 angle pos * inv_freq (the
    table's halves are equal, cat(freqs, freqs)), times the attention factor."""
    inv, att = inv_freq(spec, max_seq_len)
    ang = np.arange(max_seq_len, dtype=np.float32)[:, None] * inv[None, :]  # fp32 product
    a = ang.astype(np.float64)
    return (np.cos(a) * att).astype(np.float32), (np.sin(a) * att).astype(np.float32)
