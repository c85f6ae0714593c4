"""Which tokenizer.json files the native SentencePiece-family tokenizer
(zoi._cpu.SentencePiece) runs exactly: Unigram (XLM-R, BGE-M3, jina-embeddings-v3,
multilingual-e5) and SentencePiece BPE (Gemma, EmbeddingGemma, Llama-2).

`native_config` reads the parsed JSON and returns the native tokenizer's arguments, or the
reason it cannot run that file (then HF `tokenizers` does). Covered exactly, as transformers
and the hub files write them:
- normalizer: none, or a Sequence of Precompiled (sentencepiece's charsmap, one per file),
  Replace (a literal, or the regexes " {2,}", " +", "\\A +| +\\z" and "\\A" + a literal),
  Strip and Prepend;
- pre-tokenizer: none, or a Sequence of WhitespaceSplit, Split (a literal; Removed, Isolated,
  MergedWithPrevious or MergedWithNext; not inverted) and Metaspace (prepend_scheme always or
  never; first when there is no normalizer; split or not);
- model Unigram (with unk_id; byte_fallback or not) or BPE (merges in either format,
  byte_fallback, unk_token / fuse_unk, ignore_merges; no dropout, prefix or suffix);
- added tokens and post-processors as zoi.frontend.bpe reads them.
tests/test_unigram_tokenizer.py and tests/test_sp_bpe_tokenizer.py check the ids against HF.
"""

from __future__ import annotations

import base64
import binascii
import struct
from typing import Any

from zoi.frontend import bpe
from zoi.frontend.bpe import _is_id

# csrc/tokenizer/sentencepiece.h: NormStep / PreStep kinds
PRECOMPILED, REPLACE, SPACES, EDGE_SPACES, LEAD, STRIP, PREPEND = range(7)
WHITESPACE_SPLIT, SPLIT, METASPACE = range(3)
SPLIT_BEHAVIORS = {"Removed": 0, "Isolated": 1, "MergedWithPrevious": 2, "MergedWithNext": 3}
SCHEMES = {"always": 0, "first": 1, "never": 2}
SPACE_RUNS = {" {2,}": 2, "  +": 2, " +": 1, " {1,}": 1}
EDGE_SPACES_REGEX = r"\A +| +\z"
REPLACEMENT = "\u2581"


def _flat(node: Any, key: str) -> list | str:
    """The steps of a (possibly nested) Sequence, or why not."""
    if node is None:
        return []
    if not isinstance(node, dict):
        return "malformed step"
    if node.get("type") == "Sequence":
        subs = node.get(key)
        if not isinstance(subs, list):
            return "malformed Sequence"
        out: list = []
        for s in subs:
            r = _flat(s, key)
            if isinstance(r, str):
                return r
            out += r
        return out
    return [node]


def _normalizer(norm: Any) -> tuple[list[tuple[int, str, str, int]], bytes] | str:
    """(steps, charsmap) or why not."""
    steps = _flat(norm, "normalizers")
    if isinstance(steps, str):
        return f"normalizer: {steps}"
    out: list[tuple[int, str, str, int]] = []
    blob = b""
    for st in steps:
        kind = st.get("type")
        if kind == "Precompiled":
            raw = st.get("precompiled_charsmap")
            if not isinstance(raw, str) or not raw:
                return "normalizer Precompiled without a charsmap"
            try:
                b = base64.b64decode(raw, validate=True)
            except (binascii.Error, ValueError):
                return "normalizer Precompiled charsmap is not base64"
            if blob and b != blob:
                return "normalizer with two different Precompiled charsmaps"
            blob = b
            out.append((PRECOMPILED, "", "", 0))
        elif kind == "Replace":
            pat, content = st.get("pattern"), st.get("content")
            if not isinstance(pat, dict) or len(pat) != 1 or not isinstance(content, str):
                return "malformed normalizer Replace"
            ((pk, pv),) = pat.items()
            if not isinstance(pv, str) or not pv:
                return "normalizer Replace with an empty pattern"
            if pk == "String":
                out.append((REPLACE, pv, content, 0))
            elif pk == "Regex" and pv in SPACE_RUNS:
                out.append((SPACES, "", content, SPACE_RUNS[pv]))
            elif pk == "Regex" and pv == EDGE_SPACES_REGEX:
                out.append((EDGE_SPACES, "", content, 0))
            elif pk == "Regex" and pv.startswith("\\A") and _plain(pv[2:]):
                out.append((LEAD, pv[2:], content, 0))
            else:
                return f"normalizer Replace with the regex {pv!r}"
        elif kind == "Strip":
            left, right = st.get("strip_left", False), st.get("strip_right", False)
            if not isinstance(left, bool) or not isinstance(right, bool):
                return "malformed normalizer Strip"
            if left or right:
                out.append((STRIP, "", "", int(left) | int(right) << 1))
        elif kind == "Prepend":
            pre = st.get("prepend")
            if not isinstance(pre, str):
                return "malformed normalizer Prepend"
            if pre:
                out.append((PREPEND, pre, "", 0))
        else:
            return f"normalizer {kind!r} (the native SentencePiece tokenizer runs Precompiled, Replace, Strip, Prepend)"
    return out, blob


