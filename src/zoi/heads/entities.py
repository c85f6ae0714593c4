"""Token classification -> entities, as transformers' TokenClassificationPipeline aggregates
them (aggregation_strategy none / simple / first / max / average), offsets into the original
text from HF `tokenizers` (the pipeline's own source of offsets)."""

from __future__ import annotations

import numpy as np

STRATEGIES = ("none", "simple", "first", "max", "average")


class _Words:
    """The tokenizer calls the pipeline makes: id -> token, tokens -> string, unk id."""

    def __init__(self, hf):
        self.hf = hf
        model = hf.model
        self.subword_aware = bool(getattr(model, "continuing_subword_prefix", None))
        unk = getattr(model, "unk_token", None)
        self.unk_id = hf.token_to_id(unk) if isinstance(unk, str) else None

    def token(self, i: int) -> str:
        return self.hf.id_to_token(int(i))

    def join(self, tokens: list[str]) -> str:
        dec = self.hf.decoder
        return dec.decode(tokens) if dec is not None else " ".join(tokens)


def softmax(logits: np.ndarray) -> np.ndarray:
    z = logits.astype(np.float32)
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def pre_entities(words: _Words, text: str, ids, offsets, special, scores) -> list[dict]:
    out = []
    for idx, sc in enumerate(scores):
        if special[idx]:
            continue
        word = words.token(ids[idx])
        s, e = int(offsets[idx][0]), int(offsets[idx][1])
        ref = text[s:e]
        if words.subword_aware:
            is_sub = len(word) != len(ref)
        else:  # the pipeline's fallback heuristic
            is_sub = s > 0 and " " not in text[s - 1 : s + 1]
        if words.unk_id is not None and int(ids[idx]) == words.unk_id:
            word, is_sub = ref, False
        out.append(
            {"word": word, "scores": sc, "start": s, "end": e, "index": idx, "is_subword": is_sub}
        )
    return out


def _word(words: _Words, group: list[dict], strategy: str, labels) -> dict:
    if strategy == "first":
        sc = group[0]["scores"]
    elif strategy == "max":
        sc = max(group, key=lambda g: g["scores"].max())["scores"]
    else:
        sc = np.nanmean(np.stack([g["scores"] for g in group]), axis=0)
    i = int(sc.argmax())
    return {
        "entity": labels[i],
        "score": sc[i],
        "word": words.join([g["word"] for g in group]),
        "start": group[0]["start"],
        "end": group[-1]["end"],
    }


def _tag(name: str) -> tuple[str, str]:
    if name.startswith("B-"):
        return "B", name[2:]
    if name.startswith("I-"):
        return "I", name[2:]
    return "I", name


def _group(words: _Words, ents: list[dict]) -> dict:
    return {
        "entity_group": ents[0]["entity"].split("-", 1)[-1],
        "score": float(np.mean(np.nanmean([e["score"] for e in ents]))),
        "word": words.join([e["word"] for e in ents]),
        "start": ents[0]["start"],
        "end": ents[-1]["end"],
    }


def aggregate(words: _Words, pre: list[dict], strategy: str, labels) -> list[dict]:
    if strategy in ("none", "simple"):
        ents = []
        for p in pre:
            i = int(p["scores"].argmax())
            ents.append(
                {
                    "entity": labels[i],
                    "score": p["scores"][i],
                    "index": p["index"],
                    "word": p["word"],
                    "start": p["start"],
                    "end": p["end"],
                }
            )
    else:
        ents, group = [], None
        for p in pre:
            if group is None:
                group = [p]
            elif p["is_subword"]:
                group.append(p)
            else:
                ents.append(_word(words, group, strategy, labels))
                group = [p]
        if group is not None:
            ents.append(_word(words, group, strategy, labels))
    if strategy == "none":
        for e in ents:
            e["score"] = float(e["score"])
        return ents
    groups, cur = [], []
    for e in ents:
        if not cur:
            cur.append(e)
            continue
        bi, tag = _tag(e["entity"])
        _, last = _tag(cur[-1]["entity"])
        if tag == last and bi != "B":
            cur.append(e)
        else:
            groups.append(_group(words, cur))
            cur = [e]
    if cur:
        groups.append(_group(words, cur))
    return groups


def entities(
    words, text, ids, offsets, special, logits, labels, strategy, ignore=("O",)
) -> list[dict]:
    pre = pre_entities(words, text, ids, offsets, special, softmax(logits))
    out = aggregate(words, pre, strategy, labels)
    return [e for e in out if e.get("entity") not in ignore and e.get("entity_group") not in ignore]
