"""The batcher's own logic (packing by budget, order, splitting, failure isolation, cancel, drain).

`run` here is a tiny deterministic function of each sequence, so that every row can be checked
exactly and engine calls can be recorded; the real engine is exercised by the server tests.
"""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest

from zoi.serve.batcher import Batcher, BatcherClosed
from zoi.serve.metrics import Metrics

H = 4


def row(seq: np.ndarray) -> np.ndarray:
    return np.array([len(seq), seq.sum(), seq[0], seq[-1]], np.float32)


class Recorder:
    def __init__(self, fail_on: int | None = None, delay: float = 0.0):
        self.calls: list[list[int]] = []
        self.fail_on = fail_on
        self.delay = delay
        self.gate = threading.Event()
        self.gate.set()

    def __call__(self, seqs):
        self.gate.wait(10)
        self.calls.append([len(s) for s in seqs])
        if self.delay:
            time.sleep(self.delay)
        if self.fail_on is not None and any((s == self.fail_on).any() for s in seqs):
            raise RuntimeError("boom")
        return np.stack([row(s) for s in seqs])


def seqs_of(lengths, start=2):
    return [np.arange(start + i, start + i + n, dtype=np.int32) for i, n in enumerate(lengths)]


def test_budgets_order_and_split():
    rec = Recorder()
    rec.gate.clear()  # hold the worker so that everything queues first
    b = Batcher(rec, H, max_batch_tokens=10, max_batch_requests=3, metrics=Metrics())

    async def main():
        jobs = [
            b.submit(seqs_of(lens, start=10 * k), normalize=False)
            for k, lens in enumerate([[4, 4], [3], [10], [1, 1, 1, 1, 1], [2]])
        ]
        rec.gate.set()
        return [await j.future for j in jobs], jobs

    outs, jobs = asyncio.run(main())
    b.close()
    for j, out in zip(jobs, outs, strict=True):
        assert out.shape == (len(j.out), H)
    for k, lens in enumerate([[4, 4], [3], [10], [1, 1, 1, 1, 1], [2]]):
        expect = np.stack([row(s) for s in seqs_of(lens, start=10 * k)])
        assert np.array_equal(outs[k], expect)
    # the first call could take the first job alone or more; every call obeys both budgets
    assert all(sum(c) <= 10 and len(c) <= 3 for c in rec.calls)
    assert sum(len(c) for c in rec.calls) == 10
    # job 3 (five sequences) had to be split over at least two calls
    assert len(rec.calls) >= 5


def test_normalize_per_job():
    rec = Recorder()
    b = Batcher(rec, H, 100, 100)

    async def main():
        s = seqs_of([3, 5])
        a, c = b.submit(s, True), b.submit(s, False)
        return await a.future, await c.future

    norm, raw = asyncio.run(main())
    b.close()
    assert np.allclose(np.linalg.norm(norm, axis=1), 1.0)
    assert np.allclose(norm, raw / np.linalg.norm(raw, axis=1, keepdims=True))


def test_failure_isolated_to_its_job():
    rec = Recorder(fail_on=999)
    rec.gate.clear()
    b = Batcher(rec, H, 100, 100)

    async def main():
        good1 = b.submit(seqs_of([3]), False)
        bad = b.submit([np.array([5, 999, 7, 8, 9], np.int32)], False)
        good2 = b.submit(seqs_of([4, 2]), False)
        rec.gate.set()
        res = await asyncio.gather(good1.future, bad.future, good2.future, return_exceptions=True)
        return res

    r1, rbad, r2 = asyncio.run(main())
    b.close()
    assert isinstance(rbad, RuntimeError)
    assert np.array_equal(r1, np.stack([row(s) for s in seqs_of([3])]))
    assert np.array_equal(r2, np.stack([row(s) for s in seqs_of([4, 2])]))
    # The worker may take its first batch before every job is queued, so the batches vary;
    # what must hold: the failing job ends up alone, and every job that shared a failed
    # call with it was retried alone (its answer above is right).
    assert [5] in rec.calls
    for i, call in enumerate(rec.calls):
        if 5 in call and len(call) > 1:  # a failed shared call: its jobs are retried after it
            assert [5] in rec.calls[i + 1 :]


def test_cancelled_job_is_dropped_and_close_drains():
    rec = Recorder()
    rec.gate.clear()
    m = Metrics()
    b = Batcher(rec, H, 100, 100, metrics=m)

    async def main():
        first = b.submit(seqs_of([2]), False)
        await asyncio.sleep(0.05)  # the worker has taken `first` and waits at the gate
        gone = b.submit(seqs_of([7]), False)
        kept = [b.submit(seqs_of([i + 1]), False) for i in range(5)]
        gone.cancel()
        rec.gate.set()
        outs = await asyncio.gather(first.future, *(k.future for k in kept))
        return gone, outs

    gone, outs = asyncio.run(main())
    b.close()
    assert not gone.future.done()
    assert [len(c) for c in rec.calls] and all(7 not in c for c in rec.calls)
    assert m.dropped._value.get() == 1
    assert [o[0, 0] for o in outs] == [2, 1, 2, 3, 4, 5]
    with pytest.raises(BatcherClosed):
        asyncio.run(_submit(b))


async def _submit(b):
    return b.submit(seqs_of([1]), False)


def test_close_answers_everything_queued():
    rec = Recorder(delay=0.01)
    b = Batcher(rec, H, 8, 2)

    async def main():
        jobs = [b.submit(seqs_of([3, 3, 3]), False) for _ in range(10)]
        await asyncio.sleep(0)
        closer = threading.Thread(target=b.close)
        closer.start()
        outs = await asyncio.gather(*(j.future for j in jobs))
        closer.join()
        return outs

    outs = asyncio.run(main())
    assert len(outs) == 10 and all(o.shape == (3, H) for o in outs)


def test_queue_delay_waits_for_a_fuller_batch():
    rec = Recorder()
    b = Batcher(rec, H, 1000, 1000, max_queue_delay_us=200_000)

    async def main():
        jobs = [b.submit(seqs_of([2]), False)]
        for _ in range(4):
            await asyncio.sleep(0.01)
            jobs.append(b.submit(seqs_of([2]), False))
        return await asyncio.gather(*(j.future for j in jobs))

    asyncio.run(main())
    b.close()
    assert rec.calls == [[2, 2, 2, 2, 2]]
