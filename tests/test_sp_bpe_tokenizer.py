"""The native SentencePiece BPE tokenizer (zoi._cpu.SentencePiece) against HF `tokenizers`.

sentencepiece trains a BPE model with byte_fallback on the bundled corpora (as
tests/test_unigram_tokenizer.py trains its Unigram), and transformers converts it as the hub
files are made: GemmaTokenizer (Replace " " -> "▁", Split " " MergedWithPrevious, a <bos>
template as Gemma / EmbeddingGemma have), LlamaTokenizer (Metaspace prepend_scheme first
without split, no normalizer), transformers' generic SentencePiece conversion (Precompiled
and the space Replaces), and the files of Llama-2 (Prepend "▁" + Replace, no pre-tokenizer,
<unk>) and Gemma (Replace only). Ids compared id for id on the torture strings, seeded
random Unicode and the corpora; byte_fallback with every byte, some bytes or none, unk
fused or not, ignore_merges, merges that join across "▁" (no cutting of words), truncation,
packing, streaming, and the files that fall back to HF.
"""

from __future__ import annotations

import functools
import json
import random

import numpy as np
import pytest

pytest.importorskip("tokenizers")
pytest.importorskip("sentencepiece")
pytest.importorskip("transformers")
from tests.test_bpe_tokenizer import random_texts  # noqa: E402
from tests.test_unigram_tokenizer import (  # noqa: E402
    from_folder,
    sp_random,
    sp_torture,
    train,
)
from tests.tokenizer.helpers import (  # noqa: E402
    assert_same,
    assert_stream_equals_packing,
    corpus,
    hf_ids,
    mutated,
    native_ids,
    native_of,
    wrapper_pair,
)
from tokenizers import Tokenizer as HF  # noqa: E402

from zoi.frontend import sentencepiece as sp  # noqa: E402
from zoi.frontend.tokenizer import Tokenizer  # noqa: E402

_cpu = pytest.importorskip("zoi._cpu")
if not hasattr(_cpu, "SentencePiece"):  # pragma: no cover - a core built before it
    pytest.skip("the native core has no SentencePiece", allow_module_level=True)


def _bos(tj: dict, bos: str) -> dict:
    i = next(a["id"] for a in tj["added_tokens"] if a["content"] == bos)
    tj["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                 {"SpecialToken": {"id": bos, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {bos: {"id": bos, "ids": [i], "tokens": [bos]}},
    }  # fmt: skip
    return tj


@functools.cache
def variant_json(name: str) -> str:
    model = train("bpe", byte_fallback=True)
    if name == "gemma":  # transformers 5's GemmaTokenizer, with Gemma's <bos> template
        return json.dumps(
            _bos(json.loads(from_folder(model, "tokenizer.model", "GemmaTokenizer")), "<bos>")
        )
    if name == "llama":  # transformers 5's LlamaTokenizer (legacy=False), <s> template
        return json.dumps(
            _bos(json.loads(from_folder(model, "tokenizer.model", "LlamaTokenizer")), "<s>")
        )
    if name == "spm-bpe":  # transformers 5's generic conversion (Precompiled, space Replaces)
        return from_folder(model, "tokenizer.model")
    tj = json.loads(variant_json("llama"))
    if name == "llama2-hub":  # Llama-2 as on the hub (legacy): Prepend + Replace, <unk>
        tj["normalizer"] = {
            "type": "Sequence",
            "normalizers": [
                {"type": "Prepend", "prepend": "▁"},
                {"type": "Replace", "pattern": {"String": " "}, "content": "▁"},
            ],
        }
        tj["pre_tokenizer"] = None
        tj["model"]["unk_token"] = "<unk>"
        return json.dumps(tj)
    if name == "gemma-hub":  # Gemma / EmbeddingGemma: Replace only, no pre-tokenizer
        tj = json.loads(variant_json("gemma"))
        tj["pre_tokenizer"] = None
        return json.dumps(tj)
    raise KeyError(name)


VARIANTS = ["gemma", "llama", "spm-bpe", "llama2-hub", "gemma-hub"]


