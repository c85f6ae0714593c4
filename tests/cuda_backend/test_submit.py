"""CudaBackend.submit / wait (submit.py): two tickets in flight over double-buffered pinned
staging, an event per ticket, errors at wait. Through the interpreter in CI (the slot
bookkeeping, staging and error paths), compiled on the GPU (stream, events, graphs)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from tests import triton_mode  # noqa: E402
from tests.cuda_backend.cuda_helpers import batch, tiny_model  # noqa: E402

from zoi.errors import BackendUnavailableError, InputError, NumericalError  # noqa: E402

COMPILED = not triton_mode.interpreted()
pytestmark = pytest.mark.skipif(
    COMPILED and not torch.cuda.is_available(), reason="compiled Triton needs a CUDA GPU"
)
CASES = ([3], [20, 5], [40, 11, 1], [7] * 9, [16], [2, 30, 9])


def _backend(model, **kw):
    from zoi.backends.cuda.backend import CudaBackend

    return CudaBackend(model, interpret=None if COMPILED else True, **kw)


@pytest.fixture(scope="module")
def be_cases():
    model = tiny_model("int8", max_tokens=64, max_batch=16)
    be = _backend(model, buckets=[16, 64], persistent_max=0)
    rng = np.random.default_rng(5)
    cases = [batch(lens, seed=rng) for lens in CASES]
    want = [be.run(*c, True) for c in cases]
    return be, cases, want


def _out(be, B):
    return np.full((B, be.spec.hidden), np.nan, np.float32)  # poisoned


def test_pipelined_loop_matches_run(be_cases):
    """The engine's loop: submit i+1 before waiting for i; every output equals run()'s, and
    the caller's arrays may be overwritten as soon as submit returns."""
    be, cases, want = be_cases
    pending = []
    for i, (ids, pos, cu) in enumerate(cases):
        ids, pos, cu = ids.copy(), pos.copy(), cu.copy()
        out = _out(be, len(cu) - 1)
        pending.append((i, be.submit(ids, pos, cu, True, out), out))
        ids[:] = 0  # reused by the caller at once: the ticket has its own staging
        pos[:] = 0
        if len(pending) == 2:
            j, t, o = pending.pop(0)
            assert be.wait(t) is o
            np.testing.assert_array_equal(o, want[j])
    for j, t, _o in pending:
        np.testing.assert_array_equal(be.wait(t), want[j])


def test_out_of_order_waits_and_run_between(be_cases):
    be, cases, want = be_cases
    o1, o2 = _out(be, len(cases[2][2]) - 1), _out(be, len(cases[3][2]) - 1)
    t1 = be.submit(*cases[2], True, o1)
    t2 = be.submit(*cases[3], True, o2)
    np.testing.assert_array_equal(be.run(*cases[0], True), want[0])  # its own staging
    np.testing.assert_array_equal(be.wait(t2), want[3])
    np.testing.assert_array_equal(be.wait(t1), want[2])


def test_ticket_misuse_is_a_clear_error(be_cases):
    be, cases, want = be_cases
    outs = [_out(be, 16) for _ in range(3)]
    t1 = be.submit(*cases[0], True, outs[0])
    t2 = be.submit(*cases[1], True, outs[1])
    with pytest.raises(InputError, match="2 tickets are outstanding"):
        be.submit(*cases[2], True, outs[2])
    be.wait(t1)
    with pytest.raises(InputError, match="waited for already"):
        be.wait(t1)
    with pytest.raises(InputError, match="not a ticket"):
        be.wait(object())
    with pytest.raises(InputError, match="out must be float32"):
        be.submit(*cases[1], True, np.zeros((1, be.spec.hidden), np.float32))
    t3 = be.submit(*cases[4], True, outs[2])  # the freed slot is reused
    np.testing.assert_array_equal(be.wait(t2)[:2], want[1])
    np.testing.assert_array_equal(be.wait(t3)[:1], want[4])
    with pytest.raises(InputError, match="exceeds this engine"):
        be.submit(np.zeros(65, np.int32), np.zeros(65, np.int32), np.array([0, 65], np.int32),
                  True, outs[0])  # fmt: skip
    t = be.submit(*cases[0], True, outs[0])  # the failed submits left no slot taken
    np.testing.assert_array_equal(be.wait(t)[:1], want[0])


def test_nan_surfaces_at_wait_and_the_next_call_is_sound(be_cases):
    be, cases, want = be_cases
    b = be.w["embed.ln.b"]
    saved = b.clone()
    b[0] = float("nan")
    if be.dev == "cuda":
        torch.cuda.synchronize()
    try:
        t = be.submit(*cases[1], True, _out(be, 2))
        with pytest.raises(NumericalError, match="NaN/Inf"):
            be.wait(t)
    finally:
        b.copy_(saved)
        if be.dev == "cuda":
            torch.cuda.synchronize()
    t = be.submit(*cases[1], True, _out(be, 2))
    np.testing.assert_array_equal(be.wait(t), want[1])


@pytest.mark.skipif(COMPILED, reason="interpreter: a persistent bucket without the GPU timing")
def test_barrier_timeout_surfaces_at_wait():
    model = tiny_model("fp16", max_tokens=64)
    from zoi.backends.cuda.options import CudaOptions

    be = _backend(
        model, buckets=[16, 64], persistent_max=256, options=CudaOptions(persistent="time")
    )
    assert be.memory()["bucket_paths"][16]["path"] == "persistent"
    ids, pos, cu = batch([5, 7], int(model.spec.vocab_size), np.random.default_rng(3))
    first = be.run(ids, pos, cu, True)
    be._pplans[16].bar[1] = 1  # what a barrier that gave up writes
    t = be.submit(ids, pos, cu, True, _out(be, 2))
    with pytest.raises(BackendUnavailableError, match="grid barrier"):
        be.wait(t)
    assert int(be._pplans[16].bar[1]) == 0
    t = be.submit(ids, pos, cu, True, _out(be, 2))
    np.testing.assert_array_equal(be.wait(t), first)
