"""In-flight (continuous) batching over any DecoderBackend.

One thread owns the backend (the contract: it is not thread-safe) and loops:

1. take the requests submitted since the last turn and check each one against the backend (an
   empty prompt, a prompt + max_new_tokens over max_seq_len, ids outside the vocabulary, or more KV
   blocks than the whole pool holds: refused at once, with the reason); the others wait, FIFO;
2. drop the cancelled ones (a client gone: its blocks are free before the next step);
3. admit waiting requests in order while the pool has the blocks and the batch a slot (the head
   of the queue blocks the ones behind it: a big request is never starved by small ones);
4. one backend.step() (prefill of the newly admitted, one decode step for every running one);
   each StepEvent goes to its request, which detokenises incrementally, matches stop strings and
   hands text deltas to its sink.

New requests join the running batch between decode steps, finished ones leave it. When nothing runs
and nothing waits the thread blocks on a condition (no spinning). Submitting and cancelling are
thread-safe; a sink is called on the scheduler thread (AsyncSink hands items to an asyncio loop
with call_soon_threadsafe).

What a sink receives, in order: Queued (accepted, waiting for the pool), Delta (text, never a split
UTF-8 character, never part of a stop string) any number of times, then exactly one Finished
(reason "stop" / "length" / "cancelled" / "error", token counts, the error when there is one).
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from zoi.decoder.api import DecoderBackend, FinishReason, KVPoolFull, SamplingParams, StepEvent
from zoi.decoder.tokenizer import TextStream
from zoi.errors import InputError, ZoiError

log = logging.getLogger("zoi.decoder")


class GenerationError(ZoiError):
    """A request refused or failed. kind: "invalid" (the request can never run: the message says
    why and what to change), "backend" (the model failed), "unavailable" (shutting down)."""

    def __init__(self, kind: str, message: str, code: str | None = None):
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.code = code


class QueueFull(ZoiError):
    """The waiting queue is at its bound: answer 503 with Retry-After."""


class SchedulerClosed(ZoiError):
    """The scheduler is shutting down."""


@dataclass
class Queued:
    """The request passed the checks and waits for KV blocks and a batch slot."""


@dataclass
class Delta:
    text: str


@dataclass
class Finished:
    reason: str  # "stop", "length", "cancelled", "error"
    prompt_tokens: int
    completion_tokens: int
    error: GenerationError | None = None


# ---- requests and sinks -----------------------------------------------------------------------


class Generation:
    """One request in the scheduler. cancel() is safe from any thread."""

    def __init__(self, scheduler: Scheduler, gid: int, prompt_ids, params: SamplingParams, sink):
        self._sched = scheduler
        self.id = gid
        self.prompt_ids = np.ascontiguousarray(prompt_ids, dtype=np.int32)
        self.params = params
        self.sink = sink
        self.t_submit = time.perf_counter()
        self.t_first: float | None = None
        self.state = "new"  # new -> waiting -> running -> done (scheduler thread only)
        self.cancel_requested = False
        self.completion_tokens = 0
        self.token_ids: list[int] = []
        self.text: TextStream | None = None  # once checked (the scheduler's decode, end ids)

    def cancel(self) -> None:
        self._sched._request_cancel(self)


class AsyncSink:
    """Hands the scheduler's items to an asyncio queue on `loop` (call_soon_threadsafe)."""

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None):
        self.loop = loop or asyncio.get_running_loop()
        self.queue: asyncio.Queue = asyncio.Queue()

    def __call__(self, item) -> None:
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            pass

    async def get(self):
        return await self.queue.get()


class ListSink:
    """Collects items on the scheduler thread; wait() blocks until Finished (tests, sync callers)."""

    def __init__(self):
        self.items: list = []
        self.done = threading.Event()

    def __call__(self, item) -> None:
        self.items.append(item)
        if isinstance(item, Finished):
            self.done.set()

    def wait(self, timeout: float | None = 30.0) -> Finished:
        if not self.done.wait(timeout):
            raise TimeoutError("the generation did not finish in time")
        return self.items[-1]

    @property
    def text(self) -> str:
        return "".join(i.text for i in self.items if isinstance(i, Delta))


