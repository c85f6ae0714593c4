"""Dynamic batching: requests queue, a worker thread packs them by a token budget and runs them.

The event loop submits a `Job` (a request's token id arrays) and awaits its future; it never
runs the engine. One worker thread owns the engine: it builds each batch from the queued jobs
until the next sequence would pass `max_batch_tokens` tokens or `max_batch_requests`
sequences, packs them without padding (ids[T], positions[T], cu_seqlens[B+1]) and makes one
engine call, in which native code releases the GIL. A job bigger than one batch is split over
several calls; a batch may hold pieces of many jobs. Each job gets its own rows back, in
order, when its last sequence is done.

- Fair slicing: the queued jobs share each batch round-robin. Every job with sequences left
  gets an equal share of the budget still free (tokens and sequences; at least one sequence
  when it fits), again until the batch is full; a job that got a piece and has more left goes
  to the back of the queue, one that got nothing (the batch was full) keeps its place at the
  front. So a big request runs as a series of batch-sized slices, and a small request that
  arrives meanwhile rides in the next engine call instead of waiting for the whole big one;
  big requests queued together progress at the same pace. Each sequence is computed alone
  (packed, no padding), so a row does not depend on which batch carried it.
- Balanced batches (`balance`, `zoi serve --batch-balance`): a batch of several jobs takes
  at most half of the sequences in the pipeline, those queued plus those of the batch that
  just ran (whose clients are about to send their next requests). Closed-loop clients
  otherwise lock into uneven alternating batches (7 then 1, 6 then 2, 5 then 3): on a CPU
  engine the short batch runs while the event loop answers the long one and reads its clients'
  next requests, and that interference makes its sequences cost up to 1.6x those of an even
  batch; halving settles them at even halves (4 then 4 with 8 clients) within a few batches.
  A lone job is never cut by it (its budgets and fair slicing still apply).
- A job whose client went away (`Job.cancel()`) is dropped from the queue before packing.
- When an engine call fails, each job of that batch is retried alone, so only the jobs
  that fail by themselves get the error.
- `close()` stops taking new jobs and returns once everything queued has been answered
  (graceful shutdown).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
from collections.abc import Callable

import numpy as np

from zoi.serve.isolate import run_isolated

log = logging.getLogger("zoi.serve")


class BatcherClosed(RuntimeError):
    """Raised by submit() once the batcher is shutting down."""


class Job:
    """One request's sequences; the worker fills `out` row by row."""

    __slots__ = (
        "seqs",
        "normalize",
        "future",
        "loop",
        "out",
        "next",
        "left",
        "t_enqueue",
        "t_first_run",
        "queue_s",
        "infer_s",
        "cancelled",
        "error",
        "tokens",
    )

    def __init__(self, seqs: list[np.ndarray], normalize: bool, loop: asyncio.AbstractEventLoop):
        self.seqs = seqs
        self.normalize = normalize
        self.loop = loop
        self.future: asyncio.Future = loop.create_future()
        self.out: np.ndarray | None = None
        self.next = 0  # index of the first sequence not yet taken into a batch
        self.left = len(seqs)  # sequences not yet computed
        self.t_enqueue = 0.0
        self.t_first_run: float | None = None
        self.queue_s = 0.0  # time from enqueue to the first engine call that held it
        self.infer_s = 0.0  # summed time of the engine calls that held it
        self.cancelled = False
        self.error: BaseException | None = None
        self.tokens = int(sum(len(s) for s in seqs))

    def cancel(self) -> None:
        self.cancelled = True


