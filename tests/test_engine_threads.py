"""Engine thread safety: concurrent encode() / run_packed() calls from threads give exactly what
the same calls give one after another (the engine lock, zoi.engine.Engine._run_source: one arena,
one pair of staging sets and the backend's two ticket slots per engine)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import zoi
from conftest import real_sentences


@pytest.fixture(scope="module")
def eng(small_bert):
    # small chunks (64 tokens, 4 texts): a call runs many, through both staging sets
    return zoi.compile(small_bert, device="cpu", max_tokens=64, max_batch=4)


def _calls() -> list[list[str]]:
    """Four calls of 13 texts each (more than two chunks each), no two alike."""
    s = real_sentences(48)
    return [s[i::4] + ["word " * (5 + 7 * i)] for i in range(4)]


def test_concurrent_encodes_equal_serial(eng):
    calls = _calls()
    packed = []
    for t in calls:
        seqs = eng.tokenize(t)
        cu = np.concatenate([[0], np.cumsum([len(x) for x in seqs])]).astype(np.int32)
        pos = np.concatenate([np.arange(len(x)) for x in seqs]).astype(np.int32)
        packed.append((np.concatenate(seqs), pos, cu))
    want = [eng.encode(t) for t in calls]
    want_packed = [eng.run_packed(*p) for p in packed]
    assert all(len(w) == len(t) > 2 * eng.max_batch for w, t in zip(want, calls, strict=True))
    errors: list = []
    start = threading.Barrier(6)

    def encoder(k):
        try:
            start.wait()
            for j in range(6):
                i = (k + j) % len(calls)
                got = eng.encode(calls[i])
                if not np.array_equal(got, want[i]):
                    errors.append(("encode", k, j, float(np.abs(got - want[i]).max())))
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    def packer(k):
        try:
            start.wait()
            for j in range(6):
                i = (k + j) % len(packed)
                got = eng.run_packed(*packed[i])
                if not np.array_equal(got, want_packed[i]):
                    errors.append(("run_packed", k, j))
        except Exception as e:  # pragma: no cover
            errors.append(e)

    ts = [threading.Thread(target=encoder, args=(k,)) for k in range(4)]
    ts += [threading.Thread(target=packer, args=(k,)) for k in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    assert not any(t.is_alive() for t in ts)
    assert not errors, errors[:5]