@pytest.mark.parametrize("name", VARIANTS)
def test_variant_runs_natively(name):
    t = Tokenizer(variant_json(name), 512)
    assert t.native is not None and t.kind == "native SentencePiece BPE", t.kind
    cfg = sp.native_config(json.loads(variant_json(name)), 512)
    assert cfg["cut"] == "▁" and cfg["byte_fallback"]  # SentencePiece's merges never cross "▁"


def test_variants_are_what_transformers_writes():
    g = json.loads(variant_json("gemma"))
    assert g["normalizer"] == {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}
    assert g["pre_tokenizer"]["behavior"] == "MergedWithPrevious"
    assert g["model"]["byte_fallback"] and g["model"]["fuse_unk"]
    ll = json.loads(variant_json("llama"))
    assert ll["pre_tokenizer"]["prepend_scheme"] == "first" and not ll["pre_tokenizer"]["split"]


@pytest.mark.parametrize("name", VARIANTS)
def test_torture_equals_hf(name):
    assert assert_same(variant_json(name), sp_torture()) > 500


@pytest.mark.parametrize("name", VARIANTS)
def test_random_unicode_equals_hf(name):
    texts = sp_random(3000, seed=100 + VARIANTS.index(name))
    assert assert_same(variant_json(name), texts) == 3000


@pytest.mark.parametrize("name", ["gemma", "llama2-hub", "spm-bpe"])
def test_corpora_equal_hf(name):
    lines = corpus()
    texts = lines + [" ".join(lines[i : i + 40]) for i in range(0, len(lines), 40)]
    assert_same(variant_json(name), texts)


def test_merges_across_the_replacement_disable_cutting():
    """A merge that joins a character and a following "▁..." piece: words are merged whole
    (no cut), still HF's ids; both merges formats."""

    def cross(tj):
        v = tj["model"]["vocab"]
        for a, b in (("a", "▁b"), ("e", "▁t"), (".", "▁")):
            if a + b not in v:
                v[a + b] = max(v.values()) + 1
            tj["model"]["merges"].insert(0, [a, b])

    js = mutated(variant_json("llama2-hub"), cross)
    assert sp.native_config(json.loads(js), 512)["cut"] == ""
    texts = ["a b e the. x", "tea table. ", "a  b", "ab a b"] + sp_random(500, seed=7)
    assert_same(js, texts)
    js2 = mutated(variant_json("llama2-hub"), lambda tj: tj["model"].update(
        merges=["#version: 0.2"] + [" ".join(m) for m in tj["model"]["merges"]]))  # fmt: skip
    assert_same(js2, texts)


@pytest.mark.parametrize("unk", [None, "<unk>"])
@pytest.mark.parametrize("fuse", [False, True])
@pytest.mark.parametrize("bytes_kept", ["all", "some", "none"])
def test_byte_fallback_and_unknown(unk, fuse, bytes_kept):
    """Characters outside the vocabulary: their <0xXX> tokens when all exist (byte_fallback),
    else [UNK] (fused or not, emitted after the byte tokens that follow it, as HF does), or
    nothing without an unk_token."""

    def setup(tj):
        m = tj["model"]
        m["unk_token"], m["fuse_unk"] = unk, fuse
        drop = {"all": [], "some": range(0xE0, 0x100), "none": range(256)}[bytes_kept]
        gone = {f"<0x{b:02X}>" for b in drop}
        m["merges"] = [x for x in m["merges"] if not (set(x) & gone) and "".join(x) not in gone]
        m["vocab"] = {k: v for k, v in m["vocab"].items() if k not in gone}
        tj["added_tokens"] = [a for a in tj["added_tokens"] if a["content"] not in gone]

    js = mutated(variant_json("llama2-hub"), setup)
    texts = ["café ☃ 日本語 x", "☃☃☃", "a☃\U0001f600b", "\U0001f600\u2603é", "𝕳𝖊𝖑𝖑𝖔", "é" * 50]
    try:
        HF.from_str(js)
    except BaseException as e:  # noqa: BLE001 - the file is invalid for HF too
        if isinstance(e, KeyboardInterrupt):
            raise
        return
    assert Tokenizer(js, 512).native is not None
    assert_same(js, texts + sp_random(500, seed=11))


