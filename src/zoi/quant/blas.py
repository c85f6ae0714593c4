"""BLAS for the quantiser: the same bits for any thread count, both cores used.

OpenBLAS's float64 products and factorisations (dgemm, dsyrk, dpotrf) round differently with
one thread and with two on this project's machines, and a last-bit change can flip a rounding
decision of the artifact. So the quantiser runs BLAS single-threaded (`single_threaded`, via
threadpoolctl where installed) and takes the second core itself, with a split fixed by the
shapes alone: `gram` sums two halves of the rows, each a single-threaded product, in one
order; `parallel_map` runs independent jobs (one linear each) on two worker threads. The
results depend on the inputs and the machine's BLAS kernels only.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor

import numpy as np

WORKERS = 2  # fixed: the split of a product must not depend on the machine's core count
_pool: ThreadPoolExecutor | None = None


def _executor() -> ThreadPoolExecutor:
    global _pool
    if _pool is None:
        _pool = ThreadPoolExecutor(WORKERS, thread_name_prefix="zoi-quant")
    return _pool


def single_threaded():
    """A context with one BLAS thread (threadpoolctl); without threadpoolctl, nothing (then
    the bits may follow OPENBLAS_NUM_THREADS)."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover
        return contextlib.nullcontext()
    return threadpool_limits(1, user_api="blas")


def gram(x: np.ndarray) -> np.ndarray:
    """x^T x of x [T, K] in x's dtype (a symmetric BLAS product per half of the rows, the two
    halves on two threads, added in order)."""
    T = x.shape[0]
    if T < 256 or x.shape[1] < 64:
        return x.T @ x
    h = T // 2
    a, b = x[:h], x[h:]
    fb = _executor().submit(lambda: b.T @ b)
    g = a.T @ a
    g += fb.result()
    return g


def submit(fn: Callable, *args):
    """fn(*args) on a worker thread: a Future."""
    return _executor().submit(fn, *args)


def parallel_map(fn: Callable, items: Iterable) -> list:
    """[fn(i) for i in items], WORKERS at a time, in order."""
    return list(_executor().map(fn, items))
