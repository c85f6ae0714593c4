#!/usr/bin/env python3
"""Generate csrc/tokenizer/unicode_tables.h: the per-codepoint tables of the native WordPiece
tokenizer (BertNormalizer + BertPreTokenizer), made from Python's `unicodedata` and checked
against HF `tokenizers` on every codepoint, and those of the native byte-level BPE tokenizer
(the classes of its pre-tokenizer regexes and NFC composition).

HF `tokenizers` does not use one Unicode version: categories (control, punctuation, nonspacing
mark) come from the `unicode_categories` crate (an old Unicode), whitespace and lowercase from
Rust's std (a recent one), NFD from the `unicode-normalization` crate. The tables must follow
HF, not the standard, so every property taken from `unicodedata` is compared with HF's answer
for that codepoint, and where they differ HF's answer is used; the overrides are counted and
printed (the header records the counts). Needs `tokenizers` installed:

    python scripts/gen_unicode_tables.py            # writes the header
    python scripts/gen_unicode_tables.py --check    # exits 1 if the header is stale

tests/tokenizer/test_unicode_tables.py checks the built tokenizer against HF on every codepoint.

The byte-level BPE tables are HF's answers only: `\\p{L}`, `\\p{N}` and `\\s` as HF's Split
pre-tokenizer matches them (Oniguruma, whose Unicode is newer than Python's), and NFC as HF's
NFC normalizer composes (the `unicode-normalization` crate, which lags Python's Unicode in
places: it neither decomposes nor composes U+11938). Composition pairs are Python's canonical
pairs that HF composes; every codepoint HF keeps composed must come from one of them.

It also writes csrc/tokenizer/grapheme_tables.h: the extended grapheme cluster classes of the
SentencePiece tokenizers' Precompiled normalizer (HF splits its text into clusters with the
`unicode-segmentation` crate, Unicode 17). They come from the `regex` module's
Grapheme_Cluster_Break, Extended_Pictographic and Indic_Conjunct_Break properties, where
they differ from the crate's tables (HF16_OVERRIDES below, a few dozen codepoints); the
classes HF's answers reveal directly (what joins after a letter, Prepend, Control) are
probed on every codepoint through a one-key charsmap.
"""

from __future__ import annotations

import argparse
import struct
import sys
import unicodedata
from pathlib import Path

from tokenizers import Regex, normalizers, pre_tokenizers

OUT = Path(__file__).resolve().parents[1] / "csrc" / "tokenizer" / "unicode_tables.h"
OUT_GRAPHEME = OUT.parent / "grapheme_tables.h"
MAXCP = 0x110000
F_DROP, F_WS, F_PUNCT, F_MN, F_LOWER, F_DECOMP, F_CJK = 1, 2, 4, 8, 16, 32, 64
# byte-level BPE: regex classes and the NFC boundary (ccc 0, NFC_Quick_Check=Yes: nothing
# before it composes or reorders with it or anything after it)
RX_L, RX_N, RX_WS, RX_NFC_BOUNDARY = 1, 2, 4, 8
# Hangul jamo that compose with the syllable or jamo before them (algorithmic composition)
HANGUL_V = range(0x1161, 0x1176)
HANGUL_T = range(0x11A8, 0x11C3)
# CJK ranges of handle_chinese_chars as HF writes them (0x2B920, not BERT's 0x2B820); checked below
CJK = [
    (0x4E00, 0x9FFF),
    (0x3400, 0x4DBF),
    (0x20000, 0x2A6DF),
    (0x2A700, 0x2B73F),
    (0x2B740, 0x2B81F),
    (0x2B920, 0x2CEAF),
    (0xF900, 0xFAFF),
    (0x2F800, 0x2FA1F),
]


def is_surrogate(c: int) -> bool:
    return 0xD800 <= c <= 0xDFFF


def base_props(c: int) -> dict:
    """What Python's unicodedata says (the standard, its Unicode version)."""
    ch = chr(c)
    cat = unicodedata.category(ch)
    ws = ch.isspace() and c not in (0x1C, 0x1D, 0x1E, 0x1F)  # White_Space, not Python's bidi B/S
    return {
        "drop": c == 0 or c == 0xFFFD or (cat[0] == "C" and ch not in "\t\n\r"),
        "ws": ws,
        "punct": (c < 128 and not ch.isalnum() and 33 <= c <= 126) or cat[0] == "P",
        "mn": cat == "Mn",
        "lower": ch.lower(),
        "nfd": unicodedata.normalize("NFD", ch),
        "ccc": unicodedata.combining(ch),
        "cjk": any(a <= c <= z for a, z in CJK),
    }