def test_ignore_merges():
    js = mutated(variant_json("gemma"), lambda tj: tj["model"].update(ignore_merges=True))
    assert_same(js, sp_torture()[:300] + sp_random(500, seed=13))


def test_long_words_and_many_merges():
    """One word of the whole text (no pre-tokenizer): thousands of symbols, HF's queue order."""
    rng = random.Random(3)
    words = ["".join(rng.choice("abcdefghij ") for _ in range(n)) for n in (65, 100, 1000, 10000)]
    words += ["the" * 3000, "▁▁" * 500, " " * 4000, "ab" * 33]
    words += ["".join(rng.choices("etaoinsrhl ", k=rng.randint(1, 300))) for _ in range(500)]
    for name in ("llama2-hub", "gemma-hub"):
        assert_same(variant_json(name), words)


@pytest.mark.parametrize("name", ["gemma", "llama2-hub", "llama"])
def test_truncation_and_packing_as_hf(name):
    nat, ref = wrapper_pair(variant_json(name), 64)
    texts = sp_torture()[:150] + sp_random(300, seed=5) + corpus()[:200]
    texts = [t for t in texts if len(t) < 2000]
    for max_len in (None, 2, 3, 7, 16, 63):
        a = nat.encode_packed(texts, truncate=True, max_len=max_len)
        b = ref.encode_packed(texts, truncate=True, max_len=max_len)
        for x, y in zip(a, b, strict=True):
            np.testing.assert_array_equal(x, y)


def test_truncation_of_huge_text_stops_early():
    """A 2 MB text is one word here: cut at each "▁", it stops at the limit."""
    nat = Tokenizer(variant_json("llama2-hub"), 32)
    ids = nat.encode_ids(["word " * 400_000])[0]
    assert ids.tolist() == hf_ids(variant_json("llama2-hub"), ["word " * 100], 32)[0]


def test_stream_and_threads():
    nat = Tokenizer(variant_json("gemma"), 128)
    texts = sp_random(400, seed=9) + corpus()[:300]
    assert_stream_equals_packing(nat, texts)
    raw = native_of(variant_json("gemma"))
    more = random_texts(1500, seed=17) + corpus()
    assert native_ids(raw, more, nthreads=1) == native_ids(raw, more, nthreads=2)


@pytest.mark.parametrize(
    "mutate, reason",
    [
        (lambda tj: tj["model"].update(dropout=0.5), "dropout"),
        (lambda tj: tj["model"].update(continuing_subword_prefix="##"), "prefix"),
        (lambda tj: tj.update(normalizer={"type": "NFKC"}), "normalizer 'NFKC'"),
        (lambda tj: tj.update(pre_tokenizer={"type": "Whitespace"}), "pre-tokenizer 'Whitespace'"),
        (lambda tj: tj.update(pre_tokenizer={"type": "Split", "pattern": {"Regex": " "},
                                             "behavior": "Isolated", "invert": False}), "regex"),
        (lambda tj: tj.update(pre_tokenizer={"type": "Split", "pattern": {"String": " "},
                                             "behavior": "Contiguous", "invert": False}), "Contiguous"),
        (lambda tj: tj["added_tokens"][1].update(single_word=True), "single_word"),
    ],
)  # fmt: skip
def test_fallback_reasons_and_ids(mutate, reason):
    js = mutated(variant_json("gemma"), mutate)
    assert isinstance(sp.native_config(json.loads(js), 512), str)
    try:
        HF.from_str(js)
    except BaseException as e:  # noqa: BLE001
        if isinstance(e, KeyboardInterrupt):
            raise
        return
    t = Tokenizer(js, 512)
    assert t.native is None and reason in t.kind and "model type 'BPE'" in t.kind, t.kind
    if reason == "dropout":
        return
    texts = sp_torture()[:100]
    assert [x.tolist() for x in t.encode_ids(texts)] == hf_ids(js, texts, 512)
