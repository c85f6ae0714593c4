"""Pair tokenisation for cross-encoders: id for id what HF `tokenizers` gives for
`encode(a, b)` with the folder's post-processor and pair truncation.

Each segment is tokenised alone without its special tokens (the native WordPiece path when
the Tokenizer has one, one call for all segments; HF `tokenizers` otherwise), truncated as HF
truncates pairs (`longest_first`, `only_first`, `only_second`: tokenizers'
utils/truncation.rs), then composed with the pair template (TemplateProcessing,
BertProcessing, RobertaProcessing) into packed ids, positions and token types. A
post-processor this module does not know runs through HF's own `encode_batch` of pairs.
tests/heads/test_pairs.py checks the ids and types against HF on many pairs.
"""

from __future__ import annotations

import json

import numpy as np

from zoi.errors import InputError

STRATEGIES = ("longest_first", "only_first", "only_second")


def _specials(pp: dict, name: str) -> list[int] | None:
    sp = (pp.get("special_tokens") or {}).get(name)
    ids = sp.get("ids") if isinstance(sp, dict) else None
    if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
        return None
    return ids


def _parse_template(pieces, pp: dict):
    """[(kind, ids or None, type_id)]: kind "S" (special ids), "A", "B"."""
    out = []
    for piece in pieces:
        if not isinstance(piece, dict) or len(piece) != 1:
            return None
        ((kind, body),) = piece.items()
        tid = body.get("type_id", 0)
        if kind == "Sequence" and body.get("id") in ("A", "B"):
            out.append((body["id"], None, tid))
        elif kind == "SpecialToken":
            ids = _specials(pp, body.get("id"))
            if ids is None:
                return None
            out.append(("S", ids, tid))
        else:
            return None
    return out


def pair_template(tokenizer_json: str):
    """(single template, pair template) of a tokenizer.json's post-processor, or None when
    this module does not know it (HF then encodes the pairs itself)."""
    tj = json.loads(tokenizer_json)
    pp = tj.get("post_processor")
    if isinstance(pp, dict) and pp.get("type") == "Sequence":
        subs = [p for p in pp.get("processors", []) if p.get("type") != "ByteLevel"]
        pp = subs[0] if len(subs) == 1 else None
    if pp is None or not isinstance(pp, dict):
        return None
    kind = pp.get("type")
    if kind == "TemplateProcessing":
        single = _parse_template(pp.get("single") or [], pp)
        pair = _parse_template(pp.get("pair") or [], pp)
        if single is None or pair is None or [k for k, *_ in pair if k != "S"] != ["A", "B"]:
            return None
        return single, pair
    if kind in ("BertProcessing", "RobertaProcessing"):
        (_, sep), (_, cls) = pp["sep"], pp["cls"]
        single = [("S", [cls], 0), ("A", None, 0), ("S", [sep], 0)]
        if kind == "BertProcessing":
            pair = single + [("B", None, 1), ("S", [sep], 1)]
        else:
            pair = single + [("S", [sep], 0), ("B", None, 0), ("S", [sep], 0)]
        return single, pair
    return None


def truncate_pair(n1: int, n2: int, max_len: int, strategy: str) -> tuple[int, int]:
    """Kept lengths of the two segments (max_len: tokens left after the specials), as HF
    tokenizers' truncate_encodings."""
    if n1 + n2 <= max_len:
        return n1, n2
    if strategy == "longest_first":
        swap = n1 > n2
        a, b = (n2, n1) if swap else (n1, n2)
        b = a if a > max_len else max(a, max_len - a)
        if a + b > max_len:
            a = max_len // 2
            b = a + max_len % 2
        return (b, a) if swap else (a, b)
    excess = n1 + n2 - max_len
    if strategy == "only_first":
        if n1 <= excess:
            raise InputError(
                "truncation='only_first': the first text is too short to truncate to the "
                "length limit; use truncation='longest_first'"
            )
        return n1 - excess, n2
    if n2 <= excess:
        raise InputError(
            "truncation='only_second': the second text is too short to truncate to the "
            "length limit; use truncation='longest_first'"
        )
    return n1, n2 - excess


