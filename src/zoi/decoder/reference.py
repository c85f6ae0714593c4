"""The numpy oracle of the decoders: RoPE as transformers' ROPE_INIT_FUNCTIONS, the forward pass
over a paged KV cache, the sampler (greedy / temperature / top-k / top-p, counter-based seeded
draws) and a DecoderBackend built on them. float32 (as transformers FP32) or float64.

Imports numpy only (no torch, no zoi._cpu): the CPU kernels, the GPU kernels and the scheduler's
tests check against it.
"""

from __future__ import annotations

import math

import numpy as np

from zoi.decoder.api import DecoderSpec
from zoi.decoder.paged import PagedBackend

M64 = (1 << 64) - 1


# ---------------------------------------------------------------- RoPE
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


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """x [T, heads, D] rotated as transformers' rotate_half (first half with the second)."""
    h = x.shape[-1] // 2
    c, s = cos[:, None, :].astype(x.dtype), sin[:, None, :].astype(x.dtype)
    x1, x2 = x[..., :h], x[..., h:]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    var = np.mean(x * x, axis=-1, keepdims=True)
    return (x / np.sqrt(var + x.dtype.type(eps))) * w.astype(x.dtype)


def silu(x: np.ndarray) -> np.ndarray:
    return x / (x.dtype.type(1) + np.exp(-x))


# ---------------------------------------------------------------- sampling
def _mix(z: int) -> int:
    z = (z + 0x9E3779B97F4A7C15) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def uniform(seed: int, index: int) -> float:
    """The draw in [0, 1) for token `index` of a sequence seeded `seed` (splitmix64, 53 bits):
    counter-based, so a sequence's tokens do not depend on what runs beside it."""
    return (_mix(_mix(seed & M64) ^ (index & M64)) >> 11) * (1.0 / (1 << 53))


def sample(
    logits: np.ndarray, temperature: float, top_k: int, top_p: float, seed: int, index: int
) -> int:
    """One token from a row of logits. temperature <= 0 or top_k == 1: argmax, lowest id on ties.
    Else: z = logits / T; keep the top_k by (z desc, id asc); p = exp(z - max); keep the smallest
    prefix of that order whose mass reaches top_p of the total; draw u * kept mass on the prefix's
    running sum (float64 throughout)."""
    row = np.asarray(logits)
    if temperature <= 0 or top_k == 1:
        return int(np.argmax(row))  # first maximum: the lowest id
    z = row.astype(np.float64) / float(temperature)
    order = np.lexsort((np.arange(z.size), -z))  # z desc, id asc
    if 0 < top_k < z.size:
        order = order[:top_k]
    p = np.exp(z[order] - z[order[0]])
    cum = np.cumsum(p)
    n = len(order)
    if top_p < 1.0:
        n = int(np.searchsorted(cum, top_p * cum[-1], side="left")) + 1
        n = min(max(n, 1), len(order))
    u = uniform(seed, index) * cum[n - 1]
    j = int(np.searchsorted(cum[:n], u, side="right"))
    return int(order[min(j, n - 1)])


