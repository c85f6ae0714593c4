"""Native WordPiece ids identical to HF `tokenizers`: corpora, a Unicode torture set, every
tokenizer.json variant, truncated and not, one thread and the pool."""

from __future__ import annotations

import unicodedata

import pytest
from tests.tokenizer.helpers import VARIANTS, Pair, corpus_lines, variant

ACCENTED = [
    "Café naïve résumé Zürich Ångström façade jalapeño São Paulo Dvořák Łódź Ærøskøbing",
    "ÉCOLE Ĳssel ǅemal ﬁnancial ﬀ ẞ straße İstanbul ıi Σίσυφος ΣΑΣ ὈΔΥΣΣΕΎΣ",
    "Việt Nam Tiếng Việt có dấu: Hà Nội, Huế, Đà Nẵng",
    "ḱṷṓn Ṩ ǖ ǘ ǚ ǜ ȫ ȭ ḉ ḝ ṏ ṑ ṓ ẫ ậ ắ ằ ẳ ẵ ặ ế ề ể ễ ệ",
    "한국어 텍스트 안녕하세요 각 갂 힣 ㄱㅏ",
    "ｆｕｌｌｗｉｄｔｈ ＡＢＣ １２３ ｶﾀｶﾅ ㍻ ㌀ ①②③ ⅷ ℌ ℍ ℡ ™ ½ ² ₃",
]

TORTURE = [
    "",
    " ",
    "   \t\n\r  ",
    "\u3000\u00a0\u2028\u2029\u200b\u2060\ufeff",
    "\x00",
    "a\x00b\x01c\x7fd\x85e\x9ff",
    "\ufffd\ufffdx\ufffd",
    "tab\tnew\nline\rcr\x0bvt\x0cff",
    # combining marks: stacked, out of canonical order, on spaces and at the start
    "e\u0301\u0316\u0334 a\u0316\u0301 a\u0301\u0316 \u0301start x\u0345\u0301\u0323\u031b",
    "Z\u0351\u036b\u0343\u036a\u0302\u036b\u033d\u034f\u0334\u0319\u0324\u031e\u0349\u035a\u032f\u031e\u0320\u034dA\u036b\u0357\u0334\u0362\u0335\u031c\u0330\u0354L\u0368\u0367\u0369\u0358\u0320G\u0311\u0357\u030e\u0305\u035b\u0341\u0334\u033b\u0348\u034d\u0354\u0339O\u0342\u030c\u030c\u0358\u0328\u0335\u0339\u033b\u031d\u0333",
    " \u0300" * 40,
    "\u0e20\u0e32\u0e29\u0e32\u0e44\u0e17\u0e22 \u0e01\u0e34\u0e19\u0e02\u0e49\u0e32\u0e27\u0e2b\u0e23\u0e37\u0e2d\u0e22\u0e31\u0e07",  # Thai
    "\u05e9\u05dc\u05d5\u05dd \u05e2\u05d5\u05dc\u05dd \u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645 \u202eRTL override\u202c \u200fmark\u200e",
    "\u0627\u0644\u0652\u0639\u064e\u0631\u064e\u0628\u0650\u064a\u0651\u064e\u0629\u064f",  # Arabic harakat
    "\u4e2d\u6587\u5b57\u7b26 \u6f22\u5b57\u304b\u306a\u30ab\u30ca \u3400\u4dbf \U00020000\U0002a6df \U0002b740 \U0002b820\U0002b91f\U0002b920 \uf900 \U0002f800",
    "\u65e5\u672c\u8a9e\u306e\u6587\u7ae0\u3067\u3059\u3002\u3053\u308c\u306f\u30c6\u30b9\u30c8\u3067\u3059\uff01",
    "emoji \U0001f600\U0001f44d\U0001f3fd \U0001f468\u200d\U0001f469\u200d\U0001f467\u200d\U0001f466 \U0001f3f3\ufe0f\u200d\U0001f308 \u2764\ufe0f #\ufe0f\u20e3 \U0001f1eb\U0001f1f7",
    "math \U0001d400\U0001d41a \u2200x\u2208\u211d: x\u00b2 \u2265 0 \u221e \u2211 \u222b",
    "private \ue000\uf8ff \U000f0000 \U0010fffd unassigned \U000e0001 \u0378 \U0002fffe",
    "punct \u00a1\u00bf\u00ab\u00bb\u2014\u2013\u2026\u201c\u201d\u2018\u2019\u3001\u3002\u300c\u300d \uff01\uff1f $+<=>^`|~ \u00a7\u00b6\u2020",
    "[CLS] [SEP] [PAD] [MASK] [UNK] [cls] [ CLS ] x[SEP]y [[SEP]] [SEP",
    "supercalifragilisticexpialidocious" * 4,
    "a" * 99 + " " + "b" * 100 + " " + "c" * 101,
    "\u00e9" * 100 + " " + "e\u0301" * 60,
    "word " * 700,
    ",.;:!?" * 200,
    "x" * 5000,
    "http://example.com/path?q=1&r=%20 user@mail.org 3.14159 1,000,000 $12.50 #hashtag @handle",
    "Don't you're I'm it's y'all rock'n'roll 'quoted' \"double\"",
    "\U0001f600" * 300,
    "\ud7a3\u1100\u1161\u11a8 \u1100\u1161 \u11a8",
    "\u0130\u0049\u0131\u0069 \u1e9e\u00df \u03a3\u03c3\u03c2 \u0587 \ufb00 \u1f88 \u2126 \u212a \u212b",
    "\u0041\u030a \u00c5 \u212b \u1e0b\u0323 \u1e0d\u0307 \u0071\u0307\u0323",
    "\U0001d165\U0001d16d\U0001d16e \U0001d16d\U0001d165 \u0f71\u0f72\u0f74 \u0f74\u0f71",
]
FORMS = [unicodedata.normalize(f, t) for f in ("NFC", "NFD", "NFKC", "NFKD") for t in ACCENTED]
TORTURE_ALL = TORTURE + ACCENTED + FORMS


