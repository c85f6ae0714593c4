"""Engine.encode on the native tokenizer: chunks by token budget, batch_size as a cap, texts
longer than the engine takes (no hang), truncation per call from two threads."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from tests.tokenizer.helpers import corpus_lines

import zoi
from zoi.errors import InputError


@pytest.fixture(scope="module")
def eng(small_bert):
    e = zoi.compile(small_bert, device="cpu", max_tokens=256)
    assert e.tokenizer.kind == "native WordPiece"
    return e


@pytest.fixture(scope="module")
def short_engine(small_bert, tmp_path_factory):
    """An artifact loaded with max_tokens (40) below the model's positions (64)."""
    art = zoi.compile(small_bert, device="cpu").save(tmp_path_factory.mktemp("art") / "a")
    e = zoi.load(art, max_tokens=40)
    assert e.max_tokens == 40 and e.spec.max_positions == 64
    return e


def count_calls(eng, monkeypatch) -> list[tuple[int, int]]:
    """Record (texts, tokens) of each backend call."""
    calls: list[tuple[int, int]] = []
    real = eng.backend.run_into

    def spy(ids, pos, cu, normalize, out):
        calls.append((len(cu) - 1, len(ids)))
        return real(ids, pos, cu, normalize, out)

    monkeypatch.setattr(eng.backend, "run_into", spy)
    return calls


def test_chunks_by_token_budget(eng, monkeypatch):
    texts = corpus_lines()[:300]
    lens = np.diff(eng.tokenizer.encode_packed(texts)[2])
    ref = np.stack([eng.encode(t) for t in texts[:40]])
    calls = count_calls(eng, monkeypatch)
    out = eng.encode(texts)
    # greedy: every chunk but the last is full (the next text would not fit)
    assert sum(c[0] for c in calls) == len(texts) and all(t <= eng.max_tokens for _, t in calls)
    at = 0
    for n, t in calls[:-1]:
        assert t + lens[at + n] > eng.max_tokens
        at += n
    assert len(calls) <= int(np.ceil(lens.sum() / eng.max_tokens)) + len(calls) // 2
    np.testing.assert_allclose(out[:40], ref, atol=2e-6, rtol=0)
    calls.clear()
    out7 = eng.encode(texts, batch_size=7)  # batch_size caps texts per chunk
    assert max(c[0] for c in calls) <= 7 and sum(c[0] for c in calls) == len(texts)
    np.testing.assert_allclose(out7, out, atol=2e-6, rtol=0)


def test_native_and_hf_tokenizers_give_the_same_embeddings(eng, monkeypatch):
    texts = corpus_lines()[:64] + ["", "naïve café 中文", "word " * 100]
    a = eng.encode(texts)
    monkeypatch.setattr(eng.tokenizer, "native", None)  # the HF path of the same file
    b = eng.encode(texts)
    assert np.array_equal(a, b)


@pytest.mark.timeout(60)
def test_text_longer_than_max_tokens_is_truncated_not_a_hang(short_engine):
    """zoi.load(ART, max_tokens=200).encode("word " * 300) is truncated; it must not loop."""
    e = short_engine
    out = e.encode("word " * 300)
    assert out.shape == (e.spec.hidden,) and np.isfinite(out).all()
    ids = e.tokenize(["word " * 300])[0]
    cut = np.concatenate([ids[:39], ids[-1:]])  # the first 38 words + [SEP]: 40 tokens
    want = e.run_packed(cut, np.arange(40), np.array([0, 40]), normalize=e.spec.normalize)[0]
    np.testing.assert_allclose(out, want, atol=1e-6, rtol=0)
    many = e.encode(["word " * 300, "short", "word " * 50] * 5)
    assert many.shape == (15, e.spec.hidden) and np.isfinite(many).all()
    with pytest.raises(
        InputError, match=r"texts\[1\] has \d+ tokens, over the engine's limit of 40"
    ):
        e.encode(["short", "word " * 300], truncate=False)
    e.tokenizer.native, saved = None, e.tokenizer.native  # the HF path too
    try:
        np.testing.assert_allclose(e.encode("word " * 300), out, atol=1e-6, rtol=0)
        with pytest.raises(InputError, match=r"texts\[1\].*limit of 40"):
            e.encode(["short", "word " * 300], truncate=False)
    finally:
        e.tokenizer.native = saved


def test_leading_whitespace_does_not_lose_the_text(eng):
    """9,000 leading spaces must not cut the content away (as a character cap before
    tokenising would); the native tokenizer has no such cap."""
    a = eng.encode(" " * 9000 + "the cat sat on the mat")
    b = eng.encode("the cat sat on the mat")
    assert np.array_equal(a, b)


def test_truncate_per_call_from_two_threads(eng):
    """Two threads with different truncate values never see each other's."""
    long, short = "word " * 300, "a short text"
    want_long = eng.encode(long)
    errors: list[BaseException] = []
    done = {True: 0, False: 0}

    def worker(truncate: bool) -> None:
        try:
            for _ in range(60):
                if truncate:
                    out = eng.encode([short, long], truncate=True)
                    np.testing.assert_allclose(out[1], want_long, atol=1e-6, rtol=0)
                else:
                    with pytest.raises(InputError, match=r"texts\[1\]"):
                        eng.encode([short, long], truncate=False)
                    assert eng.encode([short], truncate=False).shape == (1, eng.spec.hidden)
                done[truncate] += 1
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    ts = [threading.Thread(target=worker, args=(v,)) for v in (True, False)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors, errors[:3]
    assert done == {True: 60, False: 60}


def test_bad_batch_size_and_inputs(eng):
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="batch_size"):
            eng.encode(["a"], batch_size=bad)
    with pytest.raises(InputError, match=r"texts\[1\].*surrogate"):
        eng.encode(["fine", "\udcff"])
    with pytest.raises(TypeError, match=r"texts\[0\] is bytes"):
        eng.encode([b"x"])


def test_serve_with_an_engine_shorter_than_the_positions(short_engine):
    """`zoi serve ART --max-batch-tokens 200` keeps a 200-token engine: texts are truncated to
    (or refused at) the engine's limit, not the model's positions, so none gets a 500."""
    import asyncio

    pytest.importorskip("starlette")
    from zoi.serve.config import ServeConfig
    from zoi.serve.http import ApiError
    from zoi.serve.service import Service

    svc = Service(short_engine, ServeConfig(max_batch_tokens=40))
    try:
        assert svc.max_positions == 40 and svc.max_batch_tokens == 40

        async def go(texts, truncate):
            seqs, _ = await svc.tokenize(texts, truncate)
            return await svc.embed(None, seqs, True)

        long = "word " * 300
        for text in (long, long * 3):  # inline and on the tokenizer thread
            r = asyncio.run(go([text, "short"], True))
            assert r.embeddings.shape == (2, short_engine.spec.hidden) and r.tokens == 40 + 3
            np.testing.assert_allclose(r.embeddings[0], short_engine.encode(long), atol=1e-6)
        with pytest.raises(ApiError, match=r"texts\[0\].*limit of 40"):
            asyncio.run(go([long], False))
    finally:
        svc.close()