class Batcher:
    def __init__(
        self,
        run: Callable[[list[np.ndarray]], np.ndarray],
        hidden: int,
        max_batch_tokens: int,
        max_batch_requests: int,
        max_queue_delay_us: int = 0,
        metrics=None,
        name: str = "zoi-batcher",
        balance: bool = False,
    ):
        self._run = run
        self.hidden = hidden
        self.max_batch_tokens = max_batch_tokens
        self.max_batch_requests = max_batch_requests
        self.max_delay = max_queue_delay_us / 1e6
        self.metrics = metrics
        self._queue: collections.deque[Job] = collections.deque()
        self._queued_seqs = 0
        self._queued_tokens = 0
        self._cond = threading.Condition()
        self._jlock = threading.Lock()  # a job's rows / counters (with several workers, its
        # pieces may run in parallel; zoi.serve.replicas)
        self._closing = False
        # balanced batches (module docstring); one worker only: with several (replicas) the
        # batch "that just ran" is not one batch
        self.balance = balance
        self._last_seqs = 0  # sequences of the batch taken last
        self.batches = 0
        self.sequences = 0
        self._start(name)

    def _start(self, name: str) -> None:
        """Start the worker(s): one thread here (zoi.serve.replicas: one per engine)."""
        self._thread = threading.Thread(target=self._worker, name=name, daemon=True)
        self._thread.start()

    def _wake(self) -> None:
        """Under the lock: a job was queued; wake a worker."""
        self._cond.notify()

    # ---- event loop side -------------------------------------------------------------
    def submit(self, seqs: list[np.ndarray], normalize: bool) -> Job:
        """Queue one request's sequences; await `job.future` for float32 [len(seqs), H]."""
        job = Job(seqs, normalize, asyncio.get_running_loop())
        if not seqs:
            job.out = np.zeros((0, self.hidden), np.float32)
            job.future.set_result(job.out)
            return job
        for s in seqs:
            if len(s) == 0 or len(s) > self.max_batch_tokens:
                raise ValueError(
                    f"sequence of {len(s)} tokens does not fit a batch of {self.max_batch_tokens}"
                )
        with self._cond:
            if self._closing:
                raise BatcherClosed("the server is shutting down")
            job.t_enqueue = time.perf_counter()
            self._queue.append(job)
            self._queued_seqs += len(seqs)
            self._queued_tokens += job.tokens
            self._set_queue_gauges()
            self._wake()
        return job

    def close(self, timeout: float | None = None) -> None:
        """Stop taking jobs, answer everything queued, stop the worker."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._thread.join(timeout)

    # ---- worker side -----------------------------------------------------------------
    def _set_queue_gauges(self) -> None:
        if self.metrics is not None:
            self.metrics.queue_size.set(self._queued_seqs)
            self.metrics.queue_tokens.set(self._queued_tokens)

    def _drop_job(self, job: Job) -> None:
        """Under the lock: the bookkeeping of a cancelled job leaving the queue."""
        self._queued_seqs -= len(job.seqs) - job.next
        self._queued_tokens -= sum(len(s) for s in job.seqs[job.next :])
        if self.metrics is not None:
            self.metrics.dropped.inc()
        job.seqs = []

    def _drop_cancelled_head(self) -> None:
        while self._queue and self._queue[0].cancelled:
            self._drop_job(self._queue.popleft())
            self._set_queue_gauges()

    def _drop_cancelled(self) -> None:
        """Under the lock: drop every cancelled job (with fair slicing one can be anywhere)."""
        if any(job.cancelled for job in self._queue):
            keep = [job for job in self._queue if not job.cancelled]
            for job in self._queue:
                if job.cancelled:
                    self._drop_job(job)
            self._queue.clear()
            self._queue.extend(keep)
            self._set_queue_gauges()

    def _take(self) -> list[tuple[Job, int, int, list]]:
        """Under the lock: the next batch as (job, start, stop, seqs) pieces, one per job, by
        the budgets, shared round-robin (fair slicing, see the module docstring). Each piece's
        sequences are kept with it (a job's `seqs` is cleared once it is answered, perhaps
        while another worker still runs a piece of it), its `out` allocated."""
        self._drop_cancelled()
        jobs = list(self._queue)
        limit = self.max_batch_requests
        if self.balance and len(jobs) > 1:
            limit = balanced_limit(self._queued_seqs, self._last_seqs, limit)
        first: dict[Job, int] = {}  # job -> its first sequence in this batch, in service order
        tokens = count = 0
        active = jobs
        while active and count < limit:
            tok_share = max(1, (self.max_batch_tokens - tokens) // len(active))
            seq_share = max(1, (limit - count) // len(active))
            more = []  # jobs that took their share and may take more in the next pass
            for job in active:
                i = job.next
                got = got_tokens = 0
                while i < len(job.seqs) and got < seq_share and count < limit:
                    n = len(job.seqs[i])
                    if tokens + n > self.max_batch_tokens or (got and got_tokens + n > tok_share):
                        break
                    tokens += n
                    count += 1
                    got += 1
                    got_tokens += n
                    i += 1
                if got:
                    first.setdefault(job, job.next)
                    job.next = i
                    if i < len(job.seqs):
                        more.append(job)
            active = more
        pieces: list[tuple[Job, int, int, list]] = []
        for job, start in first.items():
            part = job.seqs[start : job.next]
            pieces.append((job, start, job.next, part))
            if job.out is None:  # allocated while its sequences are surely there
                job.out = np.empty((len(job.seqs), self.hidden), np.float32)
            self._queued_seqs -= len(part)
            self._queued_tokens -= sum(len(s) for s in part)
        # the round-robin order: jobs left out of this batch first, then the served ones
        # that have sequences left, in the order they were served
        waiting = [job for job in jobs if job not in first]
        again = [job for job in first if job.next < len(job.seqs)]
        self._queue.clear()
        self._queue.extend(waiting + again)
        self._set_queue_gauges()
        self._last_seqs = count
        return pieces

    def _wait_for_work(self) -> bool:
        """Under the lock: block until there is work (or closing with nothing left)."""
        while True:
            self._drop_cancelled_head()
            if self._queue:
                break
            if self._closing:
                return False
            self._cond.wait()
        self._fill_wait(self._cond)
        return True

    def _fill_wait(self, cond: threading.Condition) -> None:
        """Under the lock, with work queued: let the batch fill for up to max_delay after the
        oldest job arrived, until a budget is full or the batcher closes. `cond`: the waiting
        worker's condition (on the batcher's lock)."""
        if self.max_delay <= 0 or self._closing:
            return
        # the oldest queued job (with fair slicing the queue is not in arrival order)
        deadline = min(job.t_enqueue for job in self._queue) + self.max_delay
        while (
            self._queued_tokens < self.max_batch_tokens
            and self._queued_seqs < self.max_batch_requests
            and not self._closing
        ):
            left = deadline - time.perf_counter()
            if left <= 0:
                break
            cond.wait(left)
        self._drop_cancelled_head()

    def _worker(self) -> None:
        while True:
            with self._cond:
                if not self._wait_for_work():
                    return
                pieces = self._take()
            self._run_guarded(pieces, self._run_batch)

    def _run_guarded(self, pieces: list, run: Callable[[list], object], where: str = "") -> None:
        """`run(pieces)`; an unexpected error fails the batch's jobs (a worker never dies)."""
        if not pieces:
            return
        try:
            run(pieces)
        except BaseException as e:
            log.exception("batcher: unexpected error%s", where)
            for job, *_ in pieces:
                self._fail(job, e)

    def _run_batch(self, pieces: list[tuple[Job, int, int, list]]) -> None:
        self._run_pieces(pieces, self._run)

    def _run_pieces(
        self,
        pieces: list[tuple[Job, int, int, list]],
        call: Callable[[list], np.ndarray],
        errors: type[BaseException] = Exception,
    ) -> int | None:
        """One batch: `call(seqs) -> rows` over the sequences of all pieces, each job's rows
        delivered. When the call raises `errors`, each job's piece is retried alone, so only the
        jobs that fail by themselves get the error (zoi.serve.isolate.run_isolated). Returns
        None when the batch ran whole, else how many pieces then ran alone."""
        t0 = time.perf_counter()
        with self._jlock:
            for job, _, _, _ in pieces:
                if job.t_first_run is None:
                    job.t_first_run = t0
                    job.queue_s = t0 - job.t_enqueue
                    if self.metrics is not None:
                        self.metrics.queue_duration.observe(job.queue_s)

        def after_packed(seqs: list, dt: float, failed: BaseException | None) -> None:
            if failed is not None:
                log.warning(
                    "batcher: engine call over %d sequences failed (%s); retrying each request alone",
                    len(seqs),
                    failed,
                )
            with self._cond:
                self.batches += 1
                self.sequences += len(seqs)
            if self.metrics is not None:
                self.metrics.batch_size.observe(len(seqs))
                self.metrics.batch_tokens.observe(sum(len(s) for s in seqs))
                self.metrics.inference_duration.observe(dt)

        def deliver(i: int, rows, error, dt: float) -> None:
            job, start = pieces[i][0], pieces[i][1]
            if error is not None:
                self._fail(job, error)
            else:
                self._deliver(job, start, rows, dt)

        return run_isolated(
            [part for _, _, _, part in pieces],
            call,
            deliver,
            errors=errors,
            skip=lambda i: pieces[i][0].error is not None,
            after_packed=after_packed,
        )

    def _deliver(self, job: Job, start: int, rows: np.ndarray, dt: float) -> None:
        with self._jlock:
            if job.error is not None or job.out is None:
                return
            job.out[start : start + len(rows)] = rows
            job.infer_s += dt
            job.left -= len(rows)
            done = job.left == 0
        if done:
            out = job.out
            if job.normalize:
                norms = np.linalg.norm(out, axis=1, keepdims=True)
                np.maximum(norms, 1e-12, out=norms)
                out /= norms
            job.seqs = []
            _post(job.loop, _set_result, job.future, out)

    def _fail(self, job: Job, e: BaseException) -> None:
        with self._jlock:
            if job.error is not None or job.future.done():
                return
            job.error = e
        with self._cond:  # drop what is still queued of it
            if job.next < len(job.seqs) and job in self._queue:
                self._queue.remove(job)
                self._queued_seqs -= len(job.seqs) - job.next
                self._queued_tokens -= sum(len(s) for s in job.seqs[job.next :])
                self._set_queue_gauges()
        _post(job.loop, _set_exception, job.future, e)


