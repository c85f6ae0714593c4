"""zoi.frontend.tokenizer.Tokenizer: which tokenizer runs, the HF fallback, errors that name
the text, truncation per call from several threads."""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest
from tests.tokenizer.helpers import corpus_lines, minilm_json, variant

from zoi.errors import CheckpointError, InputError
from zoi.frontend.tokenizer import Tokenizer, tokenizer_choice


def make(tj: dict, max_positions: int = 512, tokenizer: str = "auto") -> Tokenizer:
    return Tokenizer(json.dumps(tj), max_positions, tokenizer=tokenizer)


@pytest.fixture(params=["native", "hf"])
def tok(request) -> Tokenizer:
    t = make(minilm_json(), 128, "hf" if request.param == "hf" else "auto")
    assert (t.native is not None) == (request.param == "native"), t.kind
    return t


def test_kind_and_fallback():
    assert make(minilm_json()).kind == "native WordPiece"
    tj = variant("uncased")
    tj["pre_tokenizer"] = {"type": "Whitespace"}
    t = make(tj)
    assert t.native is None and "pre-tokenizer 'Whitespace'" in t.kind
    from tokenizers import Tokenizer as HF

    hf = HF.from_str(json.dumps(tj))
    hf.no_padding()
    texts = ["Hello, world!", "naïve café"]
    assert [x.tolist() for x in t.encode_ids(texts)] == [e.ids for e in hf.encode_batch(texts)]
    from tokenizers import models, pre_tokenizers

    bpe = HF(models.BPE({"a": 0, "b": 1, "ab": 2, "<unk>": 3}, [("a", "b")], unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.Whitespace()
    t = make(json.loads(bpe.to_str()))
    assert "model type 'BPE'" in t.kind and t.encode_ids(["ab a b"])[0].tolist() == [2, 0, 1]
    tj = variant("uncased")
    tj["added_tokens"][0]["lstrip"] = True
    assert "lstrip" in make(tj).kind
    tj = variant("uncased")
    tj["normalizer"] = {"type": "Lowercase"}
    assert "normalizer 'Lowercase'" in make(tj).kind
    assert make(minilm_json(), tokenizer="hf").kind == "HF tokenizers (tokenizer='hf')"
    assert make(minilm_json(), tokenizer=" Native ").kind == "native WordPiece"
    tj = variant("uncased")
    tj["pre_tokenizer"] = {"type": "Whitespace"}
    with pytest.raises(CheckpointError, match="tokenizer='native'"):
        make(tj, tokenizer="native")
    with pytest.raises(ValueError, match="tokenizer must be 'auto'.*got 'fast'"):
        make(minilm_json(), tokenizer="fast")


def test_the_environment_is_read_at_the_edge_only(monkeypatch):
    """ZOI_TOKENIZER is the default of zoi.compile / zoi.load's tokenizer option
    (tokenizer_choice, at the API's edge); the Tokenizer itself never reads it."""
    assert tokenizer_choice(env={}) == "auto"
    assert tokenizer_choice(env={"ZOI_TOKENIZER": "HF "}) == "hf"
    assert tokenizer_choice("native", env={"ZOI_TOKENIZER": "hf"}) == "native"  # the argument wins
    with pytest.raises(ValueError, match="ZOI_TOKENIZER must be 'auto'.*got 'fast'"):
        tokenizer_choice(env={"ZOI_TOKENIZER": "fast"})
    with pytest.raises(ValueError, match="tokenizer must be"):
        tokenizer_choice(3, env={})
    monkeypatch.setenv("ZOI_TOKENIZER", "hf")
    assert tokenizer_choice() == "hf"
    assert make(minilm_json()).kind == "native WordPiece"  # not read below the edge


def test_native_equals_hf_through_the_wrapper():
    texts = corpus_lines()[:300] + ["", "x" * 3000, "word " * 300]
    a = make(minilm_json(), 128)
    b = make(minilm_json(), 128, "hf")
    assert a.native is not None and b.native is None
    for x, y in zip(a.encode_ids(texts), b.encode_ids(texts), strict=True):
        assert x.dtype == np.int32 and np.array_equal(x, y)
    ids, pos, cu = a.encode_packed(texts)
    ids2, pos2, cu2 = b.encode_packed(texts)
    assert np.array_equal(ids, ids2) and np.array_equal(pos, pos2) and np.array_equal(cu, cu2)
    assert a.count_tokens(texts) == b.count_tokens(texts)


def test_lone_surrogate_names_the_text(tok):
    with pytest.raises(InputError, match=r"texts\[2\].*surrogate"):
        tok.encode_ids(["ok", "fine", "bad \ud800 here", "ok"])


def test_wrong_types_name_the_text(tok):
    with pytest.raises(TypeError, match=r"texts\[1\] is int"):
        tok.encode_packed(["ok", 3])
    with pytest.raises(TypeError):
        tok.encode_packed("a single str")


def test_too_long_names_the_text(tok):
    texts = ["short", "word " * 200, "word " * 300]
    with pytest.raises(InputError, match=r"texts\[1\].*limit of 128.*truncate=True"):
        tok.encode_ids(texts, truncate=False)
    ids = tok.encode_ids(texts, truncate=True)
    assert [len(x) for x in ids] == [3, 128, 128]
    assert tok.encode_ids(["word " * 126], truncate=False)[0].shape == (
        128,
    )  # exactly at the limit


def test_empty_inputs(tok):
    assert tok.encode_ids([]) == []
    ids, pos, cu = tok.encode_packed([])
    assert len(ids) == len(pos) == 0 and cu.tolist() == [0]
    assert tok.encode_ids([""])[0].tolist() == [101, 102]


def test_truncation_is_per_call_across_threads(tok):
    """Two threads, one truncating and one not: each call sees its own setting."""
    long, short = "word " * 300, "a few words"
    errors: list[BaseException] = []
    counts = {True: 0, False: 0}

    def worker(truncate: bool) -> None:
        try:
            for _ in range(150):
                if truncate:
                    ids = tok.encode_ids([short, long], truncate=True)
                    assert len(ids[1]) == 128
                else:
                    with pytest.raises(InputError):
                        tok.encode_ids([short, long], truncate=False)
                    assert len(tok.encode_ids([short], truncate=False)[0]) == 5
                counts[truncate] += 1
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    ts = [threading.Thread(target=worker, args=(v,)) for v in (True, False, True, False)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors, errors[:3]
    assert counts == {True: 300, False: 300}
