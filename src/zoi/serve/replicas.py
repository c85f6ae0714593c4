"""Several engines behind one server: one engine per GPU (`--gpus`) or per CPU replica
(`--replicas`), the dynamic batcher spreading its token-budget batches over them.

The dispatcher knows nothing of devices: it gets one `run(seqs) -> rows` callable per engine,
so the same code serves `zoi serve --device cuda --gpus 0,1` and `zoi serve --device cpu
--replicas 2`, and the CPU tests cover what the GPUs run.

- One queue, one worker thread per engine ("lane"). Requests queue FIFO as with one engine;
  a lane takes the next batch (by `max_batch_tokens` / `max_batch_requests`) only when its
  engine is idle, so no engine holds a backlog while another has nothing to do. When work
  arrives and several engines are idle, the batch goes to the idle engine with the least
  queued tokens (then the fewest tokens computed so far, then the lowest index); when more
  work than one batch is queued, the next idle engine is woken too.
- Rows come back to each request in its order, even when its sequences were split over
  batches on different engines.
- An engine call that fails is retried request by request on the same engine (as with one
  engine): only the requests that fail alone get an error, which names the engine
  (`cuda:1 (engine 1 of 2): ...`); the other engines and the server carry on. An engine
  whose calls keep failing rests a little (50 ms, doubling up to 2 s) before it takes the
  next batch, so a broken engine does not swallow the queue while healthy ones are idle.
- `close()` answers everything queued (every lane helps drain), then stops the lanes.

`plan_engines` / `open_engines` turn `--device`, `--gpus` and `--replicas` into engines:
the model is compiled or loaded once, then bound to each further device (one CUDA context,
weight copy and CUDA graph set per GPU; CPU replicas of one thread each, which run
concurrently: a one-thread engine call takes no lock of the shared thread pool).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable

import numpy as np

from zoi.serve.batcher import Batcher, Job

log = logging.getLogger("zoi.serve")

IDLE, WOKEN, BUSY, RESTING, STOPPED = "idle", "woken", "busy", "resting", "stopped"
REST_FIRST_S = 0.05  # a failing engine's first rest; doubles per consecutive failure
REST_MAX_S = 2.0


class EngineError(RuntimeError):
    """An engine call failed; the message names the engine (device, index)."""

    def __init__(self, lane: Lane, total: int, cause: BaseException):
        self.engine = lane.index
        self.device = lane.name
        self.cause = cause
        super().__init__(f"{lane.name} (engine {lane.index} of {total}): {cause}")


class Lane:
    """One engine: its run callable, its worker thread's state and its figures."""

    def __init__(self, index: int, name: str, run: Callable[[list], np.ndarray], cond):
        self.index = index
        self.name = name
        self.run = run
        self.cond = cond  # shares the batcher's lock
        self.state = IDLE
        self.thread: threading.Thread | None = None
        self.queued_tokens = 0  # tokens of the batch it holds (0 when idle)
        self.batches = 0
        self.sequences = 0
        self.tokens = 0
        self.failures = 0  # engine calls that raised (batches and retries)
        self.consecutive_failures = 0
        self.busy_s = 0.0
        self.last_error: str | None = None

    def info(self) -> dict:
        return {
            "engine": self.index,
            "device": self.name,
            "state": self.state,
            "batches": self.batches,
            "sequences": self.sequences,
            "tokens": self.tokens,
            "failures": self.failures,
            "consecutive_failures": self.consecutive_failures,
            "busy_seconds": round(self.busy_s, 6),
            "last_error": self.last_error,
        }