# ---------------------------------------------------------------- the model
class PagedKV:
    """K and V of every layer: [layers, num_blocks, kv_heads, block_size, head_dim]."""

    def __init__(self, spec: DecoderSpec, num_blocks: int, block_size: int, dtype=np.float32):
        shape = (spec.num_layers, num_blocks, spec.num_kv_heads, block_size, spec.head_dim)
        self.block_size = block_size
        self.k = np.zeros(shape, dtype)
        self.v = np.zeros(shape, dtype)

    def write(
        self, layer: int, table: np.ndarray, pos: np.ndarray, k: np.ndarray, v: np.ndarray
    ) -> None:
        b, o = table[pos // self.block_size], pos % self.block_size
        self.k[layer, b, :, o] = k
        self.v[layer, b, :, o] = v

    def read(self, layer: int, table: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
        """K, V [n, kv_heads, D] of positions 0..n-1."""
        pos = np.arange(n)
        b, o = table[pos // self.block_size], pos % self.block_size
        return self.k[layer, b, :, o], self.v[layer, b, :, o]


class ReferenceModel:
    """w8a8=True: every projection and lm_head as the CPU decoder's precision "int8" (W8A8)
    computes it: weights INT8 per output channel, each input row INT8 per token (symmetric), exact
    integer sums scaled in float32 (zoi.numerics.primitives)."""

    def __init__(
        self,
        spec: DecoderSpec,
        weights: dict[str, np.ndarray],
        dtype=np.float32,
        w8a8: bool = False,
    ):
        self.spec, self.dtype = spec, np.dtype(dtype)
        self.w = {k: np.asarray(v, self.dtype) for k, v in weights.items()}
        self.inv_freq = rope_inv_freq(spec)
        self.q8: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        if w8a8:
            from zoi.numerics.primitives import quantize_weight

            self.q8 = {
                k: quantize_weight(v)
                for k, v in weights.items()
                if k.endswith("_proj.weight") or k == "lm_head.weight"
            }

    def _lin(self, name: str, x: np.ndarray) -> np.ndarray:
        if name in self.q8:
            from zoi.numerics.primitives import int8_matmul_exact, quantize_act

            wq, ws = self.q8[name]
            q, s = quantize_act(x.astype(np.float32))
            acc = int8_matmul_exact(q, wq).astype(np.float32)
            return (acc * (s[:, None] * ws[None, :])).astype(self.dtype)
        return x @ self.w[name].T

    def forward(
        self,
        kv: PagedKV,
        tables: list[np.ndarray],
        starts,
        counts,
        ids: np.ndarray,
        all_logits: bool = False,
    ) -> np.ndarray:
        """Packed tokens of B sequences (sequence i: counts[i] tokens at positions starts[i]..);
        writes their K/V into `kv` through the block tables, attends causally over the cache.
        Returns the logits of each sequence's last token [B, V] (all tokens' [T, V] if asked)."""
        sp, w, dt = self.spec, self.w, self.dtype
        D, nh, nkv = sp.head_dim, sp.num_heads, sp.num_kv_heads
        starts, counts = np.asarray(starts, np.int64), np.asarray(counts, np.int64)
        pos = np.concatenate([np.arange(s, s + c) for s, c in zip(starts, counts, strict=True)])
        seq_of = np.repeat(np.arange(len(counts)), counts)
        cos, sin = rope_cos_sin(self.inv_freq, pos)
        x = w["model.embed_tokens.weight"][ids]
        scale = dt.type(1.0 / math.sqrt(D))
        group = nh // nkv
        for li in range(sp.num_layers):
            p = f"model.layers.{li}."
            h = rms_norm(x, w[p + "input_layernorm.weight"], sp.rms_norm_eps)
            q = self._lin(p + "self_attn.q_proj.weight", h)
            k = self._lin(p + "self_attn.k_proj.weight", h)
            v = self._lin(p + "self_attn.v_proj.weight", h)
            if sp.attention_bias:
                q = q + w[p + "self_attn.q_proj.bias"]
                k = k + w[p + "self_attn.k_proj.bias"]
                v = v + w[p + "self_attn.v_proj.bias"]
            q, k, v = q.reshape(-1, nh, D), k.reshape(-1, nkv, D), v.reshape(-1, nkv, D)
            if sp.qk_norm:
                q = rms_norm(q, w[p + "self_attn.q_norm.weight"], sp.rms_norm_eps)
                k = rms_norm(k, w[p + "self_attn.k_norm.weight"], sp.rms_norm_eps)
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
            for i, t in enumerate(tables):
                sel = seq_of == i
                kv.write(li, t, pos[sel], k[sel], v[sel])
            ctx = np.empty((len(ids), nh, D), dt)
            for i, t in enumerate(tables):
                n_ctx = int(starts[i] + counts[i])
                K, V = kv.read(li, t, n_ctx)  # [n, kv, D]
                rows = np.nonzero(seq_of == i)[0]
                for r in rows:
                    L = int(pos[r]) + 1
                    Kh = np.repeat(K[:L], group, axis=1)  # [L, nh, D]
                    Vh = np.repeat(V[:L], group, axis=1)
                    s = np.einsum("hd,lhd->hl", q[r], Kh) * scale
                    s = np.exp(s - s.max(axis=1, keepdims=True))
                    s = s / s.sum(axis=1, keepdims=True)
                    ctx[r] = np.einsum("hl,lhd->hd", s, Vh)
            o = self._lin(p + "self_attn.o_proj.weight", ctx.reshape(len(ids), nh * D))
            if p + "self_attn.o_proj.bias" in w:
                o = o + w[p + "self_attn.o_proj.bias"]
            x = x + o
            h = rms_norm(x, w[p + "post_attention_layernorm.weight"], sp.rms_norm_eps)
            g = self._lin(p + "mlp.gate_proj.weight", h)
            u = self._lin(p + "mlp.up_proj.weight", h)
            x = x + self._lin(p + "mlp.down_proj.weight", silu(g) * u)
        if not all_logits:
            x = x[np.cumsum(counts) - 1]
        x = rms_norm(x, w["model.norm.weight"], sp.rms_norm_eps)
        return self._lin("lm_head.weight", x)


class ReferenceBackend(PagedBackend):
    """DecoderBackend in numpy (slow; the oracle and a backend for tests without the native core)."""

    def __init__(
        self,
        spec: DecoderSpec,
        weights: dict[str, np.ndarray],
        num_blocks: int = 64,
        block_size: int = 16,
        max_batch: int = 8,
        max_seq_len: int | None = None,
        dtype=np.float32,
        w8a8: bool = False,
    ):
        self.kv_bytes_per_value = np.dtype(dtype).itemsize  # the pool's dtype, for its bytes
        super().__init__(spec, num_blocks, block_size, max_batch, max_seq_len)
        self.model = ReferenceModel(spec, weights, dtype, w8a8=w8a8)
        self.kv = PagedKV(spec, num_blocks, block_size, dtype)
        self.last_logits: np.ndarray | None = None

    def _run(self, rows, starts, counts, ids, samp, seeds) -> np.ndarray:
        tables = [self.block_tables[r] for r in rows]
        logits = self.model.forward(self.kv, tables, starts, counts, ids)
        self.last_logits = logits
        out = np.empty(len(rows), np.int32)
        for i in range(len(rows)):
            t, k, p, n = samp[i]
            out[i] = sample(logits[i], float(t), int(k), float(p), int(seeds[i]), int(n))
        return out