def balance_on(mode: str, device: str, engines: int, max_queue_delay_us: int) -> bool:
    """Whether the batches of a server are balanced (`--batch-balance`): "on" / "off" say so;
    "auto" is on for one CPU engine with no queue delay. A CPU engine costs about the same per
    sequence from a few sequences up, so halving a batch costs no throughput; a GPU's cost per
    sequence falls with the batch, and a queue delay asks for fuller batches. Several engines
    (--gpus / --replicas) have no single batch "that just ran": never balanced."""
    if mode not in ("auto", "on", "off"):
        raise ValueError(f"batch_balance must be auto, on or off, got {mode!r}")
    if engines != 1 or mode == "off":
        return False
    return mode == "on" or (device == "cpu" and max_queue_delay_us == 0)


def balanced_limit(queued: int, last: int, limit: int) -> int:
    """The sequences a balanced batch may take: half of those in the pipeline (`queued` plus
    the `last` batch's, rounded up), at least one, at most `limit` (max_batch_requests). With
    N closed-loop clients in steady alternation (a batch of b runs while N - b queue) this is
    N / 2 whatever b was, so uneven batches even out."""
    return max(1, min(limit, (queued + last + 1) // 2))


def _set_result(fut: asyncio.Future, value) -> None:
    if not fut.done():
        fut.set_result(value)


def _set_exception(fut: asyncio.Future, e: BaseException) -> None:
    if not fut.done():
        fut.set_exception(e)


def _post(loop: asyncio.AbstractEventLoop, fn, *args) -> None:
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:  # the loop is closed: nobody is waiting any more
        pass