def _plain(s: str) -> bool:
    """A regex body that is a literal: no metacharacter at all."""
    return bool(s) and not any(ch in s for ch in ".^$*+?{}[]\\|()")


def _pre_tokenizer(pre: Any, has_norm: bool) -> list[tuple[int, str, int, bool]] | str:
    steps = _flat(pre, "pretokenizers")
    if isinstance(steps, str):
        return f"pre-tokenizer: {steps}"
    out: list[tuple[int, str, int, bool]] = []
    for st in steps:
        kind = st.get("type")
        if kind == "WhitespaceSplit":
            out.append((WHITESPACE_SPLIT, "", 0, False))
        elif kind == "Split":
            pat = st.get("pattern")
            lit = pat.get("String") if isinstance(pat, dict) and len(pat) == 1 else None
            if not isinstance(lit, str) or not lit:
                return "pre-tokenizer Split with a regex or an empty pattern"
            behavior = st.get("behavior")
            if behavior not in SPLIT_BEHAVIORS or st.get("invert", False) is not False:
                return f"pre-tokenizer Split {behavior!r}"
            out.append((SPLIT, lit, SPLIT_BEHAVIORS[behavior], False))
        elif kind == "Metaspace":
            rep = st.get("replacement")
            if not isinstance(rep, str) or len(rep) != 1:
                return "Metaspace replacement is not one character"
            scheme = st.get("prepend_scheme", "always")
            if st.get("add_prefix_space") is False and scheme != "never":  # HF refuses it
                return "Metaspace add_prefix_space false with a prepend_scheme"
            if scheme not in SCHEMES:
                return f"Metaspace prepend_scheme {scheme!r}"
            if scheme == "first" and has_norm:
                return "Metaspace prepend_scheme 'first' after a normalizer"
            split = st.get("split", True)
            if not isinstance(split, bool):
                return "malformed Metaspace"
            out.append((METASPACE, rep, SCHEMES[scheme], split))
        else:
            return f"pre-tokenizer {kind!r} (the native SentencePiece tokenizer runs WhitespaceSplit, Split, Metaspace)"
    return out


def _merges(model: dict) -> tuple[list[str], list[tuple[str, str]]] | str:
    """BPE merges as (left, right) pairs in rank order, read as HF reads them."""
    merges = model.get("merges") or []
    if not isinstance(merges, list):
        return "BPE merges is not a list"
    pairs: list[tuple[str, str]] = []
    for m in merges:
        if isinstance(m, str):
            if m.startswith("#version"):
                continue
            parts = m.split(" ")
            if len(parts) != 2:
                return "a BPE merge that is not two tokens"
            pairs.append((parts[0], parts[1]))
        elif isinstance(m, list) and len(m) == 2 and all(isinstance(x, str) for x in m):
            pairs.append((m[0], m[1]))
        else:
            return "malformed BPE merges"
    return [x for p in pairs for x in p], pairs


