"""Which tokenizer.json files the native byte-level BPE tokenizer (zoi._cpu.ByteBPE) runs exactly.

`native_config` reads the parsed JSON and returns the native tokenizer's arguments, or the
reason it cannot run that file (then HF `tokenizers` does). Covered exactly, as GPT-2,
RoBERTa, Llama-3 and Qwen2 / Qwen3 write them:
- normalizer NFC, or none;
- pre-tokenizer ByteLevel (add_prefix_space false), alone or after Split steps (behavior
  Isolated, not inverted) whose regex is one of SPLIT_REGEXES, matched by hand natively;
- model BPE: vocab + merges (either format), ignore_merges, unk_token / fuse_unk, no dropout,
  no byte_fallback, no continuing-subword prefix or end-of-word suffix;
- added tokens (special or not) matched in the raw text (normalized=false) or in the
  normalised text (normalized=true), leftmost-longest, with lstrip / rstrip (not
  single_word), with the ids HF gives them;
- post-processor TemplateProcessing "specials $A specials", RobertaProcessing,
  BertProcessing, ByteLevel, a Sequence of ByteLevel and one of those, or none.
tests/test_bpe_tokenizer.py checks the ids against HF on torture strings and random text.
"""

from __future__ import annotations

from typing import Any

from zoi.frontend.wordpiece import _template

# The pre-tokenizer regexes the native tokenizer matches, by their exact text in
# tokenizer.json, and the native kind of each (csrc/tokenizer/bpe.h, SplitKind).
QWEN2_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
LLAMA3_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
GPT2_REGEX = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
SPLIT_REGEXES = {QWEN2_REGEX: 0, LLAMA3_REGEX: 1, GPT2_REGEX: 2}
GPT2 = 2  # ByteLevel's own regex (use_regex)


