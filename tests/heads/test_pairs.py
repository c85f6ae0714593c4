"""Pair tokenisation: id for id and type for type what HF tokenizers' encode(a, b) gives."""

from __future__ import annotations

import json

import numpy as np
import pytest
from tests.conftest import minilm_path, real_sentences
from tests.heads.builders import PAIRS

from zoi.errors import InputError
from zoi.frontend.pairs import PairEncoder, pair_template, truncate_pair
from zoi.frontend.tokenizer import Tokenizer


def _many_pairs(n=150, seed=0):
    s = real_sentences()
    r = np.random.default_rng(seed)
    out = list(PAIRS)
    for _ in range(n):
        a, b = r.integers(0, len(s), 2)
        out.append(
            (" ".join(s[a : a + int(r.integers(1, 3))]), " ".join(s[b : b + int(r.integers(1, 5))]))
        )
    out += [
        ("x" * 300, "y"),
        ("", ""),
        ("   ", "\t\n"),
        ("[CLS] [SEP]", "[MASK] token"),
        ("Ünïcode ñ", "日本語のテキスト"),
    ]
    return out


def _hf(tj: str, max_len: int, strategy: str):
    from tokenizers import Tokenizer as HF

    t = HF.from_str(tj)
    t.no_padding()
    t.enable_truncation(max_len, strategy=strategy)
    return t


def _check(
    tj: str,
    max_positions: int,
    strategies=("longest_first",),
    pairs=None,
    expect_kind=None,
    tokenizer="auto",
):
    tok = Tokenizer(tj, max_positions, tokenizer=tokenizer)
    enc = PairEncoder(tok)
    if expect_kind:
        assert enc.kind == expect_kind
    pairs = pairs or _many_pairs()
    for max_len in sorted({8, 13, 24, max_positions}):
        for strategy in strategies:
            hf = _hf(tj, max_len, strategy)
            try:
                ids, pos, types, cu = enc.encode(pairs, max_len, strategy)
            except InputError:  # only_first / only_second cannot always fit: HF refuses too
                for p in pairs:
                    try:
                        hf.encode(*p)
                    except Exception:
                        break
                else:
                    raise
                continue
            for i, (a, b) in enumerate(pairs):
                e = hf.encode(a, b)
                s, t = cu[i], cu[i + 1]
                assert ids[s:t].tolist() == e.ids, (max_len, strategy, a[:40], b[:40])
                assert types[s:t].tolist() == e.type_ids
                assert pos[s:t].tolist() == list(range(t - s))


@pytest.mark.parametrize("which", ["native", "hf"])
def test_bert_pairs_match_hf(which):
    tj = (minilm_path() / "tokenizer.json").read_text()
    kind = "native segments" if which == "native" else "HF segments"
    if which == "native" and Tokenizer(tj, 64).native is None:
        pytest.skip("no native tokenizer in this build")
    choice = "hf" if which == "hf" else "auto"
    strategies = ("longest_first", "only_first", "only_second")
    _check(tj, 128, strategies, expect_kind=kind, tokenizer=choice)


def _with_processor(pp) -> str:
    tj = json.loads((minilm_path() / "tokenizer.json").read_text())
    tj["post_processor"] = pp
    return json.dumps(tj)


def test_roberta_and_xlmr_templates_match_hf():
    cls, sep = ["[CLS]", 101], ["[SEP]", 102]
    _check(_with_processor({"type": "RobertaProcessing", "sep": sep, "cls": cls,
                            "trim_offsets": True, "add_prefix_space": False}), 64)  # fmt: skip
    _check(_with_processor({"type": "BertProcessing", "sep": sep, "cls": cls}), 64)
    xlmr = {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                   {"SpecialToken": {"id": "</s>", "type_id": 0}}],
        "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                 {"SpecialToken": {"id": "</s>", "type_id": 0}}, {"SpecialToken": {"id": "</s>", "type_id": 0}},
                 {"Sequence": {"id": "B", "type_id": 1}}, {"SpecialToken": {"id": "</s>", "type_id": 1}}],
        "special_tokens": {"<s>": {"id": "<s>", "ids": [101], "tokens": ["<s>"]},
                           "</s>": {"id": "</s>", "ids": [102], "tokens": ["</s>"]}},
    }  # fmt: skip
    _check(_with_processor(xlmr), 64)
    tj = _with_processor(None)  # no post-processor: HF's own pair encoding
    assert pair_template(tj) is None
    _check(tj, 64, expect_kind="HF tokenizers pairs")


def test_truncate_pair_rules():
    assert truncate_pair(3, 4, 10, "longest_first") == (3, 4)
    assert truncate_pair(3, 20, 10, "longest_first") == (3, 7)
    assert truncate_pair(20, 3, 10, "longest_first") == (7, 3)
    assert truncate_pair(20, 30, 11, "longest_first") == (5, 6)
    assert truncate_pair(30, 20, 11, "longest_first") == (6, 5)
    assert truncate_pair(6, 20, 10, "longest_first") == (5, 5)
    assert truncate_pair(8, 5, 10, "only_first") == (5, 5)
    assert truncate_pair(8, 5, 10, "only_second") == (8, 2)
    with pytest.raises(InputError, match="only_second"):
        truncate_pair(10, 2, 10, "only_second")
    tok = Tokenizer((minilm_path() / "tokenizer.json").read_text(), 64)
    with pytest.raises(ValueError, match="truncation"):
        PairEncoder(tok).encode([("a", "b")], 16, "both")
