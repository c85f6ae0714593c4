"""CudaBackend: Triton kernels, one weight buffer, one activation arena, one CUDA graph per
token-count bucket, and a per-call path through the CUDA driver API only.

The parts (each its own module):

* ``options``: ``CudaOptions``, every switch, passed in (no environment reads here);
* ``plan``: the launch list of the IR, realising its fusion / int8-copy decisions
  (``zoi.graph.fusion``; what it does not realise: the plan's "fallbacks");
* ``weights``: packing into the one weight buffer; ``arena``: the activation arena;
* ``steps``: the per-op launch closures of a bucket; ``persistent``: the one-launch forward;
* ``capture``: CUDA graph capture and timing; ``callpath``: host staging + driver calls.

Compile time (``__init__``), torch and triton are tools: torch allocates the two device
buffers (and gives Triton its stream), triton compiles the kernels, the forward of each
bucket is run once (warm-up) and captured with ``cuStreamBeginCapture`` on our own stream
into a graph, instantiated with ``cuGraphInstantiate``.

``submit`` / ``wait`` (submit.py): the same per call, asynchronous, two tickets in flight
(double-buffered pinned staging, an event per ticket).

Per call (``run``): numpy writes ids / positions / cu_seqlens and a 4-int header into
pinned staging; ``cuMemcpyHtoDAsync``; ``cuGraphLaunch``; ``cuMemcpyDtoHAsync`` of the
pooled [B, out_dim] fp32; ``cuStreamSynchronize``. Nothing else, no allocation; a lock makes
concurrent callers safe.

``interpret=True`` (or no GPU with TRITON_INTERPRET=1) runs the same launch list eagerly on
torch CPU tensors through the Triton interpreter: the CI test of everything but the graph.
"""

from __future__ import annotations

import logging
import threading

import numpy as np

from zoi.backends.cuda.arena import Arena
from zoi.backends.cuda.callpath import DriverCall, HostStaging
from zoi.backends.cuda.device import init_device, on_device
from zoi.backends.cuda.megakernel import megakernel_options, megakernel_steps
from zoi.backends.cuda.options import PERSISTENT_MAX_TOKENS, CudaOptions
from zoi.backends.cuda.outputs import memory_report, run_outputs
from zoi.backends.cuda.plan import Launch, plan_launches, require_fp8
from zoi.backends.cuda.prebuild import mark_built, maybe_prebuild
from zoi.backends.cuda.steps import per_op_steps
from zoi.backends.cuda.submit import AsyncSlots
from zoi.backends.cuda.weights import pack_weights
from zoi.errors import BackendUnavailableError, InputError

log = logging.getLogger("zoi")

__all__ = ["CudaBackend", "CudaOptions", "Launch", "default_buckets"]


def default_buckets(max_tokens: int) -> list[int]:
    b, out = 16, []
    while b < max_tokens:
        out.append(b)
        b *= 2
    out.append(max_tokens)
    return out