# ---- metrics ----------------------------------------------------------------------------------


class _NoMetrics:
    def __getattr__(self, name):
        return self

    def __call__(self, *a, **k):
        return self


class DecoderMetrics:
    """Prometheus metrics of the scheduler, registered in `registry` (the server's own), with the
    server's histogram buckets: `seconds_buckets` for latencies, `size_buckets` for batch sizes
    (zoi.serve.metrics; the decoder is a layer below it, so they are passed, with no fallback of
    its own: one set of buckets for every histogram of a server)."""

    def __init__(self, registry, seconds_buckets, size_buckets):
        from functools import partial

        from prometheus_client import Counter, Gauge, Histogram

        r = registry
        counter, gauge = partial(Counter, registry=r), partial(Gauge, registry=r)
        self.running = gauge("zoi_decoder_running", "sequences in the running batch")
        self.waiting = gauge("zoi_decoder_waiting", "requests waiting for KV blocks or a slot")
        self.kv_used = gauge("zoi_decoder_kv_blocks_used", "KV cache blocks in use")
        self.kv_total = gauge("zoi_decoder_kv_blocks_total", "KV cache blocks in the pool")
        self.tokens = counter("zoi_decoder_generated_tokens", "tokens generated")
        self.prompt_tokens = counter("zoi_decoder_prompt_tokens", "prompt tokens prefilled")
        self.tokens_per_s = gauge(
            "zoi_decoder_tokens_per_second", "tokens generated per second over the last 5 s of work"
        )
        seconds = partial(Histogram, buckets=tuple(seconds_buckets), registry=r)
        self.ttft = seconds(
            "zoi_decoder_time_to_first_token_seconds",
            "from submission to the first generated token",
        )
        self.step = seconds("zoi_decoder_step_duration_seconds", "one backend step")
        self.batch = Histogram(
            "zoi_decoder_step_batch_size",
            "sequences in one step",
            buckets=tuple(size_buckets),
            registry=r,
        )
        self.finished = counter("zoi_decoder_finished", "requests finished", ["reason"])


# ---- the scheduler ----------------------------------------------------------------------------