class HF:
    """HF's answer for one codepoint, from its own normalizers and pre-tokenizer."""

    def __init__(self):
        self.clean = normalizers.BertNormalizer(
            clean_text=True, handle_chinese_chars=False, strip_accents=False, lowercase=False
        )
        self.strip = normalizers.BertNormalizer(
            clean_text=False, handle_chinese_chars=False, strip_accents=True, lowercase=False
        )
        self.lower = normalizers.BertNormalizer(
            clean_text=False, handle_chinese_chars=False, strip_accents=False, lowercase=True
        )
        self.cjk = normalizers.BertNormalizer(
            clean_text=False, handle_chinese_chars=True, strip_accents=False, lowercase=False
        )
        self.nfd = normalizers.NFD()
        self.pre = pre_tokenizers.BertPreTokenizer()

    def props(self, c: int) -> dict:
        ch = chr(c)
        cleaned = self.clean.normalize_str(ch)
        words = [w for w, _ in self.pre.pre_tokenize_str("a" + ch + "a")]
        nfd = self.nfd.normalize_str(ch)
        return {
            "drop": cleaned == "",
            "ws_clean": cleaned == " " and ch != " ",
            "ws": words == ["a", "a"],
            "punct": words == ["a", ch, "a"],
            # a nonspacing mark: removed by strip_accents (asked only of NFD-stable codepoints)
            "mn": nfd == ch and self.strip.normalize_str(ch) == "",
            "lower": self.lower.normalize_str(ch),
            "nfd": nfd,
            "cjk": self.cjk.normalize_str(ch) == f" {ch} ",
        }


def probe_ccc(hf: HF, c: int, marks: dict[int, int]) -> int:
    """HF's canonical combining class of c (NFD-stable): NFD moves a mark of class j before
    one of class k > j and leaves class 0 alone, so c's class is the representative mark's
    class k for which neither order of the pair changes, given some other pair does change."""
    ch = chr(c)
    same, moved = [], False
    for k in sorted(marks):
        m = chr(marks[k])
        before = hf.nfd.normalize_str(m + ch) == m + ch
        after = hf.nfd.normalize_str(ch + m) == ch + m
        moved |= not (before and after)
        if before and after:
            same.append(k)
    if not moved:
        return 0
    if len(same) != 1:
        raise SystemExit(f"U+{c:04X}: cannot place its combining class (matches {same})")
    return same[0]


