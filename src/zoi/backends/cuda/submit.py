"""Asynchronous submit / wait (the Backend protocol's pipelining seam): the engine
tokenises and packs chunk i+1 while the GPU runs chunk i.

Two ticket slots, each with its own pinned host staging (inputs and output) and its own
event: ``submit`` copies the caller's arrays into the free slot's staging (so the caller may
reuse them at once), enqueues the copy in, the bucket's graph, the copy out (and a
persistent bucket's barrier flag) on the backend's stream, records the slot's event and
returns. ``wait`` blocks on that event only, copies the slot's output into the caller's
``out`` and frees the slot. The device buffers (arena input region, pooled output) are
shared by both slots: the stream orders the two forwards, so ticket 2's copy in runs after
ticket 1's graph has read its inputs and ticket 1's copy out has read its output.

Errors surface at ``wait``: a persistent grid barrier that gave up (the result is void;
the flag is cleared) and NaN / Inf in the output (NumericalError), each after the slot is
freed, so the next submit is sound. A third outstanding ticket, a ticket waited twice or a
ticket of another backend is an InputError. ``run`` keeps a staging of its own and
synchronises the stream, so it may be mixed with outstanding tickets.

In the interpreter (no stream) ``submit`` runs the forward eagerly into the slot: the same
bookkeeping, staging and error paths, tested in CI.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

from zoi.backends.cuda.callpath import HostStaging
from zoi.errors import InputError, NumericalError

MAX_IN_FLIGHT = 2


@dataclass
class Ticket:
    owner: object
    slot: int
    seq: int
    B: int
    tb: int
    out: np.ndarray
    done: bool = False


class AsyncSlots:
    def __init__(self, be):
        self.be = be
        drv = None if be.eager else be.drv
        self.staging = [
            HostStaging(drv, be.mem.in_ints, be.hdr_ints, be.max_batch, be.spec.out_dim)
            for _ in range(MAX_IN_FLIGHT)
        ]
        self.events = [None if be.eager else drv.new_event() for _ in range(MAX_IN_FLIGHT)]
        self.busy: list[Ticket | None] = [None] * MAX_IN_FLIGHT
        self.seq = 0
        self.lock = threading.Lock()  # slot bookkeeping (the backend's lock orders the stream)

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self.staging)

    def submit(self, ids, positions, cu_seqlens, normalize, out) -> Ticket:
        be = self.be
        ids, tb = be._bucket(ids, cu_seqlens)
        B = len(cu_seqlens) - 1
        if out.dtype != np.float32 or out.shape[0] < B or out.shape[1] != be.spec.out_dim:
            raise InputError(
                f"submit: out must be float32 [>= {B}, {be.spec.out_dim}], got {out.dtype} "
                f"{list(out.shape)}"
            )
        with self.lock:
            free = [i for i, t in enumerate(self.busy) if t is None]
            if not free:
                raise InputError(
                    f"submit: {MAX_IN_FLIGHT} tickets are outstanding already; wait() for one "
                    "before submitting another"
                )
            slot = free[0]
            self.seq += 1
            t = Ticket(self, slot, self.seq, B, tb, out)
            self.busy[slot] = t
        st = self.staging[slot]
        try:
            with be._lock:
                n, _ = st.stage(ids, positions, cu_seqlens, normalize, tb)
                plan = be._pplans.get(tb)
                if be.eager:
                    be.d_in[:n] = be.torch.from_numpy(st.h_in[:n].copy())
                    for s in be._steps[tb]:
                        s()
                    st.h_out[:B] = be.d_out[:B].numpy()
                    st.h_flag[0] = int(plan.bar[1]) if plan is not None else 0
                else:
                    flag = plan.bar[1:] if plan is not None else None
                    if flag is None:
                        st.h_flag[0] = 0
                    be.call.enqueue(st, be._graphs[tb][1], n, B, flag)
                    be.drv.check(be._cu.cuEventRecord(self.events[slot], be.stream))
        except BaseException:
            with self.lock:
                self.busy[slot] = None
            raise
        return t

    def wait(self, t) -> np.ndarray:
        if not isinstance(t, Ticket) or t.owner is not self:
            raise InputError("wait: not a ticket of this backend's submit()")
        with self.lock:
            if t.done or self.busy[t.slot] is not t:
                raise InputError(f"wait: ticket {t.seq} was waited for already")
        be, st = self.be, self.staging[t.slot]
        try:
            if not be.eager:
                be.drv.check(be._cu.cuEventSynchronize(self.events[t.slot]))
            failed = st.h_flag[0] != 0
            t.out[: t.B] = st.h_out[: t.B]
        finally:
            with self.lock:
                t.done = True
                self.busy[t.slot] = None
        if failed:
            with be._lock:
                st.h_flag[0] = 0
                be._barrier_failed(t.tb)
        if not np.isfinite(t.out[: t.B]).all():
            bad = np.flatnonzero(~np.isfinite(t.out[: t.B]).all(axis=1))
            raise NumericalError(
                f"cuda: ticket {t.seq} produced NaN/Inf embeddings for {len(bad)} of {t.B} "
                f"sequences (first: {bad[:5].tolist()})"
            )
        return t.out

    def free(self):
        for s in self.staging:
            s.free()
        if not self.be.eager:
            for e in self.events:
                self.be._cu.cuEventDestroy(e)