@pytest.fixture(scope="module", params=VARIANTS)
def pair(request) -> Pair:
    return Pair(variant(request.param), 512)


def test_corpora(pair):
    lines = corpus_lines()
    assert len(lines) > 900
    pair.check(lines)
    pair.check(lines, truncate=False)


def test_corpora_joined_and_truncated(pair):
    lines = corpus_lines()
    long = [" ".join(lines[i : i + 40]) for i in range(0, len(lines), 40)]
    pair.check(long)  # cut at 512 tokens mid-text, often mid-word


def test_torture(pair):
    pair.check(TORTURE_ALL)


@pytest.mark.parametrize("max_len", [2, 3, 5, 17, 64])
def test_truncation_at_every_length(max_len):
    """Small limits: truncation lands inside words, inside [UNK] words, on added tokens."""
    for name in ("uncased", "cased_strip", "added_tokens", "short_words"):
        p = Pair(variant(name), max_len)
        texts = corpus_lines()[:200] + TORTURE_ALL
        p.check(texts)
        # texts that fit are identical untruncated too; the others are reported over the limit
        want = p.hf(texts, truncate=False)
        ids, _, cu, bad = p.native.encode_packed(texts, False, 0, 1)
        over = [i for i, w in enumerate(want) if len(w) > max_len]
        assert bad == (over[0] if over else -1)


def test_pool_matches_one_thread():
    p = Pair(variant("uncased"), 512)
    texts = corpus_lines() * 3 + TORTURE_ALL  # large enough to spread over the pool
    assert sum(len(t.encode()) for t in texts) > 16384
    p.check(texts, nthreads=0)
    p.check(texts, nthreads=4)
    a = p.native.encode_packed(texts, True, 0, 1)
    b = p.native.encode_packed(texts, True, 0, 0)
    for x, y in zip(a[:3], b[:3], strict=True):
        assert (x == y).all()
