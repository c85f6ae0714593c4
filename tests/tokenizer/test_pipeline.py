"""The pipelined chunk loop (zoi.pipeline) against a fake asynchronous backend: tickets
waited in order, at most two in flight, staging not written again before its chunk is
waited, the output poisoned until wait, errors of submit / wait / the tokenizer raised after
draining, and the result equal, bit for bit, to the sequential chunk-by-chunk run."""

from __future__ import annotations

import threading
import time
from collections import deque

import numpy as np
import pytest
from tests.tokenizer.helpers import corpus_lines
from tests.tokenizer.test_exact import TORTURE_ALL

import zoi
from zoi.errors import InputError
from zoi.pipeline import ArraySource, Staging, run_chunks


class Boom(RuntimeError):
    pass


class FakeAsync:
    """Runs a real backend's run_into lazily (at wait) or on a thread started at submit
    (threaded=True). Keeps references to the inputs, never copies, and checks at wait that
    they still hold what they held at submit."""

    name = "fake"

    def __init__(self, inner, threaded=False, fail_wait=None, fail_submit=None):
        self.inner, self.threaded = inner, threaded
        self.fail_wait, self.fail_submit = fail_wait, fail_submit
        self.pending: deque = deque()
        self.chunks: list[tuple[int, int]] = []  # (texts, tokens) per submit
        self.inputs: list[np.ndarray] = []  # the ids array of each submit
        self.most_in_flight = 0
        self.k = 0

    def submit(self, ids, positions, cu, normalize, out):
        assert len(self.pending) < 2, "more than two tickets in flight"
        assert out.shape[0] == len(cu) - 1
        k, self.k = self.k, self.k + 1
        if self.fail_submit == k:
            raise Boom(f"submit {k}")
        snap = (ids.copy(), positions.copy(), cu.copy())
        out[:] = np.nan  # what the caller would read before wait
        t = {"k": k, "args": (ids, positions, cu, normalize, out), "snap": snap}
        if self.threaded:

            def work():
                time.sleep(0.002)  # the caller meanwhile prepares the next chunk
                self.inner.run_into(ids, positions, cu, normalize, out)

            t["thread"] = threading.Thread(target=work)
            t["thread"].start()
        self.pending.append(t)
        self.most_in_flight = max(self.most_in_flight, len(self.pending))
        self.chunks.append((len(cu) - 1, len(ids)))
        self.inputs.append(ids)
        return t

    def wait(self, t):
        assert self.pending and self.pending[0] is t, "tickets waited out of order"
        self.pending.popleft()
        ids, pos, cu, normalize, out = t["args"]
        if "thread" in t:
            t["thread"].join()
        for a, b in zip((ids, pos, cu), t["snap"], strict=True):
            assert np.array_equal(a, b), f"chunk {t['k']}: inputs rewritten before wait"
        if self.fail_wait == t["k"]:
            raise Boom(f"wait {t['k']}")
        if "thread" not in t:
            self.inner.run_into(ids, pos, cu, normalize, out)
        return out

    def run_into(self, *a):  # pragma: no cover - the engine must submit
        raise AssertionError("the pipelined engine calls submit / wait, not run_into")

    def memory(self):
        return self.inner.memory()


TEXTS = corpus_lines()[:200] + TORTURE_ALL + corpus_lines()[200:260]


@pytest.fixture(scope="module")
def eng(small_bert):
    e = zoi.compile(small_bert, device="cpu", max_tokens=256, max_batch=64)
    assert e.tokenizer.kind == "native WordPiece"
    return e


@pytest.fixture
def fake(eng):
    real = eng.backend

    def make(**kw):
        eng.backend = FakeAsync(real, **kw)
        return eng.backend

    yield make
    eng.backend = real


def greedy(cu, max_tokens, max_seqs):
    out, s, B = [], 0, len(cu) - 1
    while s < B:
        e = int(np.searchsorted(cu, cu[s] + max_tokens, side="right")) - 1
        e = min(max(e, s + 1), s + max_seqs, B)
        out.append((e - s, int(cu[e] - cu[s])))
        s = e
    return out


def sequential(eng, texts, max_seqs, normalize=False):
    """The reference: every text tokenised first, then chunk after chunk through run_into."""
    ids, pos, cu = eng.tokenizer.encode_packed(texts, max_len=eng.max_seq_tokens)
    out = np.full((len(texts), eng.hidden_size), np.nan, np.float32)
    src = ArraySource(ids, pos, cu, eng.max_tokens, max_seqs)
    while (c := src.next(None)) is not None:
        i, p, c_, n = c
        eng.backend.run_into(i, p, c_, normalize, out[src.s - n : src.s])
    return out, greedy(cu, eng.max_tokens, max_seqs)


@pytest.mark.parametrize("threaded", [False, True])
@pytest.mark.parametrize("batch_size", [None, 5, 64])
def test_pipeline_equals_sequential(eng, fake, threaded, batch_size):
    ref, split = sequential(eng, TEXTS, min(batch_size or eng.max_batch, eng.max_batch))
    assert np.isfinite(ref).all() and len(split) >= 3
    f = fake(threaded=threaded)
    got = eng.encode(TEXTS, batch_size=batch_size, normalize_embeddings=False)
    assert np.array_equal(got, ref)  # bit for bit: same chunks, same order
    assert f.chunks == split
    assert f.most_in_flight == 2 and not f.pending
    # two staging sets, alternating: chunk k is written into set k % 2 only
    sets = eng._staging.sets
    for k, ids in enumerate(f.inputs):
        assert np.shares_memory(ids, sets[k % 2][0]) and not np.shares_memory(
            ids, sets[1 - k % 2][0]
        )