def build() -> tuple[list[int], list[int], dict, dict, dict]:
    hf = HF()
    flags = [0] * MAXCP
    ccc = [0] * MAXCP
    lower: dict[int, str] = {}
    decomp: dict[int, str] = {}
    over = {k: 0 for k in ("drop", "ws", "punct", "mn", "lower", "nfd", "ccc", "cjk")}
    # one representative mark per combining class, one HF knows (its NFD may be of an older
    # Unicode): the representative of class k > 1 must move before U+0334 (class 1)
    m1 = chr(0x0334)
    marks: dict[int, int] = {1: 0x0334}
    for c in range(MAXCP):
        if is_surrogate(c):
            continue
        k = unicodedata.combining(chr(c))
        if k and k not in marks and unicodedata.normalize("NFD", chr(c)) == chr(c):
            if hf.nfd.normalize_str(chr(c) + m1) == m1 + chr(c):
                marks[k] = c
    for c in range(MAXCP):
        if is_surrogate(c):
            continue
        b, h = base_props(c), hf.props(c)
        if h["ws_clean"] != (h["ws"] and not h["drop"] and c != 0x20):
            raise SystemExit(f"U+{c:04X}: HF's clean_text and pre-tokenizer disagree on whitespace")
        for k in ("drop", "ws", "punct", "lower", "nfd", "cjk"):
            if b[k] != h[k]:
                over[k] += 1
        mn = h["mn"] if h["nfd"] == chr(c) else b["mn"]  # Mn only matters for NFD-stable cps
        if h["nfd"] == chr(c) and b["mn"] != h["mn"]:
            over["mn"] += 1
        f = 0
        f |= F_DROP if h["drop"] else 0
        f |= F_WS if h["ws"] else 0
        f |= F_PUNCT if h["punct"] else 0
        f |= F_MN if mn else 0
        f |= F_CJK if h["cjk"] else 0
        if h["lower"] != chr(c):
            f |= F_LOWER
            lower[c] = h["lower"]
        if h["nfd"] != chr(c) and not (0xAC00 <= c <= 0xD7A3):  # Hangul: algorithmic
            f |= F_DECOMP
            decomp[c] = h["nfd"]
        flags[c] = f
        k = b["ccc"] if h["nfd"] == chr(c) else 0  # decomposed codepoints: their parts' classes
        if k:
            kh = probe_ccc(hf, c, marks)
            if kh != k:
                over["ccc"] += 1
                k = kh
        ccc[c] = k
    # a codepoint unicodedata calls class 0 but HF reorders: one probe against class 1 and 230
    m1, m230 = chr(0x0334), chr(marks[230])
    for c in range(MAXCP):
        if is_surrogate(c) or ccc[c] or hf.nfd.normalize_str(chr(c)) != chr(c):
            continue
        ch = chr(c)
        if hf.nfd.normalize_str(ch + m1) != ch + m1 or hf.nfd.normalize_str(m230 + ch) != m230 + ch:
            ccc[c] = probe_ccc(hf, c, marks)
            over["ccc"] += 1
    for c, s in decomp.items():  # full decompositions hold only NFD-stable codepoints
        assert all(hf.nfd.normalize_str(x) == x for x in s), hex(c)
    return flags, ccc, lower, decomp, over


def probe_regex_class(pattern: str) -> set[int]:
    """The codepoints HF's Split pre-tokenizer matches with `pattern` (one codepoint long)."""
    split = pre_tokenizers.Split(Regex(pattern), behavior="removed")
    hits: set[int] = set()
    for base in range(0, MAXCP, 4096):
        cps = [c for c in range(base, min(MAXCP, base + 4096)) if not is_surrogate(c)]
        kept = bytearray(len(cps))
        for _, (a, b) in split.pre_tokenize_str("".join(map(chr, cps))):
            kept[a:b] = b"\x01" * (b - a)
        hits.update(c for k, c in enumerate(cps) if not kept[k])
    return hits


def hf_batch(norm, cps: list[int]) -> dict[int, str]:
    """norm applied to each codepoint alone (NUL-separated batches: NUL is a starter that
    composes with nothing; codepoint 0 itself is normalised alone)."""
    out = {0: norm.normalize_str("\x00")} if 0 in cps else {}
    rest = [c for c in cps if c]
    for base in range(0, len(rest), 8192):
        chunk = rest[base : base + 8192]
        parts = norm.normalize_str("\x00".join(map(chr, chunk))).split("\x00")
        assert len(parts) == len(chunk)
        out.update(zip(chunk, parts, strict=True))
    return out


def build_bpe(ccc: list[int]) -> tuple[list[int], list[tuple[int, int, int]], dict]:
    """(per-codepoint RX_* flags, NFC composition pairs (first, second, composite), counts)."""
    letters = probe_regex_class(r"\p{L}")
    numbers = probe_regex_class(r"\p{N}")
    spaces = probe_regex_class(r"\s")
    cps = [c for c in range(MAXCP) if not is_surrogate(c)]
    nfc = hf_batch(normalizers.NFC(), cps)
    nfd = hf_batch(normalizers.NFD(), cps)
    pairs = []
    for c in cps:
        d = unicodedata.decomposition(chr(c))
        if not d or d.startswith("<") or len(d.split()) != 2:
            continue
        x, y = (int(v, 16) for v in d.split())
        # HF's own answer: the pair composes to c (not excluded, known to its Unicode)
        if normalizers.NFC().normalize_str(chr(x) + chr(y)) == chr(c):
            pairs.append((x, y, c))
    composed = {c for _, _, c in pairs}
    for c in cps:  # every composite HF keeps comes from a pair (Hangul: algorithmic)
        if nfd[c] != chr(c) and nfc[c] == chr(c) and not 0xAC00 <= c <= 0xD7A3:
            assert c in composed, f"U+{c:04X}: HF keeps it composed but no pair composes it"
    seconds = {y for _, y, _ in pairs} | set(HANGUL_V) | set(HANGUL_T)
    flags = [0] * MAXCP
    nbound = 0
    for c in cps:
        f = (RX_L if c in letters else 0) | (RX_N if c in numbers else 0)
        f |= RX_WS if c in spaces else 0
        first = ord(nfd[c][0])
        if (
            nfc[c] == chr(c)
            and c not in seconds
            and first not in seconds
            and ccc[first] == 0
            # decomposed codepoints carry class 0 in `ccc` (their parts' classes count)
            and (ccc[c] if nfd[c] == chr(c) else unicodedata.combining(chr(c))) == 0
        ):
            f |= RX_NFC_BOUNDARY
            nbound += 1
        flags[c] = f
    # the native NFC copies ASCII without a table lookup
    assert all(flags[c] & RX_NFC_BOUNDARY for c in range(128))
    counts = {
        "L": len(letters),
        "N": len(numbers),
        "WS": len(spaces),
        "NFC pairs": len(pairs),
        "NFC boundaries": nbound,
    }
    return flags, sorted(pairs), counts