class PairEncoder:
    """Pairs -> packed (ids, positions, types, cu_seqlens), int32, for one zoi Tokenizer."""

    def __init__(self, tokenizer):
        self.tok = tokenizer
        self.templates = pair_template(tokenizer.json)
        self._hf = {}
        if self.templates is not None:
            single, pair = self.templates
            self.n_single = sum(len(ids) for k, ids, _ in single if k == "S")
            self.n_pair = sum(len(ids) for k, ids, _ in pair if k == "S")
            self.head = sum((ids for k, ids, _ in single[: _a_index(single)] if k == "S"), [])
            self.tail = sum((ids for k, ids, _ in single[_a_index(single) + 1 :] if k == "S"), [])

    @property
    def kind(self) -> str:
        if self.templates is None:
            return "HF tokenizers pairs"
        return "native segments" if self.tok.native is not None else "HF segments"

    def _segments(self, texts: list[str], cap: int) -> list[np.ndarray]:
        """Token ids of each text without special tokens, at most `cap` of them."""
        tok = self.tok
        if tok.native is not None and cap + self.n_single <= tok.max_positions:
            ids, _, cu = tok.encode_packed(texts, True, max_len=cap + self.n_single)
            h, t = len(self.head), len(self.tail)
            out = []
            for i in range(len(texts)):
                s = ids[cu[i] : cu[i + 1]]
                out.append(s[h : len(s) - t])
            return out
        from zoi.frontend.tokenizer import clip_text

        clipped = [x if len(x) <= tok.max_chars else clip_text(x, tok.max_chars) for x in texts]
        encs = tok._hf_full.encode_batch(clipped, add_special_tokens=False)
        return [np.asarray(e.ids[:cap], np.int32) for e in encs]

    def _full_lengths(self, texts: list[str]) -> list[int]:
        """Token counts without special tokens and without any cap."""
        tok = self.tok
        if tok.native is not None:
            _, _, cu, _ = tok.native.encode_packed(texts, True, 0, 0, 1 << 30)
            return (np.diff(cu) - self.n_single).tolist()
        encs = tok._hf_full.encode_batch(texts, add_special_tokens=False)
        return [len(e.ids) for e in encs]

    def encode(
        self, pairs: list[tuple[str, str]], max_len: int, strategy: str = "longest_first"
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        if strategy not in STRATEGIES:
            raise ValueError(f"truncation must be one of {STRATEGIES}, got {strategy!r}")
        if self.templates is None:
            return self._hf_pairs(pairs, max_len, strategy)
        room = max_len - self.n_pair
        if room < 1:
            raise InputError(f"max length {max_len} leaves no room for a pair's tokens")
        # capping each segment at room + 1 tokens changes no truncation decision, except
        # which of two over-long segments is longer (longest_first, odd room: it keeps the
        # odd token): those pairs' full lengths are counted below
        texts = [t for p in pairs for t in p]
        segs = self._segments(texts, room + 1)
        full = {}
        if strategy == "longest_first" and room % 2:
            both = [
                i for i in range(len(pairs)) if min(len(segs[2 * i]), len(segs[2 * i + 1])) > room
            ]
            if both:
                n = self._full_lengths([texts[2 * i + k] for i in both for k in (0, 1)])
                full = {i: (n[2 * j], n[2 * j + 1]) for j, i in enumerate(both)}
        _, pair = self.templates
        ids_l, typ_l, lens = [], [], np.empty(len(pairs), np.int32)
        for i in range(len(pairs)):
            a, b = segs[2 * i], segs[2 * i + 1]
            n1, n2 = full.get(i, (len(a), len(b)))
            na, nb = truncate_pair(n1, n2, room, strategy)
            parts = {"A": a[:na], "B": b[:nb]}
            n = 0
            for k, sp, tid in pair:
                x = np.asarray(sp, np.int32) if k == "S" else parts[k]
                ids_l.append(x)
                typ_l.append(np.full(len(x), tid, np.int32))
                n += len(x)
            lens[i] = n
        return self._pack(ids_l, typ_l, lens)

    def _pack(self, ids_l, typ_l, lens):
        cu = np.zeros(len(lens) + 1, np.int32)
        np.cumsum(lens, out=cu[1:])
        ids = np.concatenate(ids_l).astype(np.int32) if ids_l else np.zeros(0, np.int32)
        types = np.concatenate(typ_l).astype(np.int32) if typ_l else np.zeros(0, np.int32)
        starts = np.repeat(cu[:-1], lens)
        pos = (np.arange(len(ids), dtype=np.int32) - starts + self.tok.position_offset).astype(
            np.int32
        )
        return ids, pos, types, cu

    def _hf_pairs(self, pairs, max_len, strategy):
        key = (max_len, strategy)
        tok = self._hf.get(key)
        if tok is None:
            from tokenizers import Tokenizer as HFTokenizer

            tok = HFTokenizer.from_str(self.tok.json)
            tok.no_padding()
            tok.enable_truncation(max_len, strategy=strategy)
            self._hf[key] = tok
        try:
            encs = tok.encode_batch([tuple(p) for p in pairs], add_special_tokens=True)
        except Exception as e:  # tokenizers raises a plain Exception on a truncation error
            raise InputError(f"pair tokenisation failed: {e}") from None
        ids_l = [np.asarray(e.ids, np.int32) for e in encs]
        typ_l = [np.asarray(e.type_ids, np.int32) for e in encs]
        return self._pack(ids_l, typ_l, np.array([len(x) for x in ids_l], np.int32))


def _a_index(t) -> int:
    return next(i for i, (k, *_) in enumerate(t) if k == "A")


def check_pairs(inputs) -> tuple[list, bool, bool]:
    """CrossEncoder.predict's inputs: one pair [a, b], a list of pairs, one text or a list of
    texts (a single-text classifier). Returns (items, single, pairs)."""
    if isinstance(inputs, str):
        return [inputs], True, False
    if (
        isinstance(inputs, (list, tuple))
        and len(inputs) == 2
        and all(isinstance(x, str) for x in inputs)
    ):
        return [(inputs[0], inputs[1])], True, True  # one pair, as CrossEncoder reads it
    items = list(inputs)
    if all(isinstance(x, str) for x in items):
        return items, False, False
    out = []
    for i, p in enumerate(items):
        if (
            not isinstance(p, (list, tuple))
            or len(p) != 2
            or not all(isinstance(x, str) for x in p)
        ):
            raise TypeError(
                f"inputs[{i}] should be a pair [str, str] like the others, got {p!r:.80} "
                "(pass all pairs, or all single texts)"
            )
        out.append((p[0], p[1]))
    return out, False, True
