"""The bookkeeping every paged DecoderBackend shares: a static pool of `num_blocks` KV blocks of
`block_size` tokens, a block table per sequence (rows of one pre-allocated int32 array), admission
(KVPoolFull / InputError per api.py), finishing (eos, stop ids, max_new_tokens, context) and
cancellation. A subclass supplies `_run(rows, starts, counts, ids, samp) -> next token ids`.

A sequence holds every block it can ever need from admission on (prompt + max_new_tokens - 1
cached tokens): a running sequence never waits for blocks and nothing is preempted.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from zoi.decoder.api import (
    DecoderSpec,
    FinishReason,
    KVPoolFull,
    PoolInfo,
    SamplingParams,
    StepEvent,
)
from zoi.decoder.memory import PY_INT_BYTES, Part, check_host_memory
from zoi.errors import InputError


def kv_block_bytes(spec: DecoderSpec, block_size: int, value_bytes: int = 4) -> int:
    """Bytes of one KV block: K and V of every layer and KV head for block_size tokens."""
    return 2 * spec.num_layers * spec.num_kv_heads * block_size * spec.head_dim * value_bytes


class FreeBlocks:
    """The free block ids: a stack of the released ones over the range never handed out yet, so
    a pool's bookkeeping costs nothing per block (a list of every id would take 36 bytes a block:
    tens of GB for a pool sized far past the device's memory, built before the device check can
    refuse it). pop() hands out the last released block, else the lowest never used: 0, 1, 2, ...
    from a fresh pool."""

    def __init__(self, n: int):
        self.n, self.fresh, self.stack = n, 0, []

    def __len__(self) -> int:
        return len(self.stack) + self.n - self.fresh

    def pop(self) -> int:
        if self.stack:
            return self.stack.pop()
        if self.fresh >= self.n:
            raise IndexError("pop from an empty pool")
        self.fresh += 1
        return self.fresh - 1

    def extend(self, blocks) -> None:
        self.stack.extend(blocks)


@dataclass
class _Seq:
    seq_id: int
    row: int  # row of the block table
    blocks: list[int]
    params: SamplingParams
    seed: int
    cached: int = 0  # tokens whose K/V are in the pool
    pending: np.ndarray | None = (
        None  # tokens to feed at the next step (prompt, then the last token)
    )
    generated: int = 0
    stop_ids: frozenset = frozenset()


class PagedBackend:
    """Base of the reference and CPU backends (see the module docstring)."""

    def __init__(
        self,
        spec: DecoderSpec,
        num_blocks: int,
        block_size: int,
        max_batch: int,
        max_seq_len: int | None = None,
    ):
        """max_seq_len None: the model's max_position_embeddings, at most the pool's tokens."""
        max_seq_len = max_seq_len or min(spec.max_position_embeddings, num_blocks * block_size)
        for name, v in (
            ("num_blocks", num_blocks),
            ("block_size", block_size),
            ("max_batch", max_batch),
            ("max_seq_len", max_seq_len),
        ):
            if not isinstance(v, int) or v < 1:
                raise InputError(f"{name} must be a positive integer, got {v!r}")
        limit = spec.max_position_embeddings
        if max_seq_len > limit:
            raise InputError(
                f"max_seq_len {max_seq_len} is over the model's max_position_embeddings ({limit})"
            )
        # before anything the options size is allocated
        check_host_memory(
            self._host_parts(spec, num_blocks, block_size, max_batch, max_seq_len),
            "the decoder's KV pool and buffers",
        )
        self.spec = spec
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.max_batch = max_batch
        self.max_seq_len = max_seq_len
        self.max_blocks_per_seq = -(-max_seq_len // block_size)
        self.block_tables = np.zeros((max_batch, self.max_blocks_per_seq), np.int32)
        self._free_blocks = FreeBlocks(num_blocks)  # pop() hands out 0, 1, 2, ...
        self._free_rows = list(range(max_batch - 1, -1, -1))
        self._seqs: dict[int, _Seq] = {}

    # ---- memory ----
    kv_on_host = True  # the KV pool lives in host memory (a GPU backend keeps it on the device)
    kv_bytes_per_value = 4  # float32 K / V in the host pool

    def _host_parts(
        self, spec: DecoderSpec, num_blocks: int, block_size: int, max_batch: int, max_seq_len: int
    ) -> list[Part]:
        """The host allocations the options size, before they are made (a subclass adds its
        own step buffers)."""
        if self.kv_on_host:
            per_block = kv_block_bytes(spec, block_size, self.kv_bytes_per_value)
            pool = (
                f"KV pool (kv_blocks={num_blocks} x block_size={block_size} tokens, "
                f"{per_block} bytes a block)"
            )
        else:
            per_block, pool = 0, "KV pool (on the device)"
        width = -(-max_seq_len // block_size)
        return [
            Part(pool, "kv_blocks", num_blocks * per_block),
            Part(
                f"block tables (max_batch={max_batch} x max_seq_len={max_seq_len} / "
                f"block_size={block_size})",
                "max_seq_len" if width > max_batch else "max_batch",
                max_batch * (4 * width + PY_INT_BYTES),
            ),
        ]

    # ---- the contract ----
    def pool(self) -> PoolInfo:
        return PoolInfo(
            self.block_size,
            self.num_blocks,
            len(self._free_blocks),
            len(self._seqs),
            self.max_batch,
            {"max_seq_len": self.max_seq_len},
        )

    def blocks_needed(self, prompt_len: int, max_new_tokens: int) -> int:
        return -(-max(1, prompt_len + max_new_tokens - 1) // self.block_size)

    def add(self, seq_id: int, prompt_ids: np.ndarray, params: SamplingParams) -> None:
        ids = np.asarray(prompt_ids)
        if ids.ndim != 1 or ids.size == 0:
            raise InputError("the prompt is empty: give at least one token")
        if not np.issubdtype(ids.dtype, np.integer):
            raise InputError(f"prompt ids must be integers, got {ids.dtype}")
        if ids.min() < 0 or ids.max() >= self.spec.vocab_size:
            raise InputError(f"prompt ids must lie in [0, {self.spec.vocab_size})")
        if params.max_new_tokens < 1:
            raise InputError(f"max_new_tokens must be at least 1, got {params.max_new_tokens}")
        if ids.size + params.max_new_tokens > self.max_seq_len:
            raise InputError(
                f"prompt of {ids.size} tokens + max_new_tokens {params.max_new_tokens} is over the context "
                f"limit max_seq_len={self.max_seq_len}; shorten the prompt or lower max_new_tokens"
            )
        if seq_id in self._seqs:
            raise InputError(f"sequence {seq_id} is already running")
        need = self.blocks_needed(ids.size, params.max_new_tokens)
        if need > len(self._free_blocks) or not self._free_rows:
            raise KVPoolFull(
                f"KV pool: sequence needs {need} blocks of {self.block_size} tokens, {len(self._free_blocks)} of "
                f"{self.num_blocks} free, {len(self._seqs)} of {self.max_batch} batch slots used; retry when "
                "running sequences finish, or compile with more kv_blocks / max_batch"
            )
        blocks = [self._free_blocks.pop() for _ in range(need)]
        row = self._free_rows.pop()
        self.block_tables[row, :need] = blocks
        seed = params.seed if params.seed is not None else int.from_bytes(os.urandom(8), "little")
        stop = set(params.stop_token_ids)
        if not params.ignore_eos:
            stop.update(self.spec.eos_token_ids)
        self._seqs[seq_id] = _Seq(
            seq_id,
            row,
            blocks,
            params,
            seed & (2**64 - 1),
            pending=ids.astype(np.int32),
            stop_ids=frozenset(stop),
        )

    def cancel(self, seq_id: int) -> None:
        s = self._seqs.pop(seq_id, None)
        if s is not None:
            self._release(s)

    def step(self) -> list[StepEvent]:
        if not self._seqs:
            return []
        seqs = list(self._seqs.values())
        return self._advance(seqs, self._run(*self._inputs(seqs)))

    def _inputs(self, seqs: list[_Seq]) -> tuple:
        """(rows, starts, counts, ids, samp, seeds) of one step over seqs, the arrays _run takes."""
        B = len(seqs)
        rows = np.fromiter((s.row for s in seqs), np.int32, B)
        starts = np.fromiter((s.cached for s in seqs), np.int32, B)
        counts = np.fromiter((len(s.pending) for s in seqs), np.int32, B)
        ids = np.concatenate([s.pending for s in seqs]).astype(np.int32)
        samp = np.zeros((B, 4), np.float64)  # temperature, top_k, top_p, draw index
        seeds = np.zeros(B, np.uint64)
        for i, s in enumerate(seqs):
            p = s.params
            samp[i] = (p.temperature, p.top_k, p.top_p, s.generated)
            seeds[i] = s.seed
        return rows, starts, counts, ids, samp, seeds

    def _advance(self, seqs: list[_Seq], nxt) -> list[StepEvent]:
        """Book the step's next tokens nxt[i] of seqs[i] (their pending tokens are now cached),
        finish and release the sequences that ended."""
        events = []
        for i, s in enumerate(seqs):
            tok = int(nxt[i])
            s.cached += len(s.pending)
            s.generated += 1
            s.pending = np.array([tok], np.int32)
            finish = None
            if tok in s.stop_ids:
                finish = FinishReason.STOP
            elif self._at_length(s, s.generated, s.cached):
                finish = FinishReason.LENGTH
            events.append(StepEvent(s.seq_id, tok, finish))
            if finish is not None:
                del self._seqs[s.seq_id]
                self._release(s)
        return events

    def _at_length(self, s: _Seq, generated: int, cached: int) -> bool:
        """The length rule: max_new_tokens generated, or the context full (one slot kept for the
        token that would be fed next)."""
        return generated >= s.params.max_new_tokens or cached + 1 >= self.max_seq_len

    def _ends_by_length(self, s: _Seq) -> bool:
        """Whether decoding sequence s finishes by length at its next step."""
        return self._at_length(s, s.generated + 1, s.cached + 1)

    # ---- helpers ----
    def _release(self, s: _Seq) -> None:
        self._free_blocks.extend(reversed(s.blocks))
        self.block_tables[s.row] = 0
        self._free_rows.append(s.row)

    def _run(
        self, rows, starts, counts, ids, samp, seeds
    ) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError
