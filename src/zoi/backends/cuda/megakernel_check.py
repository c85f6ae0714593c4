"""The static soundness check of a megakernel instruction list (megakernel_program.py builds
them): every wait counts all its counter's bumps and only earlier instructions bump it, no two
instructions write overlapping boxes, every read of a box another instruction writes is
ordered after that write by a chain of counters / queue order. Plain numpy (CPU tests check
every bucket shape)."""

from __future__ import annotations

import numpy as np

from zoi.backends.cuda.megakernel_program import (
    F_SELF,
    F_SIGNAL,
    F_WAIT,
    F_WAIT_N,
    F_WAIT_PER_CALL,
    Program,
)


def check_program(prog: Program) -> dict:
    """Static checks of a program (raise AssertionError naming the first problem):
    every wait counts all its counter's bumps and only earlier instructions bump it; no two
    instructions write overlapping boxes; every read of a scratch box that an instruction
    writes happens after that write through a chain of counters / queue order. Returns
    statistics (instructions, counters, per-block estimated load)."""
    R, n = prog.rows, len(prog.rows)
    by_ctr: dict[int, list[int]] = {}
    for i, r in enumerate(R):
        if r[F_SIGNAL] >= 0:
            by_ctr.setdefault(int(r[F_SIGNAL]), []).append(i)
    pred = [0] * n  # bitsets of instructions that happen before i
    pos = {}
    for b, q in enumerate(prog.queues):
        assert q == sorted(q), f"queue {b} is not in global order"
        for k, i in enumerate(q):
            pos[i] = (b, k)
    assert sorted(pos) == list(range(n)), "an instruction is in no queue, or in two"
    prev = {}
    for q in prog.queues:
        for a, b in zip(q[:-1], q[1:], strict=True):
            prev[b] = a
    assert (R[:, F_SELF] == np.arange(n)).all(), "F_SELF is not each row's own index"
    for i, r in enumerate(R):
        bits = 0
        c = int(r[F_WAIT])
        if c >= 0:
            ps = by_ctr.get(c, [])
            assert int(r[F_WAIT_N]) == len(ps) == int(r[F_WAIT_PER_CALL]) == prog.per_call[c], (
                f"{prog.names[i]} waits for {r[F_WAIT_N]} of {len(ps)} bumps of counter {c}"
            )
            for j in ps:
                assert j < i, f"{prog.names[i]} waits on the later {prog.names[j]}"
                bits |= pred[j] | (1 << j)
        if i in prev:
            bits |= pred[prev[i]] | (1 << prev[i])
        pred[i] = bits

    def overlap(a, b):
        return a[0] == b[0] and a[1] < b[2] and b[1] < a[2] and a[3] < b[4] and b[3] < a[4]

    writes = [(i, box) for i, (_, ws) in enumerate(prog.access) for box in ws]
    for x, (i, a) in enumerate(writes):
        for j, b in writes[x + 1 :]:
            assert i == j or not overlap(a, b), (
                f"{prog.names[i]} and {prog.names[j]} both write {a[0]}"
            )
    for j, (rs, _) in enumerate(prog.access):
        for rb in rs:
            for i, wb in writes:
                if overlap(rb, wb):
                    assert (pred[j] >> i) & 1, (
                        f"{prog.names[j]} reads {rb[0]} rows {rb[1]}:{rb[2]} written by "
                        f"{prog.names[i]} with no counter between them"
                    )
    load = [sum(prog.cost[i] for i in q) for q in prog.queues]
    return dict(instructions=n, counters=len(prog.per_call), load=load)
