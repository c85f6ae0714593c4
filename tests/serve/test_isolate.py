"""zoi.serve.isolate.run_isolated: the one retry rule of a failed batch, shared by the server's
batcher and a Triton instance (zoi.integrations.triton_runtime)."""

from __future__ import annotations

import numpy as np
import pytest

from zoi.serve.isolate import run_isolated


class Engine:
    """rows = [first token, length] of each sequence; fails any call that holds `bad`."""

    def __init__(self, bad: int | None = None, exc=RuntimeError):
        self.bad, self.exc, self.calls = bad, exc, []

    def __call__(self, seqs):
        self.calls.append([int(s[0]) for s in seqs])
        if self.bad is not None and any(int(s[0]) == self.bad for s in seqs):
            raise self.exc(f"injected failure on {self.bad}")
        return np.array([[s[0], len(s)] for s in seqs], np.float32)


def parts_of(firsts: list[list[int]]) -> list[list[np.ndarray]]:
    return [[np.array([f] * (1 + f % 3), np.int32) for f in p] for p in firsts]


def want(part) -> np.ndarray:
    return np.array([[s[0], len(s)] for s in part], np.float32)


def test_packed_call_delivers_each_part_its_rows():
    parts = parts_of([[1, 2], [3], [4, 5, 6]])
    eng, got, order = Engine(), {}, []

    def after(seqs, dt, err):
        order.append("packed")
        assert len(seqs) == 6 and err is None and dt >= 0

    def deliver(i, rows, err, dt):
        order.append(i)
        assert err is None and dt >= 0
        got[i] = rows

    assert run_isolated(parts, eng, deliver, after_packed=after) is None
    assert eng.calls == [[1, 2, 3, 4, 5, 6]] and order == ["packed", 0, 1, 2]
    for i, p in enumerate(parts):
        np.testing.assert_array_equal(got[i], want(p))


def test_failed_batch_retries_each_part_alone_in_order():
    parts = parts_of([[1, 2], [7], [4], [7, 8]])
    eng, got, seen = Engine(bad=7), {}, []

    def after(seqs, dt, err):
        seen.append(err)

    def deliver(i, rows, err, dt):
        got[i] = err if err is not None else rows

    ok = run_isolated(parts, eng, deliver, after_packed=after)
    assert ok == 2  # parts 0 and 2 ran alone
    assert eng.calls == [[1, 2, 7, 4, 7, 8], [1, 2], [7], [4], [7, 8]]
    assert len(seen) == 1 and isinstance(seen[0], RuntimeError)  # once, before the retries
    np.testing.assert_array_equal(got[0], want(parts[0]))
    np.testing.assert_array_equal(got[2], want(parts[2]))
    for i in (1, 3):
        assert isinstance(got[i], RuntimeError) and "injected failure on 7" in str(got[i])


def test_skip_is_asked_before_each_retry():
    parts = parts_of([[1], [7], [2]])
    eng, got, asked = Engine(bad=7), {}, []

    def skip(i):
        asked.append(i)
        return i == 0  # its request failed elsewhere meanwhile

    ok = run_isolated(parts, eng, lambda i, r, e, dt: got.__setitem__(i, e or r), skip=skip)
    assert asked == [0, 1, 2] and ok == 1 and set(got) == {1, 2}
    assert eng.calls == [[1, 7, 2], [7], [2]]  # part 0 was not retried


def test_only_the_given_errors_are_isolated():
    parts = parts_of([[1], [7]])
    eng = Engine(bad=7, exc=KeyError)
    with pytest.raises(KeyError):  # not one of `errors`: the caller fails the whole batch
        run_isolated(parts, eng, lambda *a: pytest.fail("delivered"), errors=RuntimeError)
    assert eng.calls == [[1, 7]]
    got = {}
    ok = run_isolated(parts, eng, lambda i, r, e, dt: got.__setitem__(i, e), errors=(KeyError,))
    assert ok == 1 and got[0] is None and isinstance(got[1], KeyError)


def test_the_batcher_and_triton_share_it():
    from zoi.integrations import triton_runtime
    from zoi.serve import batcher

    assert batcher.run_isolated is run_isolated
    assert triton_runtime.run_isolated is run_isolated