class CudaBackend:
    name = "cuda"

    def __init__(
        self,
        model,
        buckets: list[int] | None = None,
        interpret: bool | None = None,
        pdl: bool | None = None,
        persistent_max: int | None = None,
        options: CudaOptions | None = None,
    ):
        """options: CudaOptions (defaults: the H200's choices); pdl and persistent_max
        override its fields of the same name. options.device_index: the GPU
        everything is built on (its primary context; None: the current device)."""
        with on_device(options):
            self._construct(model, buckets, interpret, pdl, persistent_max, options)

    def _construct(self, model, buckets, interpret, pdl, persistent_max, options):
        self.model = model
        self.spec = model.spec
        self.precision = model.precision
        if self.precision not in ("int8", "fp16", "fp32", "fp8"):
            raise InputError(f"unknown precision {self.precision!r}")
        if self.precision == "fp32":
            log.warning(
                "zoi: device='cuda' computes precision='fp32' models in fp16 (fp16 weights and "
                "activations, fp32 accumulation); use precision='fp16' or 'int8' to say so"
            )
        opts = (options or CudaOptions()).replace(pdl=pdl, persistent_max=persistent_max)
        self.opts = opts
        self.max_tokens = int(model.plan.max_tokens)
        self.max_batch = int(min(model.plan.max_batch, self.max_tokens))
        self._lock = threading.Lock()
        self._init_device(interpret)
        if self.precision == "fp8" and not self.eager:
            require_fp8(self.capability, self.device_name)
        self.pdl = (
            (not self.eager and self.capability >= (9, 0))
            if opts.pdl is None
            else bool(opts.pdl and not self.eager)
        )
        self.plan = plan_launches(model)
        # the one-launch forward needs co-resident programs and a spinning grid barrier: GPU
        # only (the interpreter runs programs one after another); tests may force it
        pmax = (
            (0 if self.eager else PERSISTENT_MAX_TOKENS)
            if opts.persistent_max is None
            else opts.persistent_max
        )
        self.persistent_max = 0 if opts.persistent == "off" else int(pmax)
        self.persistent_choice = opts.persistent  # "time": build both, keep the faster
        megakernel_options(self, opts)  # the CUDA C++ kernel's buckets, where it is on
        self.bucket_paths: dict[int, dict] = {}
        self._pplans: dict[int, object] = {}  # bucket -> PersistentPlan (its barrier flag)
        self.launches = self.plan["launches"]
        plans = [self.plan]
        self.wbuf, self.w, self.weights_bytes = pack_weights(model, plans, self.torch, self.dev)
        self.mem = Arena(
            plans, self.torch, self.dev, self.max_tokens, self.max_batch, self.spec.out_dim
        )
        self.arena, self.arena_bytes, self.act_bytes = (
            self.mem.buf,
            self.mem.bytes,
            self.mem.act_bytes,
        )
        self.amax_region, self.tcum = self.mem.amax_region, self.mem.tcum
        self.d_in, self.d_out, self.hdr_ints = self.mem.d_in, self.mem.d_out, self.mem.hdr_ints
        self.staging = HostStaging(
            None if self.eager else self.drv, self.mem.in_ints, self.hdr_ints, self.max_batch,
            self.spec.out_dim,
        )  # fmt: skip
        self.h_in, self.h_out = self.staging.h_in, self.staging.h_out
        if not self.eager:
            self.call = DriverCall(self.drv, self.ctx, self.stream, self.d_in, self.d_out)
        self.slots = AsyncSlots(self)  # submit / wait: two tickets in flight
        self.buckets = sorted(
            {min(int(b), self.max_tokens) for b in (buckets or default_buckets(self.max_tokens))}
        )
        self._graphs: dict[int, tuple] = {}
        self._steps: dict[int, list] = {}
        self.prebuild_info = maybe_prebuild(self)  # a cold build: kernels compiled in parallel
        for tb in self.buckets:
            try:
                self._build_bucket(tb)
            except Exception as e:  # noqa: BLE001 - PDL in graph capture needs a recent driver
                if not (self.pdl and tb <= opts.pdl_max_tokens):
                    raise
                log.warning(
                    "zoi: programmatic dependent launch failed in capture (%s); without it", e
                )
                self.pdl = False
                self._build_bucket(tb)
        mark_built(self)

    # ------------------------------------------------------------------ device
    def _init_device(self, interpret):
        init_device(self, interpret, self.opts.device_index)
        if not self.eager:
            self._cu = self.cu
            self._free0 = self.drv.mem_info()[0]
            self._reserved0 = self.torch.cuda.memory_reserved(self.device_index)

    # ------------------------------------------------------------------ buckets
    def plan_for(self, tb: int) -> dict:
        """The launch plan of bucket tb's per-op forward (one for every bucket)."""
        return self.plan

    def _act(self, plan: dict, name: str, rows: int):
        return self.mem.act(plan, name, rows)

    def _steps_for(self, tb: int, persistent: bool | None = None) -> list:
        """The launch list of one bucket: closures over fixed device views (captured as is).
        persistent: the one-launch forward (default: for buckets <= persistent_max)."""
        if persistent is None:
            persistent = tb <= self.persistent_max
        if persistent and self.opts.megakernel != "off" and not self.eager:
            return megakernel_steps(self, tb)  # the per-op steps where unsupported
        if persistent:
            from zoi.backends.cuda.persistent import PersistentPlan, PersistentUnsupported

            try:
                plan = PersistentPlan(self, tb)
                self._pplans[tb] = plan
                return plan.steps()
            except PersistentUnsupported as e:
                log.info("zoi: bucket %d keeps the per-op kernels (%s)", tb, e)
                self.persistent_max = 0
        pdl = self.pdl and tb <= self.opts.pdl_max_tokens
        return per_op_steps(self.plan_for(tb), self.mem, self.w, self.spec, tb, pdl)

    def _build_bucket(self, tb: int):
        """Compile, warm up and capture the forward of bucket tb. For small buckets both the
        persistent one-launch forward and the per-op graph are built and timed on this GPU
        (back-to-back launches, alternating rounds); the faster is kept. Which one won, with
        both times, is in ``memory()["bucket_paths"]``."""
        want_p = tb <= self.persistent_max
        if not want_p or self.eager or self.persistent_choice == "force":
            steps = self._steps_for(tb)
            self._steps[tb] = steps
            self._graphs[tb] = self._capture(tb, steps)
            path = "persistent" if tb <= self.persistent_max else "per-op"
            self.bucket_paths[tb] = {"path": path}
            return
        from zoi.backends.cuda import pathcache
        from zoi.backends.cuda.capture import pick_faster

        key = pathcache.cache_key(
            self.device_name, self.capability, self.precision, self.spec, self.opts, tb
        )
        known = pathcache.lookup(self.opts.path_cache, key)
        if known is not None:  # measured before on this GPU / software / shape: the winner only
            steps = self._steps_for(tb, persistent=known == "persistent")
            self._steps[tb] = steps
            self._graphs[tb] = self._capture(tb, steps)
            path = "persistent" if tb in self._pplans else "per-op"
            self.bucket_paths[tb] = {"path": path, "cached": True}
            return
        built, steps = {}, {}
        for persistent in (True, False):
            steps[persistent] = self._steps_for(tb, persistent=persistent)
            built[persistent] = self._capture(tb, steps[persistent])
            if persistent and tb > self.persistent_max:  # unsupported model: per-op only
                built = {False: built.pop(True)}
                steps = {False: steps.pop(True)}
                break
        keep, us = pick_faster(self.drv, self.stream, built)
        if not keep:
            self._pplans.pop(tb, None)
        self._steps[tb], self._graphs[tb] = steps[keep], built[keep]
        self.bucket_paths[tb] = {
            "path": "persistent" if keep else "per-op",
            **{("persistent_us" if m else "per_op_us"): round(v, 2) for m, v in us.items()},
        }
        if len(us) == 2:  # both were timed: remember the answer
            pathcache.store(
                self.opts.path_cache, key, "persistent" if keep else "per-op",
                {("persistent" if m else "per-op"): round(v, 2) for m, v in us.items()},
            )  # fmt: skip
        if not keep and tb <= self.persistent_max:
            log.info("zoi: bucket %d: per-op graph faster than the persistent forward %s", tb, us)

    def _stage(self, ids, positions, cu_seqlens, normalize, tb) -> tuple[int, int]:
        return self.staging.stage(ids, positions, cu_seqlens, normalize, tb)

    def _stage_random(self, tb: int, seed: int, normalize: bool = False) -> int:
        """Stage one sequence of tb random tokens (host staging); returns the ints to copy."""
        rng = np.random.default_rng(seed)
        ids = rng.integers(0, int(self.spec.vocab_size), tb).astype(np.int32)
        P = int(self.model.position_rows())
        pos = (np.arange(tb) % P).astype(np.int32)
        # sequences of at most the model's positions (the RoPE / bias tables have P rows)
        n = max(P, -(-tb // self.max_batch))
        cu = np.unique(np.r_[np.arange(0, tb, n), tb]).astype(np.int32)
        return self._stage(ids, pos, cu, normalize, tb)[0]

    def _capture(self, tb: int, steps: list):
        """Warm up (compiles every kernel of the bucket) and capture one bucket's steps."""
        n = self._stage_random(tb, seed=tb)  # warm-up input: one sequence of tb tokens
        if self.eager:
            return None
        from zoi.backends.cuda.capture import capture

        cuda = self._cu
        self.drv.check(
            cuda.cuMemcpyHtoDAsync(self.call.d_in_ptr, self.staging.p_in.ptr, n * 4, self.stream)
        )
        return capture(self.drv, self.torch, self.stream, self.tstream, steps)

    # ------------------------------------------------------------------ run
    def _bucket(self, ids, cu_seqlens) -> tuple[np.ndarray, int]:
        ids = np.asarray(ids, np.int32)
        T, B = int(ids.shape[0]), int(len(cu_seqlens) - 1)
        if T > self.max_tokens or B > self.max_batch or T < 1 or B < 1:
            raise InputError(
                f"batch of {T} tokens / {B} sequences exceeds this engine "
                f"(max_tokens {self.max_tokens}, max_batch {self.max_batch})"
            )
        return ids, next(b for b in self.buckets if b >= T)

    def run(self, ids, positions, cu_seqlens, normalize: bool) -> np.ndarray:
        ids, tb = self._bucket(ids, cu_seqlens)
        with self._lock:
            n, B = self._stage(ids, positions, cu_seqlens, normalize, tb)
            plan = self._pplans.get(tb)
            if self.eager:
                self.d_in[:n] = self.torch.from_numpy(self.h_in[:n].copy())
                for s in self._steps[tb]:
                    s()
                if plan is not None and plan.barrier_timed_out():
                    self._barrier_failed(tb)
                return self.d_out[:B].numpy().copy()
            flag = plan.bar[1:] if plan is not None else None
            if self.call.run(self.staging, self._graphs[tb][1], n, B, flag):
                self._barrier_failed(tb)
            return self.h_out[:B].copy()

    def run_into(self, ids, positions, cu_seqlens, normalize: bool, out: np.ndarray) -> np.ndarray:
        out[: len(cu_seqlens) - 1] = self.run(ids, positions, cu_seqlens, normalize)
        return out

    def run_outputs(self, ids, positions, cu_seqlens, types=None, taps=()) -> dict:
        """Heads (zoi.backends.base.HeadRunner): the graph's output and taps (outputs.py)."""
        return run_outputs(self, ids, positions, cu_seqlens, types, taps)

    def submit(self, ids, positions, cu_seqlens, normalize: bool, out: np.ndarray) -> object:
        """Start a forward into `out` and return its ticket at once (submit.py): the inputs
        are staged before it returns; at most two tickets outstanding."""
        return self.slots.submit(ids, positions, cu_seqlens, normalize, out)

    def wait(self, ticket) -> np.ndarray:
        """Block until the ticket's forward has written its `out`; returns `out`. A void
        result (barrier timeout, NaN / Inf) raises here."""
        return self.slots.wait(ticket)

    def _barrier_failed(self, tb: int):
        """A grid barrier of the persistent forward gave up waiting (its programs were not all
        resident: the GPU is shared with long-running work): the result is void. The flag is
        cleared (every program still arrived at every barrier, so the counter stays aligned
        and the next call is sound) and the call fails loudly rather than return garbage."""
        plan = self._pplans[tb]
        plan.bar[1:].zero_()
        if not self.eager:
            self.torch.cuda.synchronize(self.dev)
            self.staging.h_flag[0] = 0
        if hasattr(plan, "error_message"):  # the megakernel: a dependency wait gave up
            raise BackendUnavailableError(plan.error_message())
        raise BackendUnavailableError(
            f"cuda: the one-launch forward of bucket {tb} timed out in a grid barrier (its "
            "programs were not all resident: is the GPU shared with long-running work?); this "
            "call's result was discarded. Retry, or build with "
            "CudaOptions(persistent='off') (ZOI_PERSISTENT=0) for per-op graphs"
        )

    def memory(self) -> dict:
        return memory_report(self)  # outputs.py

    def __del__(self):
        try:
            if not getattr(self, "eager", True):
                from zoi.backends.cuda.capture import destroy

                for g in self._graphs.values():
                    destroy(self.drv, g)
                self.staging.free()
                self.slots.free()
        except Exception:
            pass
