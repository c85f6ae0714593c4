"""Every codepoint (surrogates aside) through the native tokenizer and HF, alone, between
letters, after and before combining marks of several classes (canonical reordering), with and
without each normalisation step. This is the check of csrc/tokenizer/unicode_tables.h.

The vocabulary is spelled out (every codepoint is a token and a ##token), so each normalised
character has its own id: a wrong lowercase, decomposition, dropped or kept control, split or
unsplit punctuation shows in the ids instead of hiding behind [UNK]."""

from __future__ import annotations

import functools
import json

import pytest
from tests.tokenizer.helpers import Pair, variant

from zoi.frontend.wordpiece import native_config

ALL = [c for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]
BLOCK = 128


def _texts(fmt: str) -> list[str]:
    """One text per block of codepoints; each codepoint is its own word (space-separated)."""
    out = []
    for i in range(0, len(ALL), BLOCK):
        out.append(" ".join(fmt.format(chr(c)) for c in ALL[i : i + BLOCK]))
    return out


# the BertNormalizer flags of each case (strip_accents resolved)
FLAGS = {
    "uncased": (True, True, True, True),
    "cased_strip": (True, True, True, False),
    "cased_keep": (True, True, False, False),
    "uncased_keep_accents": (True, True, False, True),
    "no_chinese": (True, False, True, True),
    "no_clean": (False, True, True, True),
}


@functools.lru_cache(maxsize=1)
def _spelled() -> tuple:
    """One spelled-out vocabulary: HF tokenizer (normaliser swapped per case) + native args."""
    from tokenizers import Tokenizer as HF

    tj = variant("uncased")
    vocab = tj["model"]["vocab"]
    nxt = max(vocab.values()) + 1
    for c in ALL:
        for tok in (chr(c), "##" + chr(c)):
            if tok not in vocab:
                vocab[tok] = nxt
                nxt += 1
    hf = HF.from_str(json.dumps(tj))
    hf.no_padding()
    hf.no_truncation()
    return hf, native_config(tj, 1 << 20)


def spelled_pair(name: str, **override) -> Pair:
    from tokenizers import normalizers

    from zoi import _cpu

    hf, cfg = _spelled()
    clean, cjk, strip, lower = FLAGS[name]
    hf.normalizer = normalizers.BertNormalizer(
        clean_text=clean, handle_chinese_chars=cjk, strip_accents=strip, lowercase=lower
    )
    flags = dict(clean_text=clean, handle_chinese_chars=cjk, strip_accents=strip, lowercase=lower)
    p = Pair.__new__(Pair)
    p.hf_full = p.hf_trunc = hf  # every test here runs untruncated
    p.max_len = 1 << 20
    p.native = _cpu.WordPiece(**{**cfg, **flags, **override})
    return p


FORMATS = {
    # between letters: a whitespace splits, punctuation stands alone, others join the word
    "in_word": "a{}b",
    # marks of class 230 / 220 / 1 after and around the codepoint: NFD must reorder as HF's
    "marks": "e{0}\u0301\u0316\u0334 E\u0301\u0316{0}\u0334",
}


# every codepoint under the uncased normaliser (MiniLM's) in the default tier; the other
# normaliser settings, the same sweep again, are the slow tier's (~4 minutes in all)
@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize(
    "name",
    ["uncased"]
    + [
        pytest.param(n, marks=pytest.mark.slow)
        for n in ("cased_strip", "cased_keep", "uncased_keep_accents", "no_chinese", "no_clean")
    ],
)
def test_every_codepoint(name, fmt):
    spelled_pair(name).check(_texts(FORMATS[fmt]), truncate=False, nthreads=0)


def test_the_check_can_fail():
    """The comparison is not vacuous: a difference that [UNK] would hide shows in the ids of
    the spelled-out vocabulary (U+00C5 and U+212B both decompose to A + ring above)."""
    p = spelled_pair("uncased", strip_accents=False)
    with pytest.raises(AssertionError, match="differ"):
        p.check(["\u00c5 \u212b e\u0301"], truncate=False)
    p = spelled_pair("uncased", lowercase=False)
    with pytest.raises(AssertionError, match="differ"):
        p.check(_texts(FORMATS["in_word"])[:4], truncate=False)