class Scheduler:
    """Continuous batching over `backend`; `decode(ids) -> str` detokenises (special ids skipped).
    At most `max_waiting` requests wait (submitted, not yet running); more raise QueueFull."""

    def __init__(
        self,
        backend: DecoderBackend,
        decode: Callable[[Sequence[int]], str],
        max_waiting: int = 256,
        metrics: DecoderMetrics | None = None,
        name: str = "zoi-decoder",
    ):
        if max_waiting < 1:
            raise ValueError(f"max_waiting must be >= 1, got {max_waiting}")
        self.backend = backend
        self.decode = decode
        self.max_waiting = int(max_waiting)
        self.metrics = metrics or _NoMetrics()
        self._cond = threading.Condition()
        self._incoming: list[Generation] = []  # guarded by _cond
        self._cancels: list[Generation] = []  # guarded by _cond
        self._queued = 0  # incoming + waiting, guarded by _cond
        self._closed = False
        self._waiting: collections.deque[Generation] = collections.deque()  # scheduler thread
        self._running: dict[int, Generation] = {}  # scheduler thread
        self._ids = itertools.count(1)
        self._rate: collections.deque = collections.deque()  # (time, tokens) of recent steps
        self.steps = 0
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    # ---- any thread ---------------------------------------------------------------------------
    @property
    def waiting(self) -> int:
        return self._queued

    def submit(self, prompt_ids, params: SamplingParams, sink) -> Generation:
        with self._cond:
            if self._closed:
                raise SchedulerClosed("the scheduler is shutting down")
            if self._queued >= self.max_waiting:
                raise QueueFull(
                    f"{self._queued} requests are waiting, the limit (--max-waiting-requests "
                    f"{self.max_waiting}); retry shortly"
                )
            g = Generation(self, next(self._ids), prompt_ids, params, sink)
            self._incoming.append(g)
            self._queued += 1
            self._cond.notify()
        return g

    def _request_cancel(self, g: Generation) -> None:
        with self._cond:
            if g.cancel_requested:
                return
            g.cancel_requested = True
            self._cancels.append(g)
            self._cond.notify()

    def close(self, timeout: float = 30.0) -> None:
        """Finish every request still here (error "unavailable") and stop the thread."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    # ---- the scheduler thread -----------------------------------------------------------------
    def _loop(self) -> None:
        try:
            info = self.backend.pool()
            self.metrics.kv_total.set(info.num_blocks)
        except Exception:  # pragma: no cover - a backend that cannot report its pool
            log.exception("decoder backend: pool() failed")
        while True:
            with self._cond:
                while not (
                    self._incoming
                    or self._cancels
                    or self._running
                    or self._waiting
                    or self._closed
                ):
                    self.metrics.tokens_per_s.set(0)
                    self._cond.wait()
                incoming, self._incoming = self._incoming, []
                cancels, self._cancels = self._cancels, []
                closed = self._closed
            for g in incoming:
                self._intake(g)
            for g in cancels:
                self._drop(g, "cancelled", None)
            if closed:
                self._shutdown()
                return
            self._admit()
            if self._running:
                self._step()
            self._gauges()

    def _gauges(self) -> None:
        m = self.metrics
        m.running.set(len(self._running))
        m.waiting.set(len(self._waiting))
        try:
            info = self.backend.pool()
            m.kv_used.set(info.num_blocks - info.free_blocks)
        except Exception:  # pragma: no cover
            pass

    def _dequeue(self, g: Generation) -> None:
        with self._cond:
            self._queued -= 1

    def _finish(self, g: Generation, reason: str, error: GenerationError | None) -> None:
        if g.state == "done":
            return
        if g.state in ("new", "waiting"):
            self._dequeue(g)
        g.state = "done"
        self.metrics.finished.labels(reason).inc()
        g.sink(Finished(reason, len(g.prompt_ids), g.completion_tokens, error))

    def _refuse(self, g: Generation, message: str, code: str | None = None) -> None:
        self._finish(g, "error", GenerationError("invalid", message, code))

    def _intake(self, g: Generation) -> None:
        if g.cancel_requested:
            self._finish(g, "cancelled", None)
            return
        b = self.backend
        n, p = len(g.prompt_ids), g.params
        try:
            if n == 0:
                return self._refuse(g, "the prompt is empty: send at least one token")
            vocab = int(b.spec.vocab_size)
            if int(g.prompt_ids.min()) < 0 or int(g.prompt_ids.max()) >= vocab:
                return self._refuse(g, f"the prompt holds token ids outside [0, {vocab})")
            if p.max_new_tokens < 1:
                return self._refuse(g, "max_tokens must be at least 1")
            if n + p.max_new_tokens > b.max_seq_len:
                return self._refuse(
                    g,
                    f"this model's context is {b.max_seq_len} tokens: the prompt has {n} and "
                    f"max_tokens asks for {p.max_new_tokens} more; shorten the prompt or lower "
                    "max_tokens",
                    "context_length_exceeded",
                )
            info = b.pool()
            need = b.blocks_needed(n, p.max_new_tokens)
            if need > info.num_blocks:
                return self._refuse(
                    g,
                    f"the request needs {need} KV blocks of {info.block_size} tokens ({n} prompt "
                    f"+ {p.max_new_tokens} new tokens), the whole pool has {info.num_blocks}; "
                    "lower max_tokens or shorten the prompt",
                    "context_length_exceeded",
                )
        except Exception as e:  # pragma: no cover - a backend failing on a query
            log.exception("decoder backend failed while checking a request")
            self._finish(g, "error", GenerationError("backend", f"the backend failed: {e}"))
            return
        g.state = "waiting"
        ends = p.stop_token_ids + (() if p.ignore_eos else tuple(b.spec.eos_token_ids))
        g.text = TextStream(self.decode, g.prompt_ids.tolist(), p.stop, ends)
        self._waiting.append(g)
        g.sink(Queued())

    def _drop(self, g: Generation, reason: str, error: GenerationError | None) -> None:
        if g.state == "running":
            self._running.pop(g.id, None)
            try:
                self.backend.cancel(g.id)
            except Exception:  # pragma: no cover
                log.exception("decoder backend: cancel(%d) failed", g.id)
        elif g.state == "waiting":
            try:
                self._waiting.remove(g)
            except ValueError:  # pragma: no cover
                pass
        self._finish(g, reason, error)

    def _admit(self) -> None:
        b = self.backend
        while self._waiting:
            g = self._waiting[0]
            info = b.pool()
            if len(self._running) >= info.max_batch:
                return
            need = b.blocks_needed(len(g.prompt_ids), g.params.max_new_tokens)
            if need > info.free_blocks and self._running:
                return  # wait for blocks; the head keeps its place
            try:
                b.add(g.id, g.prompt_ids, g.params)
            except KVPoolFull as e:
                if self._running:
                    return
                self._waiting.popleft()
                self._refuse(g, f"the KV pool cannot hold this request even when empty: {e}")
                continue
            except InputError as e:
                self._waiting.popleft()
                self._refuse(g, str(e))
                continue
            except Exception as e:
                log.exception("decoder backend: add failed")
                self._waiting.popleft()
                self._finish(g, "error", GenerationError("backend", f"the backend failed: {e}"))
                continue
            self._waiting.popleft()
            self._dequeue(g)
            g.state = "running"
            self._running[g.id] = g
            self.metrics.prompt_tokens.inc(len(g.prompt_ids))

    def _step(self) -> None:
        t0 = time.perf_counter()
        n_running = len(self._running)
        try:
            events: list[StepEvent] = self.backend.step()
        except Exception as e:
            log.exception(
                "decoder backend: step failed; failing the %d running requests", n_running
            )
            err = GenerationError("backend", f"the model failed during generation: {e}")
            for g in list(self._running.values()):
                self._drop(g, "error", err)
            return
        t1 = time.perf_counter()
        self.steps += 1
        self.metrics.step.observe(t1 - t0)
        self.metrics.batch.observe(n_running)
        ntok = 0
        for ev in events:
            g = self._running.get(ev.seq_id)
            if g is None:
                continue
            ntok += 1
            self._on_token(g, ev, t1)
        self.metrics.tokens.inc(ntok)
        self._rate.append((t1, ntok))
        while self._rate and self._rate[0][0] < t1 - 5.0:
            self._rate.popleft()
        span = t1 - self._rate[0][0] if len(self._rate) > 1 else t1 - t0
        if span > 0:
            total = sum(k for _, k in self._rate) - (self._rate[0][1] if len(self._rate) > 1 else 0)
            self.metrics.tokens_per_s.set(total / span)

    def _on_token(self, g: Generation, ev: StepEvent, now: float) -> None:
        if g.t_first is None:
            g.t_first = now
            self.metrics.ttft.observe(now - g.t_submit)
        g.completion_tokens += 1
        g.token_ids.append(int(ev.token_id))
        text = g.text.push(ev.token_id, ev.finish)
        if text:
            g.sink(Delta(text))
        if g.text.stopped:
            self._drop(g, FinishReason.STOP.value, None)  # the backend frees its blocks now
        elif ev.finish is not None:
            self._running.pop(g.id, None)  # the backend has freed its blocks
            reason = ev.finish.value if isinstance(ev.finish, FinishReason) else str(ev.finish)
            self._finish(g, reason, None)

    def _shutdown(self) -> None:
        err = GenerationError("unavailable", "the server is shutting down")
        for g in list(self._running.values()):
            self._drop(g, "error", err)
        for g in list(self._waiting):
            self._drop(g, "error", err)
        with self._cond:
            rest, self._incoming = self._incoming, []
        for g in rest:
            self._finish(g, "error", err)
        self._gauges()
