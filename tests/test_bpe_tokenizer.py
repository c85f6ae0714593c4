"""The native byte-level BPE tokenizer (zoi._cpu.ByteBPE) against HF `tokenizers`, id for id.

The tokenizer.json files are built here (no download): a byte-level BPE trained with HF's
BpeTrainer on the bundled corpora (English, code, 20 languages) under the configurations of
Qwen2 / Qwen3 (NFC, the Qwen Split regex, ByteLevel without its regex, specials, an appended
<|endoftext|>), the file transformers' Qwen2Tokenizer writes, GPT-2 (ByteLevel with its
regex), Llama-3 (its regex, ignore_merges, a BOS template) and RoBERTa (RobertaProcessing,
an lstrip <mask>). Every comparison fails on the first differing id: torture strings (emoji
ZWJ sequences and flags, combining marks, mixed scripts, whitespace runs, 10k-character
words, digits, contractions, special tokens inside text, empty strings), seeded random
Unicode, every codepoint in context for the pre-tokenizer and NFC, truncation, packing and
streaming as the WordPiece path does them, and the files that must fall back to HF.
"""

from __future__ import annotations

import copy
import functools
import json
import random
import tempfile
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tokenizers")
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
from tokenizers import Regex, normalizers, pre_tokenizers, processors, trainers  # noqa: E402
from tokenizers import Tokenizer as HF  # noqa: E402
from tokenizers.models import BPE  # noqa: E402

from zoi.errors import InputError  # noqa: E402
from zoi.frontend import bpe  # noqa: E402
from zoi.frontend.tokenizer import Tokenizer  # noqa: E402

_cpu = pytest.importorskip("zoi._cpu")
if not hasattr(_cpu, "ByteBPE"):  # pragma: no cover - a core built before it
    pytest.skip("the native core has no ByteBPE", allow_module_level=True)

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def _train(pre, norm, specials, vocab_size: int = 4000, alphabet: bool = True) -> HF:
    tok = HF(BPE())
    tok.normalizer = norm
    tok.pre_tokenizer = pre
    tr = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet() if alphabet else [],
        show_progress=False,
    )
    # the corpus plus a few lines of each script the torture set uses, so merges exist there
    extra = ["नमस्ते दुनिया", "สวัสดีชาวโลก", "مرحبا بالعالم", "안녕하세요 세계", "こんにちは世界"]
    tok.train_from_iterator(corpus() + extra * 20, tr)
    return tok


def _split(regex: str):
    return pre_tokenizers.Split(Regex(regex), behavior="isolated")


def _byte_level(use_regex: bool):
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=use_regex)


