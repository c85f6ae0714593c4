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

from zoi.serve.batcher import Batcher, BatcherClosed, balance_on, balanced_limit
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
    # ten sequences, at most three per call
    assert len(rec.calls) >= 4


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


# ---- fair slicing ---------------------------------------------------------------------------------
class Tagged(Recorder):
    """Records, per engine call, the tag of each sequence (its first id // 1000: the job)."""

    def __init__(self):
        super().__init__()
        self.tags: list[list[int]] = []

    def __call__(self, seqs):
        self.tags.append([int(s[0]) // 1000 for s in seqs])
        return super().__call__(seqs)


def job_seqs(tag: int, lengths) -> list[np.ndarray]:
    return [np.arange(n, dtype=np.int32) + 1000 * tag + i for i, n in enumerate(lengths)]


def test_small_job_rides_in_the_next_batch_not_after_the_big_one():
    rec = Tagged()
    rec.gate.clear()  # the first batch (of the big job alone) waits at the gate
    b = Batcher(rec, H, max_batch_tokens=10, max_batch_requests=100)
    done: list[str] = []

    async def main():
        big = b.submit(job_seqs(1, [5] * 20), False)
        await asyncio.sleep(0.05)  # the worker holds the big job's first slice
        small = b.submit(job_seqs(2, [1]), False)
        big.future.add_done_callback(lambda f: done.append("big"))
        small.future.add_done_callback(lambda f: done.append("small"))
        rec.gate.set()
        return await big.future, await small.future

    out_big, out_small = asyncio.run(main())
    b.close()
    assert done == ["small", "big"]
    assert rec.tags[0] == [1, 1] and 2 in rec.tags[1]  # the very next call carries it
    # the rows are the un-sliced ones
    assert np.array_equal(out_big, np.stack([row(s) for s in job_seqs(1, [5] * 20)]))
    assert np.array_equal(out_small, np.stack([row(s) for s in job_seqs(2, [1])]))


def test_big_jobs_queued_together_share_every_batch():
    rec = Tagged()
    rec.gate.clear()
    b = Batcher(rec, H, max_batch_tokens=12, max_batch_requests=100)

    async def main():
        hold = b.submit(job_seqs(9, [1]), False)  # taken first; the rest queues meanwhile
        await asyncio.sleep(0.05)
        jobs = [b.submit(job_seqs(t, [3] * 8), False) for t in (1, 2)]
        rec.gate.set()
        await hold.future
        return [await j.future for j in jobs]

    outs = asyncio.run(main())
    b.close()
    assert rec.tags[1:] == [[1, 1, 2, 2]] * 4  # equal shares, until both are done
    for t, out in zip((1, 2), outs, strict=True):
        assert np.array_equal(out, np.stack([row(s) for s in job_seqs(t, [3] * 8)]))


def test_sequence_budget_is_shared_too():
    rec = Tagged()
    rec.gate.clear()
    b = Batcher(rec, H, max_batch_tokens=1000, max_batch_requests=4)

    async def main():
        hold = b.submit(job_seqs(9, [1]), False)
        await asyncio.sleep(0.05)
        many = b.submit(job_seqs(1, [1] * 12), False)  # one-token sequences: a count-bound job
        small = b.submit(job_seqs(2, [2]), False)
        rec.gate.set()
        await hold.future
        return await many.future, await small.future

    asyncio.run(main())
    b.close()
    assert sorted(rec.tags[1]) == [1, 1, 1, 2]
    assert all(len(t) <= 4 for t in rec.tags)


def test_jobs_left_out_of_a_full_batch_go_first_next_time():
    rec = Tagged()
    rec.gate.clear()
    b = Batcher(rec, H, max_batch_tokens=10, max_batch_requests=100)

    async def main():
        hold = b.submit(job_seqs(9, [1]), False)
        await asyncio.sleep(0.05)
        jobs = [b.submit(job_seqs(t, [4, 4]), False) for t in (1, 2, 3, 4)]
        rec.gate.set()
        await hold.future
        return [await j.future for j in jobs]

    asyncio.run(main())
    b.close()
    # one 4-token sequence of each fits twice per call: 1, 2 first, then 3, 4, then 1, 2 ...
    assert rec.tags[1:] == [[1, 2], [3, 4], [1, 2], [3, 4]]


def test_cancelled_job_behind_the_head_is_dropped():
    rec = Tagged()
    rec.gate.clear()
    m = Metrics()
    b = Batcher(rec, H, max_batch_tokens=10, max_batch_requests=100, metrics=m)

    async def main():
        big = b.submit(job_seqs(1, [5] * 6), False)
        await asyncio.sleep(0.05)  # the big job's first slice waits at the gate; it is requeued
        gone = b.submit(job_seqs(2, [3]), False)
        kept = b.submit(job_seqs(3, [3]), False)
        gone.cancel()
        rec.gate.set()
        return gone, await big.future, await kept.future

    gone, *_ = asyncio.run(main())
    b.close()
    assert not gone.future.done() and all(2 not in t for t in rec.tags)
    assert m.dropped._value.get() == 1
    assert m.queue_size._value.get() == 0 and m.queue_tokens._value.get() == 0


# ---- balanced batches ---------------------------------------------------------------------------
@pytest.mark.parametrize("balance", [True, False])
def test_balanced_batches_halve_the_pipeline(balance):
    """A batch of 1 runs while 7 one-sequence jobs queue (8 closed-loop clients out of step):
    balanced, the next batch takes half of the 8 in the pipeline and the rest follow (1, 4, 3,
    then even halves); unbalanced, all 7 go at once (1, 7: the alternation that persists)."""
    rec = Tagged()
    rec.gate.clear()
    b = Batcher(rec, H, max_batch_tokens=1000, max_batch_requests=100, balance=balance)

    async def main():
        hold = b.submit(job_seqs(9, [2]), False)
        await asyncio.sleep(0.05)  # the worker holds the batch of 1 at the gate
        jobs = [b.submit(job_seqs(t, [2]), False) for t in range(1, 8)]
        rec.gate.set()
        await hold.future
        return [await j.future for j in jobs]

    outs = asyncio.run(main())
    b.close()
    if balance:
        # in arrival order: the 4 that came first, then the 3 after them
        assert rec.tags == [[9], [1, 2, 3, 4], [5, 6, 7]]
    else:
        assert rec.tags == [[9], [1, 2, 3, 4, 5, 6, 7]]
    for t, out in zip(range(1, 8), outs, strict=True):
        assert np.array_equal(out, np.stack([row(s) for s in job_seqs(t, [2])]))


def test_balance_never_cuts_a_lone_job_and_keeps_fair_slicing():
    rec = Tagged()
    rec.gate.clear()
    b = Batcher(rec, H, max_batch_tokens=1000, max_batch_requests=100, balance=True)

    async def main():
        hold = b.submit(job_seqs(9, [2]), False)
        await asyncio.sleep(0.05)
        lone = b.submit(job_seqs(1, [2] * 10), False)
        rec.gate.set()
        await hold.future
        out = await lone.future
        # two jobs queued together behind a batch of 1: half of 1 + 12 = 7 sequences, shared
        # round-robin (fair slicing), the rest next
        rec.gate.clear()
        hold = b.submit(job_seqs(9, [2]), False)
        await asyncio.sleep(0.05)
        pair = [b.submit(job_seqs(t, [2] * 6), False) for t in (2, 3)]
        rec.gate.set()
        await hold.future
        return out, [await j.future for j in pair]

    out, pair = asyncio.run(main())
    b.close()
    assert rec.tags[:2] == [[9], [1] * 10]  # the lone job whole, in one call
    assert rec.tags[3:] == [[2, 2, 2, 2, 3, 3, 3], [2, 2, 3, 3, 3]]
    assert np.array_equal(out, np.stack([row(s) for s in job_seqs(1, [2] * 10)]))
    for t, o in zip((2, 3), pair, strict=True):
        assert np.array_equal(o, np.stack([row(s) for s in job_seqs(t, [2] * 6)]))


def test_balanced_limit_and_when_it_is_on():
    assert balanced_limit(7, 1, 256) == 4
    assert balanced_limit(2, 6, 256) == 4 and balanced_limit(6, 2, 256) == 4
    assert balanced_limit(3, 4, 256) == 4  # rounds up
    assert balanced_limit(1, 0, 256) == 1 and balanced_limit(0, 0, 256) == 1
    assert balanced_limit(100, 100, 32) == 32  # never past max_batch_requests
    assert balance_on("auto", "cpu", 1, 0) is True
    assert balance_on("auto", "cuda", 1, 0) is False  # a GPU's batches get cheaper per sequence
    assert balance_on("auto", "cpu", 1, 500) is False  # a queue delay asks for fuller batches
    assert balance_on("auto", "cpu", 2, 0) is False  # replicas: no single batch just run
    assert balance_on("on", "cuda", 1, 500) is True
    assert balance_on("on", "cpu", 2, 0) is False
    assert balance_on("off", "cpu", 1, 0) is False
    with pytest.raises(ValueError, match="auto, on or off"):
        balance_on("yes", "cpu", 1, 0)
