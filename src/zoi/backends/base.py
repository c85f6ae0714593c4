"""The Backend interface: what the engine asks of a backend, and nothing more.

A backend is built from a CompiledModel (zoi.graph.compiled) and runs packed sequences
(docs/ARCHITECTURE.md, "Packed batches"): ids / positions int32 [T], cu_seqlens int32 [B+1]
with at most the plan's max_tokens tokens and max_batch sequences per call (the engine
splits larger inputs). Every backend here (reference, cpu, cuda) satisfies it; the engine
calls only these members, it probes nothing backend-specific.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class Backend(Protocol):
    name: str  # the device name: "reference" | "cpu" | "cuda"

    def run(self, ids, positions, cu_seqlens, normalize: bool) -> np.ndarray:
        """Pooled embeddings of the B sequences: a new float32 [B, H] array (L2-normalised
        when `normalize`)."""
        ...

    def run_into(self, ids, positions, cu_seqlens, normalize: bool, out: np.ndarray) -> np.ndarray:
        """Like run, written into the caller's float32 C-contiguous [B, H] array `out`
        (ids, positions, cu_seqlens int32 C-contiguous); returns `out`."""
        ...

    def memory(self) -> dict:
        """Bytes the backend holds ("weights_bytes", "arena_bytes", ...), JSON-able."""
        ...

    def submit(self, ids, positions, cu_seqlens, normalize: bool, out: np.ndarray) -> object:
        """Start run_into and return a ticket; the inputs may be reused once submit returns
        (a backend that runs asynchronously stages them first), `out` is valid after wait(ticket).
        At most two tickets are outstanding (double-buffered staging); the engine overlaps
        tokenising and packing chunk i+1 with the forward of chunk i."""
        ...

    def wait(self, ticket: object) -> np.ndarray:
        """Block until the submitted forward has written its `out`; returns `out`."""
        ...


class SyncSubmit:
    """submit / wait for a backend whose run_into is synchronous: submit runs it to the end."""

    def submit(self, ids, positions, cu_seqlens, normalize: bool, out: np.ndarray) -> object:
        return self.run_into(ids, positions, cu_seqlens, normalize, out)

    def wait(self, ticket: object) -> np.ndarray:
        return ticket


@runtime_checkable
class HeadRunner(Protocol):
    """What the task heads (zoi.heads) ask of a backend besides Backend: one
    forward with token types, the graph's output whatever its rows, and taps."""

    def run_outputs(self, ids, positions, cu_seqlens, types=None, taps=()) -> dict:
        """{graph.output: float32 [B or T, cols] (not normalised), name: float32 [T, cols] for
        each name in taps (a buffer that outlives the run: the input of the graph's last op)};
        types: int32 [T] token types or None (type 0)."""
        ...


@runtime_checkable
class TaskRunner(Protocol):
    """What task adapters chosen per sequence (jina-embeddings-v3's LoRA, zoi.adapters) ask of
    a backend besides Backend; the CPU core and the reference satisfy it, the cuda backend
    refuses such models (zoi.backends.arch_support)."""

    def run_tasks_into(
        self, ids, positions, cu_seqlens, normalize: bool, out: np.ndarray, tasks
    ) -> np.ndarray:
        """run_into with tasks: int32 [B], the adapter of each sequence (-1: the base weights);
        synchronous; returns `out`."""
        ...


class KvPool(NamedTuple):
    """The paged KV cache of a generation plan (the CPU engine's set_kv_pool; the GPU's generation runtime): num_blocks blocks of
    block_size tokens per layer, block tables of table_rows rows x max_blocks, positions below
    max_pos."""

    num_blocks: int
    block_size: int
    max_blocks: int
    table_rows: int
    max_pos: int