def test_run_packed_pipelined(eng, fake):
    ids, pos, cu = eng.tokenizer.encode_packed(TEXTS)
    ref = eng.run_packed(ids, pos, cu)
    f = fake(threaded=True)
    got = eng.run_packed(ids, pos, cu)
    assert np.array_equal(got, ref) and f.most_in_flight == 2 and not f.pending
    assert f.chunks == greedy(cu, eng.max_tokens, eng.max_batch)


def test_hf_tokenizer_path_pipelined(small_bert, monkeypatch):
    monkeypatch.setenv("ZOI_TOKENIZER", "hf")
    e = zoi.compile(small_bert, device="cpu", max_tokens=256, max_batch=64)
    assert e.tokenizer.native is None
    ref, split = sequential(e, TEXTS, e.max_batch)
    e.backend = f = FakeAsync(e.backend, threaded=True)
    assert np.array_equal(e.encode(TEXTS, normalize_embeddings=False), ref)
    assert f.chunks == split and f.most_in_flight == 2


@pytest.mark.parametrize("where", ["wait", "submit"])
@pytest.mark.parametrize("k", [0, 1, 3])
def test_error_drains_and_engine_recovers(eng, fake, where, k):
    ref, _ = sequential(eng, TEXTS[:50], eng.max_batch, normalize=True)
    f = fake(**{f"fail_{where}": k})
    with pytest.raises(Boom, match=f"{where} {k}"):
        eng.encode(TEXTS)
    assert not f.pending  # every ticket waited before the error left encode
    f.fail_wait = f.fail_submit = None
    assert np.array_equal(eng.encode(TEXTS[:50]), ref)
    assert not f.pending


def test_text_over_limit_mid_stream(eng, fake):
    long = " ".join(["word"] * 400)
    texts = TEXTS[:150] + [long] + TEXTS[150:]
    f = fake(threaded=True)
    with pytest.raises(InputError, match=r"texts\[150\] has 402 tokens"):
        eng.encode(texts, truncate=False)
    assert not f.pending
    got = eng.encode(texts)  # truncated: runs
    assert np.isfinite(got).all() and got.shape == (len(texts), eng.hidden_size)


def test_stream_chunks_equal_the_greedy_split(eng):
    """TokenStream.fill packs exactly the greedy chunks of the one-call packing, whatever
    the thread count (one thread, the pool, 3 threads)."""
    tok = eng.tokenizer.native
    texts = corpus_lines() * 2 + TORTURE_ALL
    ids, pos, cu, _ = tok.encode_packed(texts, True, 0, 1, 128)
    for mt, ms in [(256, 64), (128, 1), (300, 7), (1 << 20, 1 << 20)]:
        for nt in (1, 0, 3):
            st = tok.stream(texts, True, 0, nt, 128)
            staging = Staging(mt, min(ms, len(texts)))
            I, P, C = staging.sets[0]
            got = []
            at = 0
            while True:
                n, T, bad = st.fill(I, P, C, mt, min(ms, len(texts)))
                assert bad == -1
                if n == 0:
                    break
                a = int(cu[at])
                assert np.array_equal(I[:T], ids[a : a + T]) and np.array_equal(
                    P[:T], pos[a : a + T]
                )
                assert np.array_equal(C[: n + 1], cu[at : at + n + 1] - a)
                got.append((n, T))
                at += n
            assert got == greedy(cu, mt, min(ms, len(texts))) and st.done == len(texts)


def test_stream_rejects_small_buffers(eng):
    st = eng.tokenizer.native.stream(["a b c"], True, 0, 1, 64)
    small = np.empty(8, np.int32)
    with pytest.raises(ValueError, match="staging buffers"):
        st.fill(small, small, small, 64, 4)


def test_run_chunks_source_error_drains():
    """An error of the source (tokenising chunk i+1) waits out chunk i first."""

    class Src:
        max_seqs = 1

        def __init__(self):
            self.k = 0

        def next(self, staging_set):
            self.k += 1
            if self.k == 3:
                raise Boom("source")
            ids = np.zeros(2, np.int32)
            return ids, ids, np.array([0, 2], np.int32), 1

    class Inner:
        def run_into(self, ids, pos, cu, normalize, out):
            out[:] = 1.0

    f = FakeAsync(Inner())
    out = np.empty((5, 3), np.float32)
    with pytest.raises(Boom, match="source"):
        run_chunks(f, Src(), False, out, Staging(4, 1))
    assert not f.pending and f.k == 2
    assert (out[:2] == 1.0).all()


@pytest.mark.parametrize("n", [1, 7, 33, 257, 3000])
def test_ids_independent_of_thread_count(eng, n):
    """The same packed arrays from 1 thread, the pool (its own choice) and 2..16 threads,
    small claims (1 text) and full ones (8) alike."""
    tok = eng.tokenizer.native
    texts = ((corpus_lines() + TORTURE_ALL) * 2)[:n]
    ref = tok.encode_packed(texts, True, 0, 1, 64)
    for nt in (0, 2, 3, 5, 8, 16):
        got = tok.encode_packed(texts, True, 0, nt, 64)
        for a, b in zip(ref[:3], got[:3], strict=True):
            assert np.array_equal(a, b), f"{nt} threads"
        assert got[3] == ref[3] == -1
    # over the limit, untruncated: the first such text is named whatever the threads
    bad = tok.encode_packed(texts, False, 0, 1, 16)[3]
    assert all(tok.encode_packed(texts, False, 0, nt, 16)[3] == bad for nt in (0, 2, 5, 16))
