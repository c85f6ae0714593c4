"""The one retry rule of a batch that fails: run it as one call, and when that call fails, each
request's part alone, so only the requests that fail by themselves get the error.

The server's batcher uses it (zoi.serve.batcher, on each engine of zoi.serve.replicas), and so
does a Triton instance (zoi.integrations.triton_runtime.BatchRunner). No web stack, no threads.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np


def run_isolated(
    parts: Sequence[Sequence],
    call: Callable[[list], np.ndarray],
    deliver: Callable[[int, np.ndarray | None, BaseException | None, float], None],
    *,
    errors: type[BaseException] | tuple[type[BaseException], ...] = Exception,
    skip: Callable[[int], bool] | None = None,
    after_packed: Callable[[list, float, BaseException | None], None] | None = None,
) -> int | None:
    """`call(seqs) -> rows` over the sequences of all `parts` (one packed call), each part's
    rows delivered; when that call raises `errors`, each part is retried alone (in order).

    deliver(i, rows, error, seconds): part i's rows (error None) or the error its retry raised
    (rows None), as soon as it is known; seconds: the engine time it took (the packed call's,
    plus its own retry's).
    skip(i): asked just before part i's retry; True: not retried, not delivered (its request
    has already failed elsewhere).
    after_packed(seqs, seconds, error): after the packed call, before any delivery or retry;
    error: what the packed call raised, else None.

    An exception that is not one of `errors` propagates (the caller fails the whole batch).
    Returns None when the packed call ran, else how many parts then ran alone.
    """
    seqs = [s for part in parts for s in part]
    t0 = time.perf_counter()
    try:
        out = call(seqs)
        failed = None
    except errors as e:
        failed = e
    dt = time.perf_counter() - t0
    if after_packed is not None:
        after_packed(seqs, dt, failed)
    if failed is None:
        row = 0
        for i, part in enumerate(parts):
            deliver(i, out[row : row + len(part)], None, dt)
            row += len(part)
        return None
    ok = 0
    for i, part in enumerate(parts):
        if skip is not None and skip(i):
            continue
        t1 = time.perf_counter()
        try:
            rows = call(part)
        except errors as e:
            deliver(i, None, e, time.perf_counter() - t1)
            continue
        ok += 1
        deliver(i, rows, None, dt + time.perf_counter() - t1)
    return ok
