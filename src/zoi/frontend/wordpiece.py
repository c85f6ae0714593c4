"""Which tokenizer.json files the native WordPiece tokenizer (zoi._cpu.WordPiece) runs exactly.

`native_config` reads the parsed JSON and returns the native tokenizer's arguments, or the
reason it cannot run that file (then HF `tokenizers` does). Covered exactly: model WordPiece,
normalizer BertNormalizer (or none), pre-tokenizer BertPreTokenizer, post-processor
TemplateProcessing "specials $A specials" / BertProcessing (or none), added tokens matched in
the raw text (normalized=false, no single_word / lstrip / rstrip). tests/tokenizer/ checks the
ids against HF on corpora, a Unicode torture set, every codepoint and random strings.
"""

from __future__ import annotations

from typing import Any


def _template(pp: dict, added: dict[str, int]) -> tuple[list[int], list[int]] | str:
    single = pp.get("single")
    specials = pp.get("special_tokens") or {}
    if not isinstance(single, list):
        return "post-processor template without a single-sequence form"
    head: list[int] = []
    tail: list[int] = []
    seen_a = False
    for piece in single:
        if not isinstance(piece, dict) or len(piece) != 1:
            return "unusual post-processor template"
        ((kind, body),) = piece.items()
        if kind == "Sequence":
            if body.get("id") != "A" or seen_a:
                return "post-processor template with other than one $A"
            seen_a = True
        elif kind == "SpecialToken":
            sp = specials.get(body.get("id"))
            if not isinstance(sp, dict) or not isinstance(sp.get("ids"), list):
                return f"post-processor special token {body.get('id')!r} has no ids"
            ids = sp["ids"]
            if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
                return "post-processor special token ids are not ints"
            (tail if seen_a else head).extend(ids)
        else:
            return f"post-processor template piece {kind!r}"
    if not seen_a:
        return "post-processor template without $A"
    return head, tail


def native_config(tj: Any, max_len: int) -> dict | str:
    """Arguments of zoi._cpu.WordPiece for this tokenizer.json (parsed), or why it can't run."""
    if not isinstance(tj, dict):
        return "tokenizer.json is not an object"
    model = tj.get("model")
    if not isinstance(model, dict) or model.get("type") != "WordPiece":
        kind = model.get("type") if isinstance(model, dict) else None
        return f"model type {kind!r} (the native tokenizer runs WordPiece)"
    vocab = model.get("vocab")
    unk = model.get("unk_token")
    prefix = model.get("continuing_subword_prefix", "##")
    max_chars = model.get("max_input_chars_per_word", 100)
    if not isinstance(vocab, dict) or not vocab:
        return "WordPiece without a vocabulary"
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in vocab.values()):
        return "WordPiece vocabulary ids are not non-negative ints"
    if not isinstance(unk, str) or unk not in vocab:
        return "WordPiece [UNK] token missing from the vocabulary"
    if not isinstance(prefix, str) or not isinstance(max_chars, int) or max_chars < 0:
        return "unusual WordPiece options"

    norm = tj.get("normalizer")
    flags = dict(clean_text=False, handle_chinese_chars=False, strip_accents=False, lowercase=False)
    if norm is not None:
        if not isinstance(norm, dict) or norm.get("type") != "BertNormalizer":
            kind = norm.get("type") if isinstance(norm, dict) else None
            return f"normalizer {kind!r} (the native tokenizer runs BertNormalizer)"
        for k in ("clean_text", "handle_chinese_chars", "lowercase"):
            v = norm.get(k, True)
            if not isinstance(v, bool):
                return f"BertNormalizer {k} is not a bool"
            flags[k] = v
        sa = norm.get("strip_accents")
        if sa is not None and not isinstance(sa, bool):
            return "BertNormalizer strip_accents is not a bool or null"
        flags["strip_accents"] = flags["lowercase"] if sa is None else sa

    pre = tj.get("pre_tokenizer")
    if not isinstance(pre, dict) or pre.get("type") != "BertPreTokenizer":
        kind = pre.get("type") if isinstance(pre, dict) else None
        return f"pre-tokenizer {kind!r} (the native tokenizer runs BertPreTokenizer)"

    added_tokens = tj.get("added_tokens") or []
    if not isinstance(added_tokens, list):
        return "added_tokens is not a list"
    added: dict[str, int] = {}
    for a in added_tokens:
        if not isinstance(a, dict) or not isinstance(a.get("content"), str):
            return "malformed added token"
        if a.get("normalized", not a.get("special", False)):
            return f"added token {a['content']!r} is matched after normalisation"
        if a.get("single_word") or a.get("lstrip") or a.get("rstrip"):
            return f"added token {a['content']!r} uses single_word / lstrip / rstrip"
        i = a.get("id")
        if not isinstance(i, int) or isinstance(i, bool) or i < 0:
            return "added token id is not a non-negative int"
        if a["content"]:
            added.setdefault(a["content"], i)

    pp = tj.get("post_processor")
    if pp is None:
        head, tail = [], []
    elif isinstance(pp, dict) and pp.get("type") == "TemplateProcessing":
        r = _template(pp, added)
        if isinstance(r, str):
            return r
        head, tail = r
    elif isinstance(pp, dict) and pp.get("type") == "BertProcessing":
        try:
            head, tail = [int(pp["cls"][1])], [int(pp["sep"][1])]
        except (KeyError, IndexError, TypeError, ValueError):
            return "malformed BertProcessing"
    else:
        kind = pp.get("type") if isinstance(pp, dict) else None
        return f"post-processor {kind!r}"
    if max_len < len(head) + len(tail):
        return "the model's limit is shorter than its special tokens"

    return dict(
        vocab=list(vocab.keys()),
        ids=list(vocab.values()),
        added=list(added.keys()),
        added_ids=list(added.values()),
        prefix=prefix,
        max_input_chars_per_word=max_chars,
        unk_id=vocab[unk],
        head=head,
        tail=tail,
        max_len=max_len,
        **flags,
    )