def native_config(tj: Any, max_len: int) -> dict | str:
    """Arguments of zoi._cpu.SentencePiece for this tokenizer.json (parsed), or why it can't run."""
    if not isinstance(tj, dict):
        return "tokenizer.json is not an object"
    model = tj.get("model")
    kind = model.get("type") if isinstance(model, dict) else None
    if kind not in ("Unigram", "BPE"):
        return f"model type {kind!r}"
    scores: list[float] = []
    merges: list[str] = []
    cut = ""
    fuse_unk = byte_fallback = ignore_merges = False
    if kind == "Unigram":
        items = model.get("vocab")
        if not isinstance(items, list) or not items:
            return "Unigram without a vocabulary"
        vocab: dict[str, int] = {}
        for i, it in enumerate(items):
            if (
                not isinstance(it, list)
                or len(it) != 2
                or not isinstance(it[0], str)
                or not isinstance(it[1], (int, float))
                or isinstance(it[1], bool)
            ):
                return "malformed Unigram vocabulary"
            if it[0] in vocab:
                return f"Unigram vocabulary with the piece {it[0]!r} twice"
            vocab[it[0]] = i
            scores.append(float(it[1]))
        unk = model.get("unk_id")
        if unk is None:
            return "Unigram without unk_id (HF fails on unknown characters)"
        if not _is_id(unk) or unk >= len(items):
            return "Unigram unk_id outside the vocabulary"
        unk_id = unk
        byte_fallback = model.get("byte_fallback", False)
        if not isinstance(byte_fallback, bool):
            return "unusual Unigram options"
    else:
        vocab = model.get("vocab")
        if not isinstance(vocab, dict) or not vocab:
            return "BPE without a vocabulary"
        ids = list(vocab.values())
        if not all(_is_id(v) for v in ids) or len(set(ids)) != len(ids):
            return "BPE vocabulary ids are not distinct non-negative ints"
        if model.get("dropout") is not None:
            return "BPE dropout"
        if model.get("continuing_subword_prefix") or model.get("end_of_word_suffix"):
            return "BPE continuing-subword prefix or end-of-word suffix"
        unk = model.get("unk_token")
        if unk is not None and (not isinstance(unk, str) or unk not in vocab):
            return "BPE unk_token missing from the vocabulary"
        unk_id = -1 if unk is None else vocab[unk]
        fuse_unk = model.get("fuse_unk", False)
        byte_fallback = model.get("byte_fallback", False)
        ignore_merges = model.get("ignore_merges", False)
        if not all(isinstance(v, bool) for v in (fuse_unk, byte_fallback, ignore_merges)):
            return "unusual BPE options"
        r = _merges(model)
        if isinstance(r, str):
            return r
        merges, pairs = r
        # a word can be cut before each "▁" that follows another character when no merge
        # joins across such a point (SentencePiece's merges never do; "▁▁" runs stay whole)
        if REPLACEMENT in vocab and not any(
            b.startswith(REPLACEMENT) and not a.endswith(REPLACEMENT) for a, b in pairs
        ):
            cut = REPLACEMENT

    # the pre-tokenizer first: it tells the family apart (a byte-level file's reason names it)
    norm = _normalizer(tj.get("normalizer"))
    pre = _pre_tokenizer(tj.get("pre_tokenizer"), isinstance(norm, str) or bool(norm[0]))
    if isinstance(pre, str):
        return pre
    if isinstance(norm, str):
        return norm
    steps, blob = norm
    specials = bpe.specials_config(tj, vocab, max_len)
    if isinstance(specials, str):
        return specials
    return dict(
        unigram=kind == "Unigram",
        vocab=list(vocab.keys()),
        ids=list(vocab.values()),
        scores=scores,
        merges=merges,
        charsmap=blob,
        norm_kinds=[s[0] for s in steps],
        norm_a=[s[1] for s in steps],
        norm_b=[s[2] for s in steps],
        norm_n=[s[3] for s in steps],
        pre_kinds=[p[0] for p in pre],
        pre_a=[p[1] for p in pre],
        pre_n=[p[2] for p in pre],
        pre_split=[int(p[3]) for p in pre],
        unk_id=unk_id,
        byte_fallback=byte_fallback,
        fuse_unk=fuse_unk,
        ignore_merges=ignore_merges,
        cut=cut,
        **specials,
    )


def is_sentencepiece_bpe(tj: Any) -> bool:
    """A BPE file for this tokenizer rather than the byte-level one: no ByteLevel
    pre-tokenizer step."""
    steps = _flat(tj.get("pre_tokenizer") if isinstance(tj, dict) else None, "pretokenizers")
    return isinstance(steps, list) and not any(s.get("type") == "ByteLevel" for s in steps)


def charsmap(mapping: dict[str, str]) -> bytes:
    """A precompiled_charsmap (darts-clone double array over the keys' UTF-8, then the
    NUL-ended replacements) mapping each key to its replacement: the format sentencepiece
    writes and HF's Precompiled reads, for tests and tools."""
    blob = bytearray()
    where: dict[str, int] = {}
    nodes: list[dict[int, int]] = [{}]
    term: list[int | None] = [None]
    for key, rep in sorted(mapping.items()):
        kb = key.encode()
        if not kb:
            continue
        if rep not in where:
            where[rep] = len(blob)
            blob += rep.encode() + b"\0"
        n = 0
        for b in kb:
            if b not in nodes[n]:
                nodes[n][b] = len(nodes)
                nodes.append({})
                term.append(None)
            n = nodes[n][b]
        term[n] = where[rep]
    units: dict[int, int] = {}
    used = {0}
    slot = {0: 0}
    queue = [0]
    low = 256
    for n in queue:
        p = slot[n]
        labels = sorted(nodes[n])
        need = ([0] if term[n] is not None else []) + labels
        b = low
        while any((b ^ x) in used for x in need) or b == p:
            b += 1
        off = p ^ b
        assert off < 1 << 21, "charsmap too large for this writer"
        units[p] = units.get(p, 0) | off << 10 | (1 << 8 if term[n] is not None else 0)
        if term[n] is not None:
            used.add(b)
            units[b] = 1 << 31 | term[n]
        for x in labels:
            c = b ^ x
            used.add(c)
            slot[nodes[n][x]] = c
            units[c] = x
            queue.append(nodes[n][x])
        while low in used:
            low += 1
    size = (max(units) // 256 + 1) * 256
    arr = [units.get(i, 0) for i in range(size)]
    return struct.pack(f"<I{size}I", 4 * size, *arr) + bytes(blob)