@functools.cache
def variant_json(name: str) -> str:
    """A tokenizer.json (text) by name; each one runs on the native tokenizer."""
    if name == "qwen3":  # Qwen3-Embedding: <|endoftext|> appended by the template
        tok = _train(
            pre_tokenizers.Sequence([_split(bpe.QWEN2_REGEX), _byte_level(False)]),
            normalizers.NFC(),
            SPECIALS,
        )
        tok.post_processor = processors.TemplateProcessing(
            single="$A <|endoftext|>", special_tokens=[("<|endoftext|>", 0)]
        )
        return tok.to_str()
    if name == "qwen2-transformers":  # the file transformers writes for Qwen2Tokenizer
        from transformers import AddedToken, Qwen2Tokenizer

        d = json.loads(variant_json("qwen3"))
        q = Qwen2Tokenizer(
            vocab=d["model"]["vocab"], merges=[tuple(m) for m in d["model"]["merges"]]
        )
        q.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
        # a normalized added token (matched after NFC) and a raw-text non-special one
        q.add_tokens(["<tool_call>", AddedToken("</think>", normalized=False, special=False)])
        with tempfile.TemporaryDirectory() as out:
            q.save_pretrained(out)
            return (Path(out) / "tokenizer.json").read_text(encoding="utf-8")
    if name == "gpt2":
        tok = _train(_byte_level(True), None, ["<|endoftext|>"])
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
        return tok.to_str()
    if name == "llama3":
        tok = _train(
            pre_tokenizers.Sequence([_split(bpe.LLAMA3_REGEX), _byte_level(False)]),
            None,
            ["<|begin_of_text|>", "<|end_of_text|>"],
        )
        tok.post_processor = processors.Sequence(
            [
                processors.ByteLevel(trim_offsets=False),
                processors.TemplateProcessing(
                    single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", 0)]
                ),
            ]
        )
        tj = json.loads(tok.to_str())
        tj["model"]["ignore_merges"] = True
        return json.dumps(tj)
    if name == "roberta":
        tok = _train(_byte_level(True), None, ["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
        tj = json.loads(tok.to_str())
        for a in tj["added_tokens"]:
            a["lstrip"] = a["content"] == "<mask>"
        tj["post_processor"] = {
            "type": "RobertaProcessing",
            "sep": ["</s>", 2],
            "cls": ["<s>", 0],
            "trim_offsets": True,
            "add_prefix_space": False,
        }
        return json.dumps(tj)
    if name == "nested":  # the Qwen Split, then ByteLevel's own GPT-2 regex on each piece
        tok = _train(
            pre_tokenizers.Sequence([_split(bpe.QWEN2_REGEX), _byte_level(True)]),
            normalizers.Sequence([normalizers.NFC()]),
            SPECIALS,
        )
        return tok.to_str()
    raise KeyError(name)


VARIANTS = ["qwen3", "qwen2-transformers", "gpt2", "llama3", "roberta", "nested"]


# ---- the torture set and the random strings ----

# the 25 characters of HF's \s (White_Space), a few runs of them, and 5 that are not \s
WS = [
    " ", "  ", "\t", "\n", "\r", "\r\n", "\x0b", "\x0c", "\x85", "\xa0", "\u1680",
    *(chr(c) for c in range(0x2000, 0x200B)), "\u2028", "\u2029", "\u202f", "\u205f", "\u3000",
    "\x1c", "\x1f", "\u200b", "\u180e", "\ufeff",
]  # fmt: skip
MARKS = [chr(c) for c in range(0x300, 0x370)] + [
    "\u0591", "\u05b0", "\u064b", "\u0651", "\u093c", "\u094d", "\u0e31", "\u0e48", "\u1ab0",
    "\u20d0", "\u20e3", "\ufe20", "\u0334", "\u0338", "\u0344", "\u0f73", "\u0f71", "\u0f72",
    "\u302a", "\U0001d165", "\U0001d16d",
]  # fmt: skip
COMPOSING = [
    "e", "E", "a", "o", "u", "i", "n", "s", "<", "=", "\u00e9", "\u00c5", "\u212b", "\u1e9b",
    "\u1100", "\u1161", "\u11a8", "\uac00", "\uac01", "\u0b47", "\u0b3e", "\u0b57", "\u09c7",
    "\u09be", "\u0915", "\u0928", "\u0cc6", "\u0cd5", "\u0cc2", "\u1025", "\u102e",
    "\U00011935", "\U00011930", "\U00011938", "\u0fb2", "\u0f80", "\u2adc",
]  # fmt: skip
SCRIPTS = [
    "中文字符测试", "日本語のテキスト", "カタカナ", "한국어 텍스트", "العربية", "עברית",
    "हिन्दी पाठ", "ภาษาไทย", "Ελληνικά", "Русский", "Tiếng Việt", "ქართული", "አማርኛ",
    "𝕳𝖊𝖑𝖑𝖔", "ｆｕｌｌｗｉｄｔｈ", "Ⅻ ½ ² ٣ ३ 𝟘 ⑦",
]  # fmt: skip
EMOJI = [
    "👍", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇯🇵", "🇺🇸🇫🇷", "1️⃣", "❤️", "🧑🏿‍💻", "\u200d",
    "\ufe0f", "😀😃😄",
]  # fmt: skip
CONTRACTIONS = ["'", "'s", "'S", "'t", "'re", "'RE", "'Ve", "'ll", "'LL", "'lL", "'d", "'M",
                "ſ", "'ſ", "'x", "''", "’s"]  # fmt: skip
SPECIAL_BITS = SPECIALS + ["<|im", "|>", "<tool_call>", "</think>", "<mask>", "<s>", "</s>",
                           "<|begin_of_text|>"]  # fmt: skip


def torture() -> list[str]:
    t = [
        "", " ", "  ", "\n", "\r\n", "a", "hello world", "Hello, World!", "  leading", "trailing  ",
        "a  b   c    d", "x \t y", "tabs\t\tand\tnewlines\n\n\n", "line1\r\nline2\r\n\r\n  x",
        "ends with newline\n", "spaces then newline   \n   next", "\n\n\n", " \n \n ", "\t\n",
        "I'm you're he's they've we'll she'd it's", "I'M YOU'RE HE'S THEY'VE WE'LL SHE'D",
        "Don'T wOn'T cAn'T", "'s 't 're 've 'm 'll 'd", "ſ'ſ 'ſt", "rock'n'roll", "''quoted''",
        "12345", "1,234,567.89", "3.14159 2.71828", "٣٤٥ ३४५ 一二三", "x1y22z333w4444",
        "email@example.com", "https://example.com/path?q=1&b=2#frag", "C:\\Users\\x",
        "def f(x):\n    return x ** 2\n", "{\"json\": [1, 2, 3]}", "SELECT * FROM t;",
        "$100 €50 ¥1000 £20", "...!!!???", "--- *** ___", "a.b.c", "(parens) [brackets]",
        "café naïve résumé", "cafe\u0301 nai\u0308ve", "e\u0301\u0323 e\u0323\u0301",
        "\u1100\u1161\u11a8", "\u212b \u2126 \u00c5", "Z\u0351\u0352\u0353a\u035b\u035cl",
        "x" * 10000, "ab" * 5000, "1" * 10000, " " * 10000, "\n" * 5000, "中" * 10000,
        "😀" * 3000, "e\u0301" * 4000, "'s" * 3000, "a " * 5000, "é" * 6000,
        "<|endoftext|>", "text<|endoftext|>more", "<|im_start|>user\nhi<|im_end|>\n",
        "<|im_start|><|im_end|><|endoftext|>", "<|im_start", "<<|im_start|>>", "x<tool_call>y",
        "</think>after", " <mask> mask <mask>", "a<mask>b", "\t<mask>\n",
    ]  # fmt: skip
    t += SCRIPTS + EMOJI + CONTRACTIONS + WS + COMPOSING
    t += [" ".join(SCRIPTS), "".join(SCRIPTS), " ".join(EMOJI), "".join(MARKS)]
    t += ["e" + "".join(MARKS) * 50, "\u1100" + "\u0334\u0301\u0323" * 2000]  # long mark runs
    t += ["a" + m + "b" for m in MARKS]
    t += [w + x + w for w in WS for x in ("a", "1", ".", "'s", "中")]
    return t


def random_texts(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    pools = [
        (30, lambda: rng.choice("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")),
        (8, lambda: rng.choice("0123456789")),
        (10, lambda: rng.choice(".,;:!?-_'\"()[]{}<>/\\|@#$%^&*+=~`")),
        (15, lambda: " "),
        (6, lambda: rng.choice(WS)),
        (5, lambda: rng.choice(CONTRACTIONS)),
        (5, lambda: rng.choice(MARKS)),
        (5, lambda: rng.choice(COMPOSING)),
        (6, lambda: rng.choice(SCRIPTS)[: rng.randint(1, 6)]),
        (4, lambda: rng.choice(EMOJI)),
        (3, lambda: rng.choice(SPECIAL_BITS)),
        (4, lambda: chr(rng.choice([rng.randrange(0x80, 0x800), rng.randrange(0x800, 0xD800)]))),
        (3, lambda: chr(rng.randrange(0xE000, 0x110000))),
        (3, lambda: rng.choice(corpus()).split(" ")[0]),
    ]
    weights = [w for w, _ in pools]
    out = []
    for _ in range(n):
        k = rng.choice([0, 1, 2, 5, 10, 20, 40, 80])
        out.append("".join(rng.choices(pools, weights)[0][1]() for _ in range(k)))
    return out


# ---- tests ----


@pytest.mark.parametrize("name", VARIANTS)
def test_variant_runs_natively(name):
    t = Tokenizer(variant_json(name), 512)
    assert t.native is not None and t.kind == "native byte-level BPE", t.kind


@pytest.mark.parametrize("name", VARIANTS)
def test_torture_equals_hf(name):
    assert assert_same(variant_json(name), torture()) > 400


@pytest.mark.parametrize("name", VARIANTS)
def test_random_unicode_equals_hf(name):
    assert assert_same(variant_json(name), random_texts(3000, seed=VARIANTS.index(name))) == 3000


@pytest.mark.parametrize("name", ["qwen3", "gpt2", "llama3"])
def test_corpora_equal_hf(name):
    lines = corpus()
    texts = lines + [" ".join(lines[i : i + 40]) for i in range(0, len(lines), 40)]
    assert_same(variant_json(name), texts)


def _splitter(kind: int, nfc: bool = False):
    return _cpu.ByteBPE(
        vocab=["a"], ids=[0], merges=[], paired=False, added=[], added_ids=[], added_flags=[],
        norm_added=[], norm_added_ids=[], norm_added_flags=[], splits=[kind], nfc=nfc,
        ignore_merges=False, unk_id=-1, fuse_unk=False, head=[], tail=[], max_len=8,
    )  # fmt: skip


@pytest.mark.parametrize("regex", list(bpe.SPLIT_REGEXES))
def test_pre_tokenizer_pieces_equal_hf(regex):
    nat = _splitter(bpe.SPLIT_REGEXES[regex])
    hf = _split(regex)
    for t in torture() + random_texts(2000, seed=7) + corpus()[:500]:
        assert nat.pre_tokenize(t) == [p for p, _ in hf.pre_tokenize_str(t)], repr(t[:200])


def _codepoint_blocks(every: int):
    cps = [c for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]
    for k, base in enumerate(range(0, len(cps), 2048)):
        if k % every == 0:
            yield cps[base : base + 2048]


def _pieces_context(block) -> str:
    # each codepoint alone, between letters, doubled, after a space and a digit, after an
    # apostrophe, around a newline
    return "".join(f"{chr(c)}a{chr(c)}{chr(c)} 1{chr(c)}'{chr(c)}\n {chr(c)}" for c in block)


def _nfc_context(block) -> str:
    # each codepoint with marks of classes 230 / 220 / 1 around it, after a Hangul L jamo and
    # before a T jamo
    return "".join(
        f"{chr(c)}\u0301e{chr(c)}\u0323\u0302\u1100{chr(c)}\u11a8{chr(c)}\u0334\u0301a"
        for c in block
    )


def _check_codepoints(every: int):
    nfc = normalizers.NFC()
    nat_nfc = _splitter(0, nfc=True)
    for regex, kind in bpe.SPLIT_REGEXES.items():
        nat, hf = _splitter(kind), _split(regex)
        for block in _codepoint_blocks(every):
            s = _pieces_context(block)
            assert nat.pre_tokenize(s) == [p for p, _ in hf.pre_tokenize_str(s)], hex(block[0])
    for block in _codepoint_blocks(every):
        s = _nfc_context(block)
        assert nat_nfc.normalize(s) == nfc.normalize_str(s), hex(block[0])


def test_codepoints_sampled():
    """A sixteenth of the codepoints (every 16th block of 2048) in context: the classes of
    the regexes (\\p{L}, \\p{N}, \\s) and NFC as HF has them."""
    _check_codepoints(every=16)


@pytest.mark.slow
def test_every_codepoint():
    _check_codepoints(every=1)


def test_nfc_is_hf_nfc_on_random_text():
    nat = _splitter(0, nfc=True)
    nfc = normalizers.NFC()
    for t in torture() + random_texts(3000, seed=11):
        assert nat.normalize(t) == nfc.normalize_str(t), repr(t[:200])


def test_long_words_and_many_merges():
    """Words far over the short-word path (64 symbols): HF's own priority queue order."""
    js = variant_json("qwen3")
    rng = random.Random(3)
    words = ["".join(rng.choice("abcdefghij") for _ in range(n)) for n in (65, 100, 1000, 10000)]
    words += ["".join(rng.choice(corpus()).replace(" ", "") for _ in range(30))]
    words += ["the" * 3000, "ing" * 2000, "ab" * 33, "aaaa" * 17]
    # words of 1 to 200 letters from a few frequent ones: many merges, on both sides of 64
    words += ["".join(rng.choices("etaoinsrhl", k=rng.randint(1, 200))) for _ in range(1000)]
    assert_same(js, words + [" ".join(words[:50])])


@pytest.mark.parametrize("name", ["qwen3", "roberta", "gpt2"])
def test_truncation_and_packing_as_hf(name):
    """encode_packed (ids, positions, cu_seqlens) equal to the HF path's, truncated at the
    model's limit and at smaller engine limits, with a position offset (RoBERTa's 2)."""
    nat, ref = wrapper_pair(variant_json(name), 64, offset=2)
    texts = torture()[:150] + random_texts(300, seed=5) + corpus()[:200]
    texts = [t for t in texts if len(t) < 2000]  # the HF path caps characters, not tokens
    for max_len in (None, 2, 3, 7, 16, 63):
        a = nat.encode_packed(texts, truncate=True, max_len=max_len)
        b = ref.encode_packed(texts, truncate=True, max_len=max_len)
        for x, y in zip(a, b, strict=True):
            np.testing.assert_array_equal(x, y)
            assert x.dtype == np.int32
    assert [len(x) for x in nat.encode_ids(texts)] == nat.count_tokens(texts)


def test_truncation_of_huge_text_stops_early():
    nat = Tokenizer(variant_json("qwen3"), 32)
    ids = nat.encode_ids(["word " * 400_000])[0]
    assert len(ids) == 32 and ids[-1] == 0  # 31 content tokens + <|endoftext|>
    want = hf_ids(variant_json("qwen3"), ["word " * 100])[0][:31] + [0]
    assert ids.tolist() == want


def test_over_the_limit_names_the_text():
    nat, ref = wrapper_pair(variant_json("qwen3"), 16)
    texts = ["short", "a long text " * 20, "short too"]
    for t in (nat, ref):
        with pytest.raises(InputError, match=r"texts\[1\] has \d+ tokens"):
            t.encode_packed(texts, truncate=False)
    ok = ["short", "<|im_start|>user<|im_end|>"]
    for x, y in zip(nat.encode_packed(ok, False), ref.encode_packed(ok, False), strict=True):
        np.testing.assert_array_equal(x, y)


def test_stream_chunks_equal_packing():
    nat = Tokenizer(variant_json("qwen3"), 128)
    texts = random_texts(400, seed=9) + corpus()[:300]
    assert_stream_equals_packing(nat, texts)


def test_threads_give_the_same_ids():
    nat = native_of(variant_json("qwen3"))
    texts = random_texts(2000, seed=13) + corpus()
    assert native_ids(nat, texts, nthreads=1) == native_ids(nat, texts, nthreads=2)
    assert native_ids(nat, texts, nthreads=0) == native_ids(nat, texts, nthreads=1)


def test_lone_surrogate_is_an_input_error():
    nat = Tokenizer(variant_json("qwen3"), 64)
    with pytest.raises(InputError, match=r"texts\[1\].*surrogate"):
        nat.encode_packed(["ok", "bad \ud800 text"])


def test_merges_as_strings_and_version_line():
    """Both merges formats give the same ids; a "#version" line is skipped as HF skips it."""
    texts = torture()[:200] + random_texts(500, seed=17)

    def strings(tj):
        tj["model"]["merges"] = ["#version: 0.2"] + [" ".join(m) for m in tj["model"]["merges"]]

    js = mutated(variant_json("qwen3"), strings)
    assert isinstance(json.loads(js)["model"]["merges"][1], str)
    assert_same(js, texts)
    assert native_ids(native_of(js), texts) == native_ids(native_of(variant_json("qwen3")), texts)


@pytest.mark.parametrize("unk", [None, "<unk>"])
@pytest.mark.parametrize("fuse", [False, True])
def test_bytes_without_a_symbol(unk, fuse):
    """A vocabulary without the bytes of non-ASCII text: [UNK] (fused or not), or dropped."""
    pre = pre_tokenizers.Sequence([_split(bpe.QWEN2_REGEX), _byte_level(False)])
    tok = HF(BPE())
    tok.pre_tokenizer = pre
    tr = trainers.BpeTrainer(vocab_size=600, special_tokens=["<unk>"], show_progress=False)
    tok.train_from_iterator([x for x in corpus() if x.isascii()], tr)
    tj = json.loads(tok.to_str())
    tj["model"]["unk_token"] = unk
    tj["model"]["fuse_unk"] = fuse
    js = json.dumps(tj)
    texts = ["café", "naïve 中文 x", "ü", "üü ü", "日本語", "abc€def"]
    assert_same(js, texts + random_texts(500, seed=19))


@pytest.mark.parametrize("flags", [(True, False), (False, True), (True, True)])
def test_lstrip_rstrip_added_tokens(flags):
    lstrip, rstrip = flags

    def strip(tj):
        for a in tj["added_tokens"]:
            if a["content"] == "<|im_start|>":
                a["lstrip"], a["rstrip"] = lstrip, rstrip
            if a["content"] == "<|im_end|>":  # matched after NFC, stripping too
                a["normalized"], a["lstrip"], a["rstrip"] = True, rstrip, lstrip

    js = mutated(variant_json("qwen3"), strip)
    ws = "".join(WS)
    texts = [f"a{w}<|im_start|>{w}b{w}<|im_end|>{w}c" for w in WS + [ws, "  \n ", ""]] + [
        "<|im_start|>",
        "  <|im_start|>  ",
        "<|im_start|><|im_end|>  <|im_start|>",
        " <|im_end|>",
    ]
    assert_same(js, texts + random_texts(500, seed=23))


def test_overlapping_and_normalized_added_tokens():
    """Leftmost-longest among tokens that prefix each other; a normalized token matched by
    its NFC form (its content is not NFC) in the NFC text, a raw one only as written."""

    def add(tj):
        n = max(tj["model"]["vocab"].values()) + 1
        extra = [
            ("<|im", False, True),
            ("<|im_start|>x", False, True),
            ("cafe\u0301!", True, False),  # matches "café!" in the text, either spelling
            ("e\u0301?", False, False),  # raw: only "e\u0301?" as written
        ]
        for k, (content, normalized, special) in enumerate(extra):
            tj["added_tokens"].append(
                {"id": n + k, "content": content, "single_word": False, "lstrip": False,
                 "rstrip": False, "normalized": normalized, "special": special}
            )  # fmt: skip

    js = mutated(variant_json("qwen3"), add)
    texts = [
        "<|im_start|>x <|im_start|> <|im <|im_end|> <|im_start|>xx",
        "café! cafe\u0301! cafe\u0301\u0301! CAFÉ! café!!",
        "e\u0301? é? e\u0301\u0301? e\u0301?e\u0301?",
    ]
    t = Tokenizer(js, 512)
    assert t.native is not None, t.kind
    assert_same(js, texts + random_texts(300, seed=31))


@pytest.mark.parametrize(
    "mutate, reason",
    [
        (lambda tj: tj.update(pre_tokenizer={"type": "Whitespace"}), "pre-tokenizer 'Whitespace'"),
        (lambda tj: tj.update(normalizer={"type": "NFKC"}), "normalizer 'NFKC'"),
        (lambda tj: tj.update(normalizer={"type": "Lowercase"}), "normalizer 'Lowercase'"),
        (lambda tj: tj["pre_tokenizer"]["pretokenizers"][1].update(add_prefix_space=True),
         "add_prefix_space"),
        (lambda tj: tj["pre_tokenizer"]["pretokenizers"][0]["pattern"].update(Regex=r"\s+"),
         "regex"),
        (lambda tj: tj["pre_tokenizer"]["pretokenizers"][0].update(behavior="Removed"),
         "Isolated"),
        (lambda tj: tj["pre_tokenizer"]["pretokenizers"][0].update(invert=True), "Isolated"),
        (lambda tj: tj["model"].update(dropout=0.5), "dropout"),
        (lambda tj: tj["model"].update(byte_fallback=True), "byte_fallback"),
        (lambda tj: tj["model"].update(continuing_subword_prefix="##"), "prefix"),
        (lambda tj: tj["added_tokens"][1].update(single_word=True), "single_word"),
        (lambda tj: tj["added_tokens"][1].update(id=77), "HF gives it"),
        (lambda tj: tj.update(post_processor={"type": "Unknown"}), "post-processor 'Unknown'"),
    ],
)  # fmt: skip
def test_fallback_reasons_and_ids(mutate, reason):
    """Anything the native tokenizer does not do exactly runs on HF (never a different id)."""
    js = mutated(variant_json("qwen3"), mutate)
    tj = json.loads(js)
    assert isinstance(bpe.native_config(tj, 512), str)
    try:
        HF.from_str(js)
    except BaseException as e:  # HF refuses it too (an error, or a Rust panic): the wrapper
        if isinstance(e, KeyboardInterrupt):  # raises; nothing to compare
            raise
        return
    t = Tokenizer(js, 512)
    assert t.native is None and reason in t.kind and "model type 'BPE'" in t.kind, t.kind
    texts = torture()[:100]
    with pytest.raises(Exception, match="tokenizer='native'"):
        Tokenizer(js, 512, tokenizer="native")
    if reason == "dropout":  # random merges: two HF runs differ too
        return
    want = hf_ids(js, texts, 512)
    assert [x.tolist() for x in t.encode_ids(texts)] == want


def test_merge_outside_the_vocab_falls_back_to_hf_error():
    def bad(tj):
        tj["model"]["merges"].append(["zzzq", "qqqz"])

    js = mutated(variant_json("qwen3"), bad)
    with pytest.raises(ValueError, match="not in the vocabulary"):
        native_of(js)
    with pytest.raises(Exception):  # noqa: B017 - HF refuses the file: the wrapper names it
        Tokenizer(js, 512)


def test_gpt2_byte_level_regex_is_the_split_regex():
    """ByteLevel(use_regex=True) splits as Split(GPT2_REGEX) then maps bytes: the native
    tokenizer runs both configurations as one."""
    a = HF.from_str(variant_json("gpt2"))
    tj = json.loads(variant_json("gpt2"))
    tj["pre_tokenizer"] = {
        "type": "Sequence",
        "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": bpe.GPT2_REGEX}, "behavior": "Isolated",
             "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
             "use_regex": False},
        ],
    }  # fmt: skip
    b = HF.from_str(json.dumps(tj))
    texts = torture()[:200] + random_texts(300, seed=29)
    assert [e.ids for e in a.encode_batch(texts)] == [e.ids for e in b.encode_batch(texts)]
    assert_same(json.dumps(tj), texts)


def test_variant_files_are_independent():
    """The cached files are not changed by the tests that mutate copies of them."""
    before = copy.deepcopy(json.loads(variant_json("qwen3")))
    mutated(variant_json("qwen3"), lambda tj: tj.update(normalizer=None))
    assert json.loads(variant_json("qwen3")) == before
