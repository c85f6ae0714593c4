"""The engine's chunk loop: packed chunks through Backend.submit / wait, at most two in flight.

A call's sequences run in greedy chunks of consecutive sequences (at most `max_tokens`
tokens and `max_seqs` sequences each, the split docs/TOKENIZER.md describes). A chunk comes
from a source:

- `ArraySource`: slices of packed arrays already in memory (run_packed, the HF tokenizer);
- `StreamSource`: the native tokenizer's TokenStream, which tokenises and packs the next chunk
  into one of two staging buffer sets with one native call (GIL released, no Python loop over
  texts).

The loop submits chunk i, then prepares chunk i+1 while the backend runs chunk i (an
asynchronous backend: the GPU; a synchronous one, `SyncSubmit`, has finished by then). A
staging set is written again only after the ticket of the chunk that used it was waited, so
a backend may read its inputs up to `wait` (zero-copy) and not just up to `submit`. An error
of `submit`, `wait` or the source waits out every ticket still in flight before it is
raised: nothing keeps writing into an output the caller has given up, and the next call
finds the backend idle.

One call at a time per engine: run_chunks assumes it owns both staging sets and both ticket
slots, so the engine holds its lock for the whole call (zoi.engine.Engine._run_source says why).
"""

from __future__ import annotations

from collections import deque

import numpy as np


class Staging:
    """Two sets of int32 staging buffers: ids / positions [max_tokens], cu_seqlens [max_seqs+1]."""

    def __init__(self, max_tokens: int, max_seqs: int):
        self.max_tokens, self.max_seqs = int(max_tokens), int(max_seqs)
        self.sets = [
            (
                np.empty(self.max_tokens, np.int32),
                np.empty(self.max_tokens, np.int32),
                np.empty(self.max_seqs + 1, np.int32),
            )
            for _ in range(2)
        ]


class ArraySource:
    """Chunks of packed arrays in memory: views, nothing copied (the arrays outlive the call)."""

    def __init__(self, ids, positions, cu, max_tokens: int, max_seqs: int):
        self.ids, self.pos, self.cu = ids, positions, cu
        self.max_tokens, self.max_seqs = max_tokens, max_seqs
        self.s, self.B = 0, len(cu) - 1

    def next(self, staging_set):
        s, cu = self.s, self.cu
        if s >= self.B:
            return None
        e = int(np.searchsorted(cu, cu[s] + self.max_tokens, side="right")) - 1
        e = min(max(e, s + 1), s + self.max_seqs, self.B)
        a, z = int(cu[s]), int(cu[e])
        sub = cu[s : e + 1] - a if a else cu[s : e + 1]
        self.s = e
        return self.ids[a:z], self.pos[a:z], sub, e - s


class StreamSource:
    """Chunks tokenised on demand by a native TokenStream into the staging set it is given."""

    def __init__(self, stream, max_tokens: int, max_seqs: int, on_bad):
        self.stream, self.max_tokens, self.max_seqs = stream, max_tokens, max_seqs
        self.on_bad = on_bad  # bad text index -> the exception to raise

    def next(self, staging_set):
        ids, pos, cu = staging_set
        n, T, bad = self.stream.fill(ids, pos, cu, self.max_tokens, self.max_seqs)
        if bad >= 0:
            raise self.on_bad(bad)
        if n == 0:
            return None
        return ids[:T], pos[:T], cu[: n + 1], n


def run_chunks(
    backend, source, normalize: bool, out: np.ndarray, staging: Staging, check=None, on_chunk=None
) -> int:
    """Run every chunk of `source` into consecutive rows of `out`; returns the rows written.
    check(ids, positions) may raise before a chunk is submitted; on_chunk(n) follows each wait."""
    inflight: deque = deque()  # (ticket, n)
    s = k = 0
    try:
        while True:
            if len(inflight) == 2:  # frees the staging set chunk k-2 used
                t, n = inflight.popleft()
                backend.wait(t)
                if on_chunk is not None:
                    on_chunk(n)
            chunk = source.next(staging.sets[k & 1])
            if chunk is None:
                break
            ids, pos, cu, n = chunk
            if check is not None:
                check(ids, pos)
            inflight.append((backend.submit(ids, pos, cu, normalize, out[s : s + n]), n))
            s += n
            k += 1
        while inflight:
            t, n = inflight.popleft()
            backend.wait(t)
            if on_chunk is not None:
                on_chunk(n)
    except BaseException:
        while inflight:  # the first error wins; the others only drain the queue
            t, _ = inflight.popleft()
            try:
                backend.wait(t)
            except BaseException:  # noqa: S110 - a later chunk's error after the first one
                pass
        raise
    return s