class ReplicaBatcher(Batcher):
    """The dynamic batcher over several engines: `runs[i]` computes the rows of a batch on
    engine i. Same interface as Batcher (submit / close)."""

    def __init__(
        self,
        runs: list[Callable[[list], np.ndarray]],
        hidden: int,
        max_batch_tokens: int,
        max_batch_requests: int,
        max_queue_delay_us: int = 0,
        metrics=None,
        names: list[str] | None = None,
        name: str = "zoi-engine",
    ):
        if not runs:
            raise ValueError("ReplicaBatcher needs at least one engine")
        names = list(names) if names is not None else [f"engine{i}" for i in range(len(runs))]
        if len(names) != len(runs):
            raise ValueError(f"{len(runs)} engines but {len(names)} names")
        self._runs, self._names = list(runs), names
        if metrics is not None:
            metrics.engine_metrics()
        super().__init__(
            runs[0], hidden, max_batch_tokens, max_batch_requests, max_queue_delay_us, metrics, name
        )

    # ---- threads -------------------------------------------------------------------------
    def _start(self, name: str) -> None:
        lock = threading.Lock()
        self._cond = threading.Condition(lock)  # nobody has used the base's one yet
        self.lanes = [
            Lane(i, n, r, threading.Condition(lock))
            for i, (r, n) in enumerate(zip(self._runs, self._names, strict=True))
        ]
        for ln in self.lanes:
            ln.thread = threading.Thread(
                target=self._lane_worker, args=(ln,), name=f"{name}-{ln.index}", daemon=True
            )
            ln.thread.start()

    def close(self, timeout: float | None = None) -> None:
        """Stop taking jobs, answer everything queued (all engines help), stop the lanes."""
        with self._cond:
            self._closing = True
            for ln in self.lanes:
                ln.cond.notify_all()
        t_end = None if timeout is None else time.monotonic() + timeout
        for ln in self.lanes:
            left = None if t_end is None else max(0.0, t_end - time.monotonic())
            ln.thread.join(left)

    def engines_info(self) -> list[dict]:
        with self._cond:
            return [ln.info() for ln in self.lanes]

    # ---- dispatch (all under the lock) -------------------------------------------------------
    def _pick_idle(self) -> Lane | None:
        idle = [ln for ln in self.lanes if ln.state == IDLE]
        if not idle:
            return None
        return min(
            idle,
            key=lambda ln: (ln.consecutive_failures > 0, ln.queued_tokens, ln.tokens, ln.index),
        )

    def _wake(self) -> None:
        for ln in self.lanes:
            if ln.state == WOKEN:  # it takes the queue head (and wakes another if more is left)
                ln.cond.notify()
                return
        ln = self._pick_idle()
        if ln is not None:
            ln.state = WOKEN
            ln.cond.notify()

    def _lane_wait(self, ln: Lane) -> bool:
        """Block until this lane should take a batch (True), or the batcher is closed and
        drained (False)."""
        while True:
            self._drop_cancelled_head()
            if self._queue:
                if self._closing or ln.state in (WOKEN, BUSY):
                    break
                # an idle lane with work queued: a spurious wake-up, or nobody claimed it
                if not any(x.state == WOKEN for x in self.lanes):
                    best = self._pick_idle()
                    if best is ln:
                        break
                    if best is not None:
                        best.state = WOKEN
                        best.cond.notify()
            elif self._closing:
                return False
            else:
                ln.state = IDLE  # nothing queued (another lane took it): wait to be woken
            ln.cond.wait()
        ln.state = WOKEN
        self._fill_wait(ln.cond)
        return True

    def _rest(self, ln: Lane) -> None:
        """After consecutive failures: wait (interruptible by close) before taking more."""
        k = ln.consecutive_failures
        if k <= 0:
            return
        until = time.monotonic() + min(REST_FIRST_S * 2 ** (k - 1), REST_MAX_S)
        with self._cond:
            ln.state = RESTING
            while not self._closing:
                left = until - time.monotonic()
                if left <= 0:
                    break
                ln.cond.wait(left)
            ln.state = BUSY  # back: takes the queue head directly if there is one

    def _lane_worker(self, ln: Lane) -> None:
        while True:
            with self._cond:
                if not self._lane_wait(ln):
                    ln.state = STOPPED
                    return
                pieces = self._take()
                ln.state = BUSY
                ln.queued_tokens = sum(len(s) for _, _, _, part in pieces for s in part)
                if self._queue and not any(x.state == WOKEN for x in self.lanes):
                    nxt = self._pick_idle()  # more than one batch queued: wake another engine
                    if nxt is not None:
                        nxt.state = WOKEN
                        nxt.cond.notify()
            self._run_guarded(pieces, lambda p: self._run_lane(ln, p), f" on {ln.name}")
            with self._cond:
                ln.queued_tokens = 0
            self._rest(ln)

    # ---- running a batch on one engine -------------------------------------------------------
    def _lane_metrics(self, ln: Lane, seqs, ntok: int, dt: float, failed: bool) -> None:
        m = self.metrics
        if m is None:
            return
        lab = (str(ln.index), ln.name)
        m.engine_batches.labels(*lab).inc()
        m.engine_inference_duration.labels(*lab).observe(dt)
        if failed:
            m.engine_failures.labels(*lab).inc()
        else:
            m.engine_sequences.labels(*lab).inc(len(seqs))
            m.engine_tokens.labels(*lab).inc(ntok)

    def _call(self, ln: Lane, seqs: list) -> np.ndarray:
        """One engine call, timed and counted; a failure comes back as EngineError."""
        ntok = int(sum(len(s) for s in seqs))
        t0 = time.perf_counter()
        if self.metrics is not None:
            self.metrics.engine_busy.labels(str(ln.index), ln.name).set(1)
        try:
            out = ln.run(seqs)
            if len(out) != len(seqs):
                raise RuntimeError(f"the engine returned {len(out)} rows for {len(seqs)} sequences")
        except Exception as e:
            dt = time.perf_counter() - t0
            with self._cond:
                ln.failures += 1
                ln.busy_s += dt
                ln.last_error = f"{type(e).__name__}: {e}"
            self._lane_metrics(ln, seqs, ntok, dt, True)
            raise EngineError(ln, len(self.lanes), e) from e
        finally:
            if self.metrics is not None:
                self.metrics.engine_busy.labels(str(ln.index), ln.name).set(0)
        dt = time.perf_counter() - t0
        with self._cond:
            ln.batches += 1
            ln.sequences += len(seqs)
            ln.tokens += ntok
            ln.busy_s += dt
        self._lane_metrics(ln, seqs, ntok, dt, False)
        return out

    def _run_lane(self, ln: Lane, pieces: list[tuple[Job, int, int, list]]) -> None:
        ok = self._run_pieces(pieces, lambda seqs: self._call(ln, seqs), EngineError)
        with self._cond:  # the engine itself is suspect when nothing ran on it
            ln.consecutive_failures = 0 if ok is None or ok else ln.consecutive_failures + 1