def two_stage(values: list[int], block: int = 256) -> tuple[list[int], list[int]]:
    blocks: dict[tuple, int] = {}
    stage1, stage2 = [], []
    for i in range(0, len(values), block):
        key = tuple(values[i : i + block])
        if key not in blocks:
            blocks[key] = len(blocks)
            stage2.extend(key)
        stage1.append(blocks[key])
    return stage1, stage2


def c_array(ctype: str, name: str, vals: list[int], per_line: int = 24) -> str:
    lines = [f"inline constexpr {ctype} {name}[{len(vals)}] = {{"]
    for i in range(0, len(vals), per_line):
        lines.append("  " + ",".join(str(v) for v in vals[i : i + per_line]) + ",")
    lines.append("};")
    return "\n".join(lines)


def render(flags, ccc, lower, decomp, over, bpe) -> str:
    props = [f | (k << 8) for f, k in zip(flags, ccc, strict=True)]
    s1, s2 = two_stage(props)
    single = sorted((c, ord(s)) for c, s in lower.items() if len(s) == 1)
    multi = sorted((c, s) for c, s in lower.items() if len(s) != 1)
    lcp, lto = [c for c, _ in single], [t for _, t in single]
    mcp, moff, mdata = [], [0], []
    for c, s in multi:
        mcp.append(c)
        mdata.extend(ord(x) for x in s)
        moff.append(len(mdata))
    dcp, doff, ddata = [], [0], []
    for c in sorted(decomp):
        dcp.append(c)
        ddata.extend(ord(x) for x in decomp[c])
        doff.append(len(ddata))
    import tokenizers

    rx, comp, bcounts = bpe
    r1, r2 = two_stage(rx)
    head = f"""// GENERATED by scripts/gen_unicode_tables.py - do not edit.
// Python unicodedata {unicodedata.unidata_version}, checked against HF tokenizers {tokenizers.__version__} on every
// codepoint; HF's answer replaced unicodedata's for: {", ".join(f"{k} {v}" for k, v in over.items())}.
// props = flags | ccc << 8 (two-stage table over blocks of 256 codepoints).
// Byte-level BPE (HF's answers only): {", ".join(f"{k} {v}" for k, v in bcounts.items())}.
// rx = RX_* flags (two-stage table); kComp* = NFC pairs (first << 21 | second, sorted) -> composite.
#pragma once
#include <cstdint>

namespace zoi::tok::uni {{
inline constexpr uint16_t F_DROP = {F_DROP}, F_WS = {F_WS}, F_PUNCT = {F_PUNCT}, F_MN = {F_MN}, F_LOWER = {F_LOWER}, F_DECOMP = {F_DECOMP}, F_CJK = {F_CJK};
inline constexpr uint8_t RX_L = {RX_L}, RX_N = {RX_N}, RX_WS = {RX_WS}, RX_NFC_BOUNDARY = {RX_NFC_BOUNDARY};
"""
    body = [
        c_array("uint16_t", "kStage1", s1),
        c_array("uint16_t", "kStage2", s2),
        c_array("uint32_t", "kLowerCp", lcp),
        c_array("uint32_t", "kLowerTo", lto),
        c_array("uint32_t", "kLowerMultiCp", mcp),
        c_array("uint16_t", "kLowerMultiOff", moff),
        c_array("uint32_t", "kLowerMultiData", mdata),
        c_array("uint32_t", "kDecompCp", dcp),
        c_array("uint16_t", "kDecompOff", doff),
        c_array("uint32_t", "kDecompData", ddata),
        c_array("uint16_t", "kRxStage1", r1),
        c_array("uint8_t", "kRxStage2", r2),
        c_array("uint64_t", "kCompKey", [x << 21 | y for x, y, _ in comp], per_line=12),
        c_array("uint32_t", "kCompTo", [c for _, _, c in comp]),
    ]
    return head + "\n".join(body) + "\n}  // namespace zoi::tok::uni\n"