def _is_id(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _normalizer(norm: Any) -> bool | str:
    """True for NFC, False for none, else why not."""
    if norm is None:
        return False
    if isinstance(norm, dict) and norm.get("type") == "Sequence":
        steps = norm.get("normalizers")
        if not isinstance(steps, list) or len(steps) > 1:
            return "normalizer Sequence of several steps"
        return _normalizer(steps[0]) if steps else False
    if isinstance(norm, dict) and norm.get("type") == "NFC":
        return True
    kind = norm.get("type") if isinstance(norm, dict) else None
    return f"normalizer {kind!r} (the native BPE runs NFC or none)"


def _byte_level(step: dict) -> bool | str:
    """ByteLevel's use_regex, or why not."""
    if step.get("add_prefix_space", True):
        return "ByteLevel pre-tokenizer with add_prefix_space"
    use_regex = step.get("use_regex", True)
    if not isinstance(use_regex, bool):
        return "ByteLevel use_regex is not a bool"
    return use_regex


def _pre_tokenizer(pre: Any) -> list[int] | str:
    """The native split kinds in order, or why not."""
    if not isinstance(pre, dict):
        return "no pre-tokenizer (the native BPE runs byte-level files)"
    steps = pre.get("pretokenizers") if pre.get("type") == "Sequence" else [pre]
    if not isinstance(steps, list) or not steps:
        return "empty pre-tokenizer Sequence"
    splits: list[int] = []
    for k, step in enumerate(steps):
        kind = step.get("type") if isinstance(step, dict) else None
        last = k == len(steps) - 1
        if kind == "ByteLevel" and last:
            r = _byte_level(step)
            if isinstance(r, str):
                return r
            if r:
                splits.append(GPT2)
        elif kind == "Split" and not last:
            pattern = step.get("pattern")
            regex = pattern.get("Regex") if isinstance(pattern, dict) else None
            if regex not in SPLIT_REGEXES:
                return "pre-tokenizer Split with a regex the native BPE does not match"
            if step.get("behavior") != "Isolated" or step.get("invert", False) is not False:
                return "pre-tokenizer Split other than Isolated"
            splits.append(SPLIT_REGEXES[regex])
        else:
            return f"pre-tokenizer {kind!r} (the native BPE runs Split steps then ByteLevel)"
    return splits


def _post_processor(pp: Any, added: dict[str, int]) -> tuple[list[int], list[int]] | str:
    if pp is None:
        return [], []
    if not isinstance(pp, dict):
        return "malformed post-processor"
    kind = pp.get("type")
    if kind == "Sequence":
        subs = pp.get("processors")
        if not isinstance(subs, list):
            return "malformed post-processor Sequence"
        rest = [p for p in subs if not (isinstance(p, dict) and p.get("type") == "ByteLevel")]
        if len(rest) > 1:
            return "post-processor Sequence of several templates"
        return _post_processor(rest[0] if rest else None, added)
    if kind == "ByteLevel":  # offsets only
        return [], []
    if kind == "TemplateProcessing":
        return _template(pp, added)
    if kind in ("RobertaProcessing", "BertProcessing"):
        try:
            head, tail = [int(pp["cls"][1])], [int(pp["sep"][1])]
        except (KeyError, IndexError, TypeError, ValueError):
            return f"malformed {kind}"
        return head, tail
    return f"post-processor {kind!r}"


def _added_tokens(tj: dict, vocab: dict[str, int]) -> tuple[list, list] | str:
    """(raw-text tokens, normalised-text tokens) as [(content, id, flags)], or why not. The
    ids are the ones HF gives when it loads the file (a model token's id, else the next free
    one); a file whose recorded ids differ runs on HF. flags: 1 lstrip, 2 rstrip."""
    items = tj.get("added_tokens") or []
    if not isinstance(items, list):
        return "added_tokens is not a list"
    given: dict[str, int] = {}
    raw, norm = [], []
    for a in items:
        if not isinstance(a, dict) or not isinstance(a.get("content"), str):
            return "malformed added token"
        content = a["content"]
        if a.get("single_word"):
            return f"added token {content!r} uses single_word"
        if not _is_id(a.get("id")):
            return "added token id is not a non-negative int"
        if not content:
            continue
        if content in given:
            return f"added token {content!r} appears twice"
        if content in vocab:
            i = vocab[content]
        else:
            top = max(given.values(), default=None)
            i = len(vocab) if top is None or (top < len(vocab) and vocab) else top + 1
        if i != a["id"]:
            return f"added token {content!r} has id {a['id']} but HF gives it {i}"
        given[content] = i
        flags = (1 if a.get("lstrip") else 0) | (2 if a.get("rstrip") else 0)
        (norm if a.get("normalized", not a.get("special", False)) else raw).append(
            (content, i, flags)
        )
    for group in (raw, norm):
        # a stripping token's whitespace could hold the start of another token: HF would
        # then emit overlapping pieces; such files run on HF
        if any(f for *_, f in group) and any(c[0].isspace() for c, *_ in group):
            return "added tokens that start with whitespace next to lstrip / rstrip ones"
    return raw, norm


def specials_config(tj: dict, vocab: dict[str, int], max_len: int) -> dict | str:
    """The added tokens and the post-processor's special tokens as keyword arguments of the
    native BPE-family tokenizers (zoi._cpu.ByteBPE, zoi._cpu.SentencePiece: added*,
    norm_added*, head, tail, max_len), or why not."""
    added = _added_tokens(tj, vocab)
    if isinstance(added, str):
        return added
    raw, norm = added
    r = _post_processor(tj.get("post_processor"), {c: i for c, i, _ in raw + norm})
    if isinstance(r, str):
        return r
    head, tail = r
    if max_len < len(head) + len(tail):
        return "the model's limit is shorter than its special tokens"
    return dict(
        added=[c for c, _, _ in raw],
        added_ids=[i for _, i, _ in raw],
        added_flags=[f for _, _, f in raw],
        norm_added=[c for c, _, _ in norm],
        norm_added_ids=[i for _, i, _ in norm],
        norm_added_flags=[f for _, _, f in norm],
        head=head,
        tail=tail,
        max_len=max_len,
    )


def native_config(tj: Any, max_len: int) -> dict | str:
    """Arguments of zoi._cpu.ByteBPE for this tokenizer.json (parsed), or why it can't run."""
    if not isinstance(tj, dict):
        return "tokenizer.json is not an object"
    model = tj.get("model")
    if not isinstance(model, dict) or model.get("type") != "BPE":
        return "not a BPE model"
    vocab = model.get("vocab")
    if not isinstance(vocab, dict) or not vocab:
        return "BPE without a vocabulary"
    ids = list(vocab.values())
    if not all(_is_id(v) for v in ids) or len(set(ids)) != len(ids):
        return "BPE vocabulary ids are not distinct non-negative ints"
    if model.get("dropout") is not None:
        return "BPE dropout"
    if model.get("byte_fallback"):
        return "BPE byte_fallback"
    if model.get("continuing_subword_prefix") or model.get("end_of_word_suffix"):
        return "BPE continuing-subword prefix or end-of-word suffix"
    unk = model.get("unk_token")
    if unk is not None and (not isinstance(unk, str) or unk not in vocab):
        return "BPE unk_token missing from the vocabulary"
    fuse_unk = model.get("fuse_unk", False)
    ignore_merges = model.get("ignore_merges", False)
    if not isinstance(fuse_unk, bool) or not isinstance(ignore_merges, bool):
        return "unusual BPE options"
    merges = model.get("merges") or []
    if not isinstance(merges, list):
        return "BPE merges is not a list"
    if all(isinstance(m, str) for m in merges):
        paired, flat = False, merges
    elif all(
        isinstance(m, list) and len(m) == 2 and all(isinstance(x, str) for x in m) for m in merges
    ):
        paired, flat = True, [x for m in merges for x in m]
    else:
        return "BPE merges mix formats"

    nfc = _normalizer(tj.get("normalizer"))
    if isinstance(nfc, str):
        return nfc
    splits = _pre_tokenizer(tj.get("pre_tokenizer"))
    if isinstance(splits, str):
        return splits
    specials = specials_config(tj, vocab, max_len)
    if isinstance(specials, str):
        return specials
    return dict(
        vocab=list(vocab.keys()),
        ids=ids,
        merges=flat,
        paired=paired,
        splits=splits,
        nfc=nfc,
        ignore_merges=ignore_merges,
        unk_id=-1 if unk is None else vocab[unk],
        fuse_unk=fuse_unk,
        **specials,
    )