# ---- engines from the options ------------------------------------------------------------------
def device_label(engine) -> str:
    """cpu, cuda:1 ...: the engine's device with its index when it has one."""
    idx = getattr(engine, "device_index", None)
    return f"{engine.device}:{idx}" if idx is not None else str(engine.device)


def engine_names(engines: list) -> list[str]:
    """Each engine's name in /info and /metrics: cuda:0, cuda:1 ...; CPU replicas (no device
    index) cpu:0, cpu:1 ... by their place in the list."""
    if len(engines) == 1:
        return [device_label(engines[0])]
    return [
        device_label(e) if getattr(e, "device_index", None) is not None else f"{e.device}:{i}"
        for i, e in enumerate(engines)
    ]


@dataclasses.dataclass(frozen=True)
class EnginePlan:
    devices: tuple[str, ...]  # what each engine is built on: "cuda:0", "cpu", ...
    threads: int | None = None  # CPU engine threads (None: the process pool's)

    def __len__(self) -> int:
        return len(self.devices)


def plan_engines(config, gpu_count: int | None = None, cuda_usable=None) -> EnginePlan | None:
    """The engines `--device`, `--gpus` and `--replicas` ask for; None: the one engine of
    `--device`, as without those options. Clear errors for every bad combination.

    gpu_count / cuda_usable: injected by the tests (default: what this machine has)."""
    from zoi.backends.devices import ALL, parse_gpus, resolve_gpus

    gpus_opt = getattr(config, "gpus", None)
    replicas = getattr(config, "replicas", None)
    placement = parse_gpus(gpus_opt) if gpus_opt is not None else None
    device = config.device
    if replicas is not None and replicas < 1:
        raise ValueError(f"--replicas must be >= 1, got {replicas}")
    if placement is not None:
        if replicas is not None:
            raise ValueError(
                f"--replicas {replicas} with --gpus {gpus_opt}: --gpus puts one engine on each "
                "GPU; --replicas is for CPU engines (leave one of them out)"
            )
        if device not in ("cuda", "auto"):
            raise ValueError(
                f"--gpus {gpus_opt} puts engines on GPUs, but --device is {device!r}: add "
                "--device cuda"
            )
        if cuda_usable is None:
            from zoi.backends import cuda_status

            cuda_usable = cuda_status()
        ok, why = cuda_usable
        if not ok:
            raise ValueError(
                f"--gpus {gpus_opt}: CUDA is not usable here ({why}); serve on the CPU "
                "(--device cpu, --replicas N) or run where the GPUs are"
            )
        if gpu_count is None:
            from zoi.backends.devices import visible_gpu_count

            gpu_count = visible_gpu_count()
        try:
            ids = resolve_gpus(placement, gpu_count)
        except ValueError as e:
            raise ValueError(
                f"{e}; CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '(unset)')}"
            ) from None
        if placement == ALL and not ids:  # pragma: no cover - resolve_gpus raises first
            raise ValueError("--gpus all: no GPU visible")
        return EnginePlan(tuple(f"cuda:{i}" for i in ids))
    if replicas is not None:
        if device not in ("cpu", "reference", "auto"):
            raise ValueError(
                f"--replicas {replicas} is for CPU engines; on GPUs use --gpus (one engine per "
                f"GPU), e.g. --device cuda --gpus all"
            )
        dev = "cpu" if device == "auto" else device
        return EnginePlan((dev,) * replicas, threads=1 if dev == "cpu" else None)
    return None


def replicate(engine, device: str, threads: int | None = None):
    """The same compiled model (host weights, tokenizer) bound to another device: a new
    backend (its own weights on that GPU, arena, CUDA graphs; or CPU engine threads)."""
    from zoi.backends import split_device
    from zoi.engine import Engine

    kind, index = split_device(device)
    return Engine(
        engine.model, engine.tokenizer, kind, device_index=index, threads=threads,
        cuda_options=getattr(engine, "cuda_options", None),
    )  # fmt: skip


def open_engines(model: str | None, config, plan: EnginePlan, open_one) -> list:
    """Compile or load the model once (`open_one(model, config)` with the first device),
    then bind it to every further device of the plan. Engines in plan order."""
    t0 = time.perf_counter()
    first_dev = plan.devices[0]
    if plan.threads is not None:  # CPU replicas: built from the model with their own threads
        base = open_one(model, config.replace(device=first_dev))
        engines = [replicate(base, d, plan.threads) for d in plan.devices]
        del base
    else:
        first = open_one(model, config.replace(device=first_dev))
        engines = [first] + [replicate(first, d) for d in plan.devices[1:]]
    log.info(
        "zoi serve: %d engines (%s) in %.1f s",
        len(engines),
        ", ".join(engine_names(engines)),
        time.perf_counter() - t0,
    )
    return engines