# ---- grapheme clusters (the SentencePiece tokenizers' Precompiled normalizer) ----

# the classes, as csrc/tokenizer/sentencepiece.cc names them
GC = ["Other", "CR", "LF", "Control", "Extend", "ZWJ", "RI", "Prepend", "SpacingMark", "L", "V",
      "T", "LV", "LVT", "Pict", "Consonant"]  # fmt: skip
GC_LINKER, GC_INCB_EXTEND = 16, 32
GCB_NAMES = {"CR": "CR", "LF": "LF", "Control": "Control", "Extend": "Extend", "ZWJ": "ZWJ",
             "Regional_Indicator": "RI", "Prepend": "Prepend", "SpacingMark": "SpacingMark",
             "L": "L", "V": "V", "T": "T", "LV": "LV", "LVT": "LVT"}  # fmt: skip
# where the crate HF builds with (unicode-segmentation 1.13, Unicode 17) differs from the
# regex module (2026.12): its classes, its InCB linkers and InCB extenders
HF_GRAPHEME_CLASS = {
    "Pict": [(0x1F1AE, 0x1F1AE), (0x1F7DA, 0x1F7DB), (0x1F7F1, 0x1F7FF)],
    "Other": [(0x5C8, 0x5C9), (0xB53, 0xB54), (0x1ADE, 0x1ADF), (0x1AEC, 0x1AF0),
              (0x10ECB, 0x10ECF), (0x10EF0, 0x10EF9), (0x11DF0, 0x11DF0), (0x1D127, 0x1D128),
              (0x1D250, 0x1D252), (0x1D25B, 0x1D25C), (0x1D25F, 0x1D25F), (0x1D280, 0x1D281),
              (0x11B0A, 0x11B0A), (0x11DF1, 0x11DF1)],
}  # fmt: skip
HF_NOT_LINKER = [0x11A3A, 0x1CF5, 0x1CF6]


def _regex_set(pattern: str, text: str) -> set[int]:
    import regex

    return {ord(ch) for m in regex.finditer(pattern + "+", text) for ch in m.group()}


def charsmap_one(key: str, rep: str) -> bytes:
    """A precompiled_charsmap (darts-clone double array) holding one key."""
    kb = key.encode()
    units: dict[int, int] = {}
    pos, base = 0, 256
    for c in kb:
        off = pos ^ base
        units[pos] = units.get(pos, 0) | off << 10
        pos = base ^ c
        units[pos] = c
        base += 256
    units[pos] |= 1 << 8 | (pos ^ base) << 10  # has a leaf: its value at pos ^ offset
    units[base] = 1 << 31  # value 0: the first replacement
    size = max(units) // 256 * 256 + 256
    arr = [units.get(i, 0) for i in range(size)]
    return struct.pack(f"<I{size}I", 4 * size, *arr) + rep.encode() + b"\0"


def _hf_parts(key: str, texts: list[str]) -> list[str]:
    """Each text as HF's Precompiled normalizer leaves it with the charsmap {key: "@"}: a
    cluster of under 6 bytes that starts with the key becomes "@" (the rest of it dropped)."""
    norm = normalizers.Precompiled(charsmap_one(key, "@"))
    out: list[str] = []
    for base in range(0, len(texts), 8192):
        chunk = texts[base : base + 8192]
        parts = norm.normalize_str("\x01".join(chunk)).split("\x01")  # U+0001 joins nothing
        assert len(parts) == len(chunk)
        out += parts
    return out


