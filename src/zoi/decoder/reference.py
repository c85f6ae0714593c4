"""The numpy oracle of the decoders: the one runtime's generation graph (zoi.decoder.ir,
build_generate) run by the IR's numpy executor (zoi.numerics.reference.execute) over a paged KV
cache, the sampler (greedy / temperature / top-k / top-p, counter-based seeded draws) and a
DecoderBackend built on them. float32 (as transformers FP32) or float64; W8A8 emulated exactly.

Imports numpy only (no torch, no zoi._cpu): the CPU kernels, the GPU kernels and the scheduler's
tests check against it, and it against transformers (tests/decoder/test_reference.py).
"""

from __future__ import annotations

import numpy as np

from zoi.decoder.api import DecoderSpec
from zoi.decoder.paged import PagedBackend

M64 = (1 << 64) - 1


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
        self.tables: list[np.ndarray] = []  # the block table of each sequence of a call
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
    """The generation graph of a checkpoint run in numpy (zoi.numerics.reference.execute).
    w8a8=True: every linear, the LM head included, as precision "int8" (W8A8) computes it:
    weights INT8 per output channel, each input row INT8 per token (symmetric), exact integer
    sums scaled in float32 (zoi.numerics.primitives). Positions up to max_seq_len (default: the
    model's max_position_embeddings)."""

    def __init__(
        self,
        spec: DecoderSpec,
        weights: dict[str, np.ndarray],
        dtype=np.float32,
        w8a8: bool = False,
        max_seq_len: int | None = None,
    ):
        from zoi.decoder.ir import generate_model

        self.spec, self.dtype = spec, np.dtype(dtype)
        n = int(max_seq_len or spec.max_position_embeddings)
        prec = "int8" if w8a8 else "fp32"
        self.model = generate_model(spec, weights, n, prec, max_tokens=n, max_batch=1)

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
        from zoi.numerics.reference import execute, linear_apply

        m = self.model
        starts, counts = np.asarray(starts, np.int64), np.asarray(counts, np.int64)
        pos = np.concatenate([np.arange(s, s + c) for s, c in zip(starts, counts, strict=True)])
        cu = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        kv.tables = list(tables)
        env = execute(
            m.graph, m.weights, np.asarray(ids), pos, cu, m.quant, dtype=self.dtype, paged=kv
        )
        if not all_logits:
            return env["logits"]
        x = env[next(o for o in m.graph.ops if o.kind == "pool").inputs[0]]  # after the final norm
        y = linear_apply(x, m.weights, "lm_head", m.quant.get("lm_head"))
        return y.astype(self.dtype)


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
        self.model = ReferenceModel(spec, weights, dtype, w8a8=w8a8, max_seq_len=self.max_seq_len)
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
