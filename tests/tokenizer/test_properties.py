"""Property tests: random strings (hypothesis) give the native tokenizer and HF the same ids,
for every tokenizer.json variant, truncated at random limits or not."""

from __future__ import annotations

import functools

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.tokenizer.helpers import VARIANTS, Pair, variant

# characters a tokenizer finds hard, drawn more often than uniform codepoints would be
HARD = (
    " \t\n\r\x0b\x0c\x00\x01\x7f\x85\xa0\u200b\u200d\u2028\u3000\ufeff\ufffd"
    "\u0300\u0301\u0316\u0323\u0334\u0345\u034f\u05b0\u0e31\u302a\U0001d165\U0001d16d"
    "AaÅåÉéİıΣσςßẞǅﬁ\u212b\u1e9eĲ"
    ",.!?;:'\"()[]{}<>#$%&*+-/=@\\^_`|~¡¿«»—…「」"
    "中文字\u3400\U00020000\U0002b820\U0002b920\uf900가힣\u1100\u1161\u11a8"
    "ภาษาไทยשלוםمرحبا\U0001f600\U0001f468\U0001f3fd\ufe0f\u20e3"
    "[]CLSEP<ent>x"
)
text = st.text(
    alphabet=st.one_of(
        st.sampled_from(HARD),
        st.characters(blacklist_categories=("Cs",)),
        st.characters(min_codepoint=32, max_codepoint=0x24F),
    ),
    max_size=200,
)
words = st.lists(
    st.sampled_from(
        [
            "the",
            "quick",
            "Brown",
            "fox",
            "jumps",
            "over",
            "naïve",
            "café",
            "unbelievable",
            "[CLS]",
            "[SEP]",
            "<ent>",
            "<ent>x",
            "hello world",
            "e\u0301",
            "ÅNGSTRÖM",
        ]
    )
    | text,
    max_size=30,
).map(" ".join)


@functools.cache
def pair(name: str, max_len: int) -> Pair:
    return Pair(variant(name), max_len)


SETTINGS = settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)


@SETTINGS
@given(texts=st.lists(text | words, min_size=1, max_size=8), name=st.sampled_from(VARIANTS))
def test_random_strings(texts, name):
    pair(name, 512).check(texts, truncate=False)


@SETTINGS
@given(
    texts=st.lists(words, min_size=1, max_size=8),
    name=st.sampled_from(VARIANTS),
    max_len=st.sampled_from([2, 3, 4, 7, 16, 33]),
)
def test_random_truncation(texts, name, max_len):
    p = pair(name, max_len)
    p.check(texts, truncate=True)
    want = p.hf(texts, truncate=False)
    over = [i for i, w in enumerate(want) if len(w) > max_len]
    bad = p.native.encode_packed(texts, False, 0, 1)[3]
    assert bad == (over[0] if over else -1)
