"""The in-flight batching scheduler over the fake backend (tests/decoder/fakes.py)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from zoi.decoder.api import DecoderBackend, SamplingParams
from zoi.decoder.scheduler import (
    Delta,
    ListSink,
    Queued,
    QueueFull,
    Scheduler,
    SchedulerClosed,
)
from zoi.decoder.tokenizer import Detokenizer, StopMatcher

from .fakes import CORPUS, EOS, ByteTokenizer, FakeBackend, expected_tokens

TOK = ByteTokenizer()


def prompt(text: str) -> np.ndarray:
    return np.asarray(TOK.encode(text), np.int32)


def text_of(ids) -> str:
    return TOK.decode(ids)


@pytest.fixture
def make():
    made = []

    def _make(**kw):
        max_waiting = kw.pop("max_waiting", 256)
        b = FakeBackend(**kw)
        s = Scheduler(b, TOK.decode, max_waiting=max_waiting)
        made.append(s)
        return b, s

    yield _make
    for s in made:
        s.close()


def run(s, text, **params):
    sink = ListSink()
    s.submit(prompt(text), SamplingParams(**params), sink)
    return sink


def test_the_fake_implements_the_protocol():
    assert isinstance(FakeBackend(), DecoderBackend)


def test_one_request_gives_the_fake_tokens_as_text(make):
    b, s = make()
    sink = run(s, "hello", max_new_tokens=20)
    fin = sink.wait()
    want = expected_tokens(prompt("hello"), SamplingParams(max_new_tokens=20))
    assert fin.reason == ("stop" if want[-1] == EOS else "length")
    assert fin.completion_tokens == len(want) and fin.prompt_tokens == 6
    assert sink.text == text_of(want)
    assert isinstance(sink.items[0], Queued)
    assert all(isinstance(i, Delta) and i.text for i in sink.items[1:-1])
    assert b.free == sorted(b.free, key=b.free.index) and len(b.free) == b.num_blocks


def test_outputs_are_the_same_alone_and_batched(make):
    prompts = [f"prompt number {i} " * (1 + i % 3) for i in range(24)]
    params = [
        SamplingParams(max_new_tokens=5 + 7 * (i % 5), temperature=0.7 * (i % 2), seed=i)
        for i in range(24)
    ]
    alone = []
    b, s = make(max_batch=1, num_blocks=512)
    for p, sp in zip(prompts, params, strict=True):
        sink = ListSink()
        s.submit(prompt(p), sp, sink)
        sink.wait()
        alone.append((sink.text, sink.items[-1].reason))
    b2, s2 = make(max_batch=8, num_blocks=96, step_delay=0.001)
    sinks = []
    for p, sp in zip(prompts, params, strict=True):
        sinks.append(ListSink())
        s2.submit(prompt(p), sp, sinks[-1])
    batched = [(k.wait().reason and k.text, k.items[-1].reason) for k in sinks]
    assert batched == alone
    assert max(len(h) for h in b2.history) > 1  # really batched
    assert len(b2.free) == 96 and not b2.seqs


def test_a_new_request_joins_between_steps(make):
    b, s = make(step_delay=0.01)
    first = run(s, "first", max_new_tokens=60, ignore_eos=True)
    while b.steps < 5:
        time.sleep(0.002)
    second = run(s, "second", max_new_tokens=3)
    second.wait()
    assert not first.done.is_set()  # the second finished while the first streams
    first.wait()
    joined = [h for h in b.history if len(h) == 2]
    assert joined and b.history[0] == (1,) and b.history[-1] == (1,)


def test_pool_exhaustion_queues_fifo_then_admits(make):
    # 10 blocks of 4 tokens; each request needs ceil((6 + 14) / 4) = 5 blocks: two at a time
    b, s = make(num_blocks=10, block_size=4, step_delay=0.002)
    sinks = [run(s, f"p{i:03d}", max_new_tokens=14, ignore_eos=True) for i in range(6)]
    for k in sinks:
        assert k.wait().reason == "length"
    assert max(len(h) for h in b.history) == 2
    # FIFO: the first step that carries request i+2 comes after request i left
    first_step = {sid: min(n for n, h in enumerate(b.history) if sid in h) for sid in range(1, 7)}
    assert sorted(first_step, key=first_step.get) == [1, 2, 3, 4, 5, 6]
    assert len(b.free) == 10


def test_a_big_request_is_not_starved_by_small_ones(make):
    b, s = make(num_blocks=12, block_size=4, step_delay=0.002)
    small = [run(s, "s", max_new_tokens=20, ignore_eos=True) for _ in range(2)]  # 6 blocks each
    big = run(s, "big one", max_new_tokens=36, ignore_eos=True)  # 11 blocks: needs the pool empty
    later = [run(s, "s", max_new_tokens=4, ignore_eos=True) for _ in range(3)]
    assert big.wait().reason == "length"
    for k in small + later:
        k.wait()
    big_first = min(n for n, h in enumerate(b.history) if 3 in h)
    later_first = min(n for n, h in enumerate(b.history) if 4 in h)
    assert later_first > big_first


def test_a_request_that_can_never_fit_is_refused_at_once(make):
    b, s = make(num_blocks=4, block_size=4, max_seq_len=64)
    fin = run(s, "x" * 10, max_new_tokens=20).wait()
    assert fin.reason == "error" and fin.error.kind == "invalid"
    assert "KV blocks" in fin.error.message and "whole pool has 4" in fin.error.message
    fin = run(s, "x" * 60, max_new_tokens=20).wait()
    assert fin.error.code == "context_length_exceeded" and "64 tokens" in fin.error.message
    sink = ListSink()
    s.submit(np.zeros(0, np.int32), SamplingParams(), sink)
    assert "empty" in sink.wait().error.message
    sink = ListSink()
    s.submit(np.asarray([1, 9999], np.int32), SamplingParams(), sink)
    assert "outside" in sink.wait().error.message
    assert b.steps == 0  # nothing ran


def test_the_waiting_queue_is_bounded(make):
    b, s = make(max_batch=1, max_waiting=3, step_delay=0.01)
    sinks = [run(s, "a", max_new_tokens=30, ignore_eos=True)]
    while b.steps < 1:
        time.sleep(0.001)
    sinks += [run(s, "b", max_new_tokens=2) for _ in range(3)]
    with pytest.raises(QueueFull, match="max-waiting-requests 3"):
        run(s, "c")
    for k in sinks:
        k.wait()
    run(s, "d", max_new_tokens=2).wait()  # room again


def test_cancel_mid_stream_frees_blocks_before_the_next_step(make):
    b, s = make(step_delay=0.005)
    sink = ListSink()
    g = s.submit(prompt("cancel me"), SamplingParams(max_new_tokens=200, ignore_eos=True), sink)
    other = run(s, "keep going", max_new_tokens=40, ignore_eos=True)
    while b.steps < 4:
        time.sleep(0.001)
    g.cancel()
    fin = sink.wait()
    assert fin.reason == "cancelled" and 0 < fin.completion_tokens < 200
    n = b.steps
    assert g.id in b.cancelled
    assert all(g.id not in h for h in b.history[n:])
    other.wait()
    assert len(b.free) == b.num_blocks


def test_cancel_while_waiting(make):
    b, s = make(max_batch=1, step_delay=0.005)
    first = run(s, "a", max_new_tokens=30, ignore_eos=True)
    sink = ListSink()
    g = s.submit(prompt("b"), SamplingParams(max_new_tokens=5), sink)
    g.cancel()
    assert sink.wait().reason == "cancelled" and sink.items[-1].completion_tokens == 0
    first.wait()
    assert all(g.id not in h for h in b.history)
    assert s.waiting == 0


@pytest.mark.parametrize("stop", ["fox - na", "ü. T", "日本", "🎉🚀", "e"])
def test_stop_strings_across_deltas_are_not_emitted(make, stop):
    b, s = make()
    sp = SamplingParams(max_new_tokens=200, ignore_eos=True)
    want = text_of(expected_tokens(prompt("zz"), sp))
    assert stop in want
    sink = run(s, "zz", max_new_tokens=200, ignore_eos=True, stop=(stop, "never-there"))
    fin = sink.wait()
    assert fin.reason == "stop"
    assert sink.text == want[: want.index(stop)]
    assert fin.completion_tokens < 200
    assert len(b.free) == b.num_blocks  # cancelled in the backend


def test_text_held_for_a_stop_prefix_is_emitted_at_the_end(make):
    b, s = make()
    sp = SamplingParams(max_new_tokens=7)
    want = text_of(expected_tokens(prompt("q"), sp))
    last = want[-1]
    sink = run(s, "q", max_new_tokens=7, stop=(last + "\x00never",))
    sink.wait()
    assert sink.text == want


def test_utf8_characters_are_never_split(make):
    b, s = make(max_seq_len=512, num_blocks=128)
    sink = run(s, "utf", max_new_tokens=300, ignore_eos=True)
    assert sink.wait().reason == "length"
    deltas = [i.text for i in sink.items if isinstance(i, Delta)]
    assert len(deltas) < 300  # multi-byte characters: several tokens, one delta
    assert all("\ufffd" not in d for d in deltas)
    joined = "".join(deltas)
    assert "日本語" in joined and "🎉" in joined
    sp = SamplingParams(max_new_tokens=300, ignore_eos=True)
    assert joined == text_of(expected_tokens(prompt("utf"), sp))
    assert CORPUS.decode() in joined


def test_detokenizer_and_stop_matcher_units():
    d = Detokenizer(TOK.decode, [ord("a")])
    out = [d.push(t) for t in "é😀x".encode()]
    assert out == ["", "é", "", "", "", "😀", "x"]
    d = Detokenizer(TOK.decode)
    assert d.push(0xF0) == "" and d.flush() == "\ufffd"
    m = StopMatcher(["abc"])
    assert m.feed("xa") == ("x", False)
    assert m.feed("b") == ("", False)
    assert m.feed("d") == ("abd", False)
    assert m.feed("zab") == ("z", False)
    assert m.feed("cq") == ("", True)


def test_backend_failure_fails_the_running_requests_and_recovers(make):
    b, s = make(fail_steps=(3,))
    sinks = [run(s, f"r{i}", max_new_tokens=10, ignore_eos=True) for i in range(3)]
    for k in sinks:
        fin = k.wait()
        assert fin.reason == "error" and fin.error.kind == "backend"
        assert "injected failure" in fin.error.message
    assert len(b.free) == b.num_blocks
    assert run(s, "after", max_new_tokens=4).wait().reason in ("length", "stop")


def test_idle_scheduler_blocks_without_touching_the_backend(make):
    b, s = make()
    run(s, "x", max_new_tokens=3).wait()
    time.sleep(0.05)
    calls = b.calls
    time.sleep(0.3)
    assert b.calls == calls


def test_close_finishes_everything_and_refuses_new(make):
    b, s = make(max_batch=1, step_delay=0.01)
    a = run(s, "a", max_new_tokens=100, ignore_eos=True)
    w = run(s, "b", max_new_tokens=5)
    while b.steps < 2:
        time.sleep(0.001)
    s.close()
    for k in (a, w):
        fin = k.wait()
        assert fin.reason == "error" and fin.error.kind == "unavailable"
    with pytest.raises(SchedulerClosed):
        run(s, "c")
    assert len(b.free) == b.num_blocks


def test_32_concurrent_submitters(make):
    b, s = make(max_batch=8, num_blocks=128, step_delay=0.0005)
    results = {}

    def client(i):
        sp = SamplingParams(max_new_tokens=10 + i, seed=i, temperature=0.5)
        sink = ListSink()
        s.submit(prompt(f"client {i}"), sp, sink)
        fin = sink.wait()
        results[i] = (sink.text, fin.completion_tokens, expected_tokens(prompt(f"client {i}"), sp))

    ts = [threading.Thread(target=client, args=(i,)) for i in range(32)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert len(results) == 32
    for text, n, want in results.values():
        assert text == text_of(want) and n == len(want)
    assert len(b.free) == 128


def test_a_stop_token_id_ends_the_text_without_its_own(make):
    """stop_token_ids (and EOS): the request ends on the token, whose text is not part of the
    completion (as vLLM); the Generator does the same (zoi.decoder.tokenizer.TextStream)."""
    b, s = make()
    free = expected_tokens(prompt("st"), SamplingParams(max_new_tokens=40, ignore_eos=True))
    k = next(i for i, t in enumerate(free) if i >= 3 and t < 128 and chr(t).isalpha())
    sp = dict(max_new_tokens=40, ignore_eos=True, stop_token_ids=(free[k],))
    sink = run(s, "st", **sp)
    fin = sink.wait()
    assert expected_tokens(prompt("st"), SamplingParams(**sp)) == free[: k + 1]
    assert fin.reason == "stop"
    assert sink.text == text_of(free[:k]) and chr(free[k]) not in sink.text


@pytest.mark.parametrize("stop_ids", [(), (ord("q"),)])
def test_the_generator_and_the_server_count_tokens_alike(make, stop_ids):
    """One convention (vLLM's): completion_tokens (the server's usage) and Completion.token_ids
    both count the token that ended the text (EOS, stop token id), whose text is left out."""
    from zoi.decoder.generator import Generator

    gen = Generator(FakeBackend(), ByteTokenizer())
    b, s = make()
    for text in ("hello", "st", "a longer prompt", "x"):
        out = gen.generate(text, max_new_tokens=200, stop_token_ids=stop_ids)[0]
        sink = run(s, text, max_new_tokens=200, stop_token_ids=stop_ids)
        fin = sink.wait()
        want = expected_tokens(
            prompt(text), SamplingParams(max_new_tokens=200, stop_token_ids=stop_ids)
        )
        assert fin.reason == out.finish_reason == "stop"
        assert out.token_ids == want and want[-1] in (EOS, *stop_ids)
        assert fin.completion_tokens == len(out.token_ids)
        assert sink.text == str(out) == text_of(want[:-1])
