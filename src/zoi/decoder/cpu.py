"""The CPU DecoderBackend: generation on the encoders' engine (zoi.backends.cpu) behind the paged
bookkeeping of zoi.decoder.paged.

The checkpoint becomes the one runtime's IR (zoi.graph.build_decoder.build_generate: the decoder
stack with its attention over a paged KV cache, the LM head on the last token of each sequence, the
sampler), planned by the same planner and run by the same native engine and kernels as BERT: one
native call per step (prefill chunks and decode tokens packed together) with the GIL released.
precision "fp32" runs the FP32 GEMMs; "int8" is W8A8 as for encoders: weights INT8 per output
channel (zoi.numerics.primitives.quantize_weight), each linear's input quantised per token
(symmetric, dynamic), the INT8 GEMM of every ISA. The KV pool (float32) and every buffer of a step
are reserved when the backend is built.
"""

from __future__ import annotations

import numpy as np

from zoi.decoder.api import DecoderSpec
from zoi.decoder.ir import generate_model
from zoi.decoder.memory import FLAGS, Part
from zoi.decoder.paged import PagedBackend
from zoi.errors import InputError

DEFAULT_MAX_TOKENS = 512
# the engine's limits (kMaxHeadDim, kPagedMaxBlock, max_batch)
MAX_HEAD_DIM, MAX_BLOCK_SIZE, MAX_BATCH = 512, 256, 1024
PRECISIONS = ("fp32", "int8")


class CpuBackend(PagedBackend):
    def __init__(
        self,
        spec: DecoderSpec,
        weights: dict[str, np.ndarray],
        precision: str = "fp32",
        num_blocks: int = 64,
        block_size: int = 16,
        max_batch: int = 8,
        max_seq_len: int | None = None,
        max_tokens: int | None = None,
        threads: int | None = None,
        isa: str | None = None,
        options=None,
    ):
        from zoi.backends.cpu.backend import CpuBackend as EngineBackend
        from zoi.backends.cpu.backend import KvPool

        if precision == "w8a8":  # the earlier name of W8A8
            precision = "int8"
        if precision not in PRECISIONS:
            raise InputError(
                f"precision {precision!r}: the CPU decoder runs 'fp32' or 'int8' (W8A8); "
                "weight-only INT8 ('w8') runs on the GPU"
            )
        # the native core's limits, checked here to name the option (its own message lumps them)
        if spec.head_dim > MAX_HEAD_DIM:
            raise InputError(
                f"the model's head_dim {spec.head_dim} is over the CPU decoder's limit of "
                f"{MAX_HEAD_DIM}"
            )
        for name, v, hi in (
            ("block_size", block_size, MAX_BLOCK_SIZE),
            ("max_batch", max_batch, MAX_BATCH),
        ):
            if isinstance(v, int) and v > hi:
                flag = f" (zoi serve {FLAGS[name]})" if name in FLAGS else ""
                raise InputError(
                    f"{name}={v}{flag} is out of range for the CPU decoder: it must lie in "
                    f"[1, {hi}]"
                )
        max_tokens = max_tokens or DEFAULT_MAX_TOKENS
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise InputError(f"max_tokens must be a positive integer, got {max_tokens!r}")
        self.precision = precision
        self.max_tokens = max_tokens  # sizes the step buffers _host_parts counts
        super().__init__(spec, num_blocks, block_size, max_batch, max_seq_len)
        compiled = generate_model(spec, weights, self.max_seq_len, precision, max_tokens, max_batch)
        pool = KvPool(num_blocks, block_size, self.max_blocks_per_seq, max_batch, self.max_seq_len)
        self.backend = EngineBackend(
            compiled, isa=isa, nthreads=threads, options=options, kv_pool=pool
        )
        self.options = self.backend.options
        self.engine = self.backend.engine
        self._out = np.empty(max_batch, np.int32)

    def _host_parts(self, spec, num_blocks, block_size, max_batch, max_seq_len) -> list[Part]:
        """The pool and tables (PagedBackend) and the engine's buffers: the arena of a step of
        max_tokens rows (at most every buffer of a layer at once), the LM head's logits and the
        sampler's sort buffers of max_batch x vocab rows, the RoPE tables, the weights."""
        T, H, D, I, V = (
            self.max_tokens,
            spec.hidden_size,
            spec.head_dim,
            spec.intermediate_size,
            spec.vocab_size,
        )
        nq = (spec.num_heads + 2 * spec.num_kv_heads) * D
        act = 4 * T * (3 * H + nq + spec.num_heads * D + 3 * I + 2)
        samp = max_batch * (4 * (H + V + 1) + (4 + 8) * V)
        wb = 4 if self.precision == "fp32" else 1
        linears = spec.num_layers * (nq * H + H * spec.num_heads * D + 3 * I * H) + V * H
        weights = wb * linears + 4 * V * H  # the embedding table stays float32
        return super()._host_parts(spec, num_blocks, block_size, max_batch, max_seq_len) + [
            Part(f"step activations (max_tokens={T} tokens)", "max_tokens", act),
            Part(f"sampling buffers (max_batch={max_batch} x vocab {V})", "max_batch", samp),
            Part(f"RoPE tables (max_seq_len={max_seq_len})", "max_seq_len", 8 * max_seq_len * D),
            Part(f"packed weights ({self.precision})", None, weights),
        ]

    @property
    def isa(self) -> str:
        return self.engine.isa

    def _run(self, rows, starts, counts, ids, samp, seeds) -> np.ndarray:
        """One native call when the tokens fit max_tokens, else chunks (a long prompt's prefill is
        cut; only its last chunk samples)."""
        B = len(rows)
        result = np.full(B, -1, np.int32)
        offs = np.concatenate([[0], np.cumsum(counts)])
        cap = self.max_tokens
        todo = [(b, int(starts[b]), 0) for b in range(B)]  # entry, next position, tokens done
        while todo:
            ent, tok, left, nxt = [], [], cap, []
            for b, s, done in todo:
                n = int(counts[b]) - done
                if left <= 0:
                    nxt.append((b, s, done))
                    continue
                k = min(n, left)
                ent.append((b, s, k, k == n))
                tok.append(ids[offs[b] + done : offs[b] + done + k])
                left -= k
                if k < n:
                    nxt.append((b, s + k, done + k))
            self._native(ent, np.concatenate(tok), rows, samp, seeds, result)
            todo = nxt
        return result

    def _native(self, ent, ids, rows, samp, seeds, result) -> None:
        n = len(ent)
        b = np.fromiter((e[0] for e in ent), np.int64, n)
        out = self._out[:n]
        self.engine.run_gen(
            np.ascontiguousarray(ids, np.int32),
            np.ascontiguousarray(rows[b], np.int32),
            np.fromiter((e[1] for e in ent), np.int32, n),
            np.fromiter((e[2] for e in ent), np.int32, n),
            np.fromiter((e[3] for e in ent), np.int32, n),
            np.ascontiguousarray(samp[b, :3]),
            np.ascontiguousarray(seeds[b], np.uint64),
            np.ascontiguousarray(samp[b, 3], np.int64),
            self.block_tables,
            out,
        )
        for j, e in enumerate(ent):
            if e[3]:
                result[e[0]] = out[j]
        self._last = ent  # what last_logits reads (tests): no work here

    def last_logits(self) -> np.ndarray:
        """Logits [n, vocab] of the entries the last native call sampled (tests)."""
        return self.engine.gen_logits()[[j for j, e in enumerate(self._last) if e[3]]]