def build_grapheme() -> tuple[list[int], dict]:
    cps = [c for c in range(MAXCP) if not is_surrogate(c)]
    text = "".join(map(chr, cps))
    cls = [0] * MAXCP
    props = [("Pict", r"\p{Extended_Pictographic}"), ("Consonant", r"\p{InCB=Consonant}")]
    props += [(k, rf"\p{{Grapheme_Cluster_Break={g}}}") for g, k in GCB_NAMES.items()]
    for name, pattern in props:
        for c in _regex_set(pattern, text):
            cls[c] = GC.index(name)
    for name, ranges in HF_GRAPHEME_CLASS.items():
        for a, b in ranges:
            for c in range(a, b + 1):
                cls[c] = GC.index(name)
    linkers = _regex_set(r"\p{InCB=Linker}", text) - set(HF_NOT_LINKER)
    extenders = _regex_set(r"\p{InCB=Extend}", text)
    extenders -= {c for a, b in HF_GRAPHEME_CLASS["Other"] for c in range(a, b + 1)}
    # HF's answers where they show: what joins a letter (Extend, ZWJ, SpacingMark: "a" + c
    # is one cluster, "@"); Prepend (c + "x\u0301" one cluster: the accent stays, else "x"
    # starts a cluster that drops it); not Control / CR / LF (U+0340 joins c, likewise)
    probe = [c for c in cps if c not in (1, ord("a"), ord("x"), 0x340, 0x301)]
    after = _hf_parts("a", ["a" + chr(c) for c in probe])
    prepend = _hf_parts("x", [chr(c) + "x\u0301" for c in probe])
    control = _hf_parts("\u0340", [chr(c) + "\u0340\u0301" for c in probe])
    joins = {GC.index(k) for k in ("Extend", "ZWJ", "SpacingMark")}
    ctl = {GC.index(k) for k in ("Control", "CR", "LF")}
    for k, c in enumerate(probe):
        assert (after[k] == "@") == (cls[c] in joins), f"U+{c:04X} after a letter"
        assert prepend[k].endswith("\u0301") == (cls[c] == GC.index("Prepend")), (
            f"U+{c:04X} Prepend"
        )
        assert control[k].endswith("\u0301") == (cls[c] not in ctl), f"U+{c:04X} Control"
    vals = [
        cls[c] | (GC_LINKER if c in linkers else 0) | (GC_INCB_EXTEND if c in extenders else 0)
        for c in range(MAXCP)
    ]
    counts = {k: cls.count(i) for i, k in enumerate(GC) if k != "Other"}
    counts["linkers"] = len(linkers)
    counts["InCB extenders"] = len(extenders)
    return vals, counts


def render_grapheme(vals: list[int], counts: dict) -> str:
    import tokenizers

    s1, s2 = two_stage(vals)
    names = ", ".join(f"k{k} = {i}" for i, k in enumerate(GC))
    return f"""// GENERATED by scripts/gen_unicode_tables.py - do not edit.
// Extended grapheme cluster classes as HF tokenizers {tokenizers.__version__} segments text (its
// unicode-segmentation crate): {", ".join(f"{k} {v}" for k, v in counts.items())}.
// gc = class | kLinker (InCB=Linker) | kInCBExtend (InCB=Extend), two-stage over blocks of 256.
#pragma once
#include <cstdint>

namespace zoi::tok::gr {{
inline constexpr uint8_t {names};
inline constexpr uint8_t kCatMask = 15, kLinker = {GC_LINKER}, kInCBExtend = {GC_INCB_EXTEND};
{c_array("uint16_t", "kGcStage1", s1)}
{c_array("uint8_t", "kGcStage2", s2)}
}}  // namespace zoi::tok::gr
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="fail if the committed header is stale")
    args = ap.parse_args()
    built = build()
    outs = {
        OUT: render(*built, build_bpe(built[1])),
        OUT_GRAPHEME: render_grapheme(*build_grapheme()),
    }
    if args.check:
        stale = [p for p, text in outs.items() if not p.exists() or p.read_text() != text]
        for p in stale:
            print(f"{p} is stale: run python scripts/gen_unicode_tables.py", file=sys.stderr)
        return 1 if stale else 0
    for p, text in outs.items():
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
        print(f"wrote {p} ({len(text) // 1024} KB)", file=sys.stderr)
        print(text.splitlines()[2], file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
