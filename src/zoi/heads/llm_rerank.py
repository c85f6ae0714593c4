"""How an LLM reranker (a seq_cls head with spec.score_tokens) turns a (query, document) pair
into tokens: what sentence-transformers' CrossEncoder does with the same folder, decided once
at compile (pair_format, kept in the artifact's meta) and replayed per call (pair_encoder).

sentence-transformers' Transformer module (transformer_task "text-generation") formats a pair
one of two ways:

- "pairs": the tokenizer's own pair encoding, `tokenizer(query, document)` with its
  post-processor and `longest_first` truncation (zoi.frontend.pairs.PairEncoder, id for id).
  That is the way when the folder has no chat template, or when its sentence_bert_config.json
  names a modality_config without "message".
- "chat": the pair becomes the messages [{"role": "query", ...}, {"role": "document", ...}]
  rendered by the folder's chat template (the published rerankers ship one that places both,
  e.g. Qwen3-Reranker's <Instruct> / <Query> / <Document> prompt), tokenized as one text
  without special tokens, cut at the length limit; a cut row gets the template's tail tokens
  written back over its last ones (sentence-transformers' restore_suffix), so the last token
  is still the one the score is trained on.

The chat template is rendered at compile with two marker texts: it must insert the query and
the document verbatim (prefix + query + middle + document + suffix, or document first), which
a second render with other texts (spaces, quotes, newlines) checks; a template that edits them
(trim, tojson, ...) is refused rather than approximated. A default prompt
(config_sentence_transformers.json default_prompt_name) is rendered in as sentence-transformers
does: a system message (chat) or before the query (pairs).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from zoi.errors import CheckpointError, InputError, UnsupportedModelError
from zoi.frontend.pairs import STRATEGIES, PairEncoder

ROLES = ("query", "document")
# sentence-transformers' InputFormatter: model types whose chat templates take flat contents
FLAT_MODEL_TYPES = ("apertus", "deepseek_v3", "gpt_oss", "seed_oss")
# ... and the template text that marks structured contents ([{"type": "text", "text": ...}])
STRUCTURED_MARKS = ("content[0]", ".type", "'type'", '"type"', "item.type", "message.content[")
# the fillers sentence-transformers renders twice to find the template's tail tokens
SUFFIX_FILLERS = ("0", "1 2 3 4")
_MARKS = ("\ue000zoi-query\ue001", "\ue000zoi-document\ue001")
_CHECK = (" a query,\n with 'quotes' ", '  "a document"\n\n{x} ')
_SIZE_KEYS = ("padding", "truncation", "max_length", "return_tensors")


def _read(folder: Path, name: str):
    from zoi.frontend.checkpoint import read_json

    p = folder / name
    return read_json(p, folder) if p.is_file() else None


def _chat_template(folder: Path) -> str | None:
    """The folder's chat template as transformers' tokenizer finds it."""
    from zoi.frontend.paths import read_bytes

    jf = folder / "chat_template.jinja"
    if jf.is_file():
        return read_bytes(jf, 16 << 20, folder).decode("utf-8")
    jj = _read(folder, "chat_template.json")
    if isinstance(jj, dict) and isinstance(jj.get("chat_template"), str):
        return jj["chat_template"]
    t = (_read(folder, "tokenizer_config.json") or {}).get("chat_template")
    if isinstance(t, list):  # [{name, template}]: the "default" one
        t = next(
            (e.get("template") for e in t if isinstance(e, dict) and e.get("name") == "default"),
            None,
        )
    return t if isinstance(t, str) else None


def _special_tokens(folder: Path) -> dict[str, str]:
    """tokenizer_config.json's special tokens, the names a chat template may read."""
    cfg = _read(folder, "tokenizer_config.json") or {}
    out = {}
    for k in ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token",
              "mask_token"):  # fmt: skip
        v = cfg.get(k)
        v = v.get("content") if isinstance(v, dict) else v
        if isinstance(v, str):
            out[k] = v
    return out


def _compile(template: str, where: Path):
    """The template under the environment transformers renders chat templates in."""
    import jinja2

    from zoi.frontend.tokenizer import chat_environment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    try:
        return chat_environment(raise_exception).from_string(template)
    except jinja2.TemplateError as e:
        raise CheckpointError(f"{where}: the chat template does not compile ({e})") from e


def _st_settings(folder: Path) -> tuple[dict | None, dict]:
    """(modality_config, chat template kwargs) of the Transformer module's
    sentence_bert_config.json; what would change the tokens and zoi does not replay is refused."""
    path = folder / "sentence_bert_config.json"
    c = _read(folder, "sentence_bert_config.json")
    if not isinstance(c, dict):
        return None, {}
    task = c.get("transformer_task")
    if task not in (None, "text-generation"):
        raise UnsupportedModelError(
            f"{path}: transformer_task {task!r}; an LLM reranker's Transformer module runs "
            "'text-generation' (the causal LM's logits)"
        )
    pk = c.get("processing_kwargs") or {}
    if not isinstance(pk, dict):
        raise CheckpointError(f"{path}: processing_kwargs should be an object, got {pk!r}")
    chat = pk.get("chat_template") or {}
    other = {k: v for k, v in pk.items() if k != "chat_template" and v}
    size = [k for k in chat if k in _SIZE_KEYS] if isinstance(chat, dict) else []
    if other or size or not isinstance(chat, dict):
        names = sorted(other) + [f"chat_template.{k}" for k in size]
        raise UnsupportedModelError(
            f"{path}: processing_kwargs {names or chat!r} are not supported for an LLM "
            "reranker; zoi tokenizes pairs as sentence-transformers does by default (the "
            "model's length limit, longest_first truncation): remove them"
        )
    mc = c.get("modality_config")
    return (mc if isinstance(mc, dict) else None), dict(chat)


def _default_prompt(folder: Path) -> str:
    c = _read(folder, "config_sentence_transformers.json")
    if not isinstance(c, dict):
        return ""
    name, prompts = c.get("default_prompt_name"), c.get("prompts")
    if name is None or not isinstance(prompts, dict):
        return ""
    p = prompts.get(name)
    return p if isinstance(p, str) else ""


def _message_format(template: str, mc: dict | None, model_type: str) -> str:
    fmt = ((mc or {}).get("message") or {}).get("format", "auto")
    if fmt in ("flat", "structured"):
        return fmt
    if model_type in FLAT_MODEL_TYPES:
        return "flat"
    return "structured" if any(m in template for m in STRUCTURED_MARKS) else "flat"


def _messages(pair: tuple[str, str], fmt: str, prompt: str) -> list[dict]:
    def content(text: str):
        return text if fmt == "flat" else [{"type": "text", "text": text}]

    msgs = [{"role": "system", "content": content(prompt)}] if prompt else []
    return msgs + [{"role": r, "content": content(t)} for r, t in zip(ROLES, pair, strict=True)]


def pair_format(folder: str | Path, spec) -> dict:
    """The pair format of an LLM reranker folder (the module doc); kept in model.meta."""
    folder = Path(folder)
    mc, chat_kwargs = _st_settings(folder)
    prompt = _default_prompt(folder)
    template = _chat_template(folder)
    use_chat = template is not None and (mc is None or "message" in mc)
    if not use_chat:
        return {"kind": "pairs", "prompt": prompt}
    cfg = _read(folder, "config.json") or {}
    fmt = _message_format(template, mc, str(cfg.get("model_type", "")))
    where = folder / "chat_template"
    compiled = _compile(template, where)
    restore = bool(chat_kwargs.pop("restore_suffix", True))
    kwargs = {
        **_special_tokens(folder),
        "add_generation_prompt": False,
        **chat_kwargs,
    }

    def render(pair):
        import jinja2

        try:
            return compiled.render(messages=_messages(pair, fmt, prompt), **kwargs)
        except jinja2.TemplateError as e:
            raise UnsupportedModelError(
                f"{folder}: the chat template fails on a query / document pair ({e}); "
                "sentence-transformers maps a pair to the roles 'query' and 'document': set a "
                "template that renders both (chat_template.jinja)"
            ) from None

    text = render(_MARKS)
    at = [text.find(m) for m in _MARKS]
    if any(i < 0 or text.count(m) != 1 for i, m in zip(at, _MARKS, strict=True)):
        lost = [r for r, m in zip(ROLES, _MARKS, strict=True) if text.count(m) != 1]
        raise UnsupportedModelError(
            f"{folder}: the chat template does not place the {' and '.join(lost)} of a pair "
            "exactly once (sentence-transformers maps a pair to the roles 'query' and "
            "'document'); set a template that renders both roles, e.g. Qwen3-Reranker's "
            "<Query>: ... <Document>: ... prompt, in chat_template.jinja"
        )
    order = ROLES if at[0] < at[1] else ROLES[::-1]
    first, second = (_MARKS[0], _MARKS[1]) if order == ROLES else (_MARKS[1], _MARKS[0])
    prefix, rest = text.split(first)
    middle, suffix = rest.split(second)
    pieces = [prefix, middle, suffix]

    def assemble(pair) -> str:
        a, b = pair if order == ROLES else pair[::-1]
        return prefix + a + middle + b + suffix

    if render(_CHECK) != assemble(_CHECK):
        raise UnsupportedModelError(
            f"{folder}: the chat template changes the query or document text it renders (a "
            "filter such as trim or tojson, or a branch on the text); zoi inserts both "
            "verbatim, as sentence-transformers renders the pair with such a template: "
            "render {{ content }} as it is"
        )
    from tokenizers import Tokenizer as HFTokenizer

    tok = HFTokenizer.from_file(str(folder / "tokenizer.json"))
    tok.no_truncation()
    tok.no_padding()
    suffix_ids: list[int] = []
    if restore:
        r = [tok.encode(assemble((f, f)), add_special_tokens=False).ids for f in SUFFIX_FILLERS]
        n = 0
        for x, y in zip(reversed(r[0]), reversed(r[1]), strict=False):
            if x != y:
                break
            n += 1
        if 0 < n < min(map(len, r)):  # the renders diverged: the common tail is the template's
            suffix_ids = r[0][len(r[0]) - n :]
    return {
        "kind": "chat",
        "pieces": pieces,
        "order": list(order),
        "suffix_ids": suffix_ids,
        "template_sha256": hashlib.sha256(template.encode("utf-8")).hexdigest(),
    }


class ChatPairEncoder:
    """Pairs -> packed (ids, positions, types, cu_seqlens) through the rendered chat template
    (a "chat" pair_format); PairEncoder's interface, so the engine and zoi serve use it alike."""

    kind = "chat template"

    def __init__(self, tokenizer, fmt: dict):
        pieces, order = fmt.get("pieces"), fmt.get("order")
        sids = fmt.get("suffix_ids", [])
        if (
            not isinstance(pieces, list)
            or len(pieces) != 3
            or not all(isinstance(p, str) for p in pieces)
            or sorted(order or []) != sorted(ROLES)
            or not isinstance(sids, list)
            or not all(type(i) is int and i >= 0 for i in sids)
        ):
            raise CheckpointError(
                "the artifact's pair_format (meta) is malformed; re-compile the model folder"
            )
        self.tok = tokenizer
        self.pieces = pieces
        self.swap = order[0] != "query"
        self.suffix = np.asarray(sids, np.int32)

    def texts(self, pairs) -> list[str]:
        from zoi.frontend.tokenizer import clip_text

        p, m, s = self.pieces
        cap = self.tok.max_chars  # past it the text is cut by the token limit anyway

        def c(t):
            return t if len(t) <= cap else clip_text(t, cap)

        return [p + c(b) + m + c(a) + s if self.swap else p + c(a) + m + c(b) + s for a, b in pairs]

    def encode(self, pairs, max_len: int, strategy: str = "longest_first"):
        if strategy not in STRATEGIES:
            raise ValueError(f"truncation must be one of {STRATEGIES}, got {strategy!r}")
        if strategy != "longest_first":
            raise InputError(
                f"truncation={strategy!r}: this reranker renders a pair as one text through its "
                "chat template, which is cut at the end (truncation='longest_first')"
            )
        encs = self.tok._hf_full.encode_batch(self.texts(pairs), add_special_tokens=False)
        rows, k = [], len(self.suffix)
        for e in encs:
            ids = np.asarray(e.ids[:max_len], np.int32)
            if len(ids) >= max_len and k:  # cut (or exactly full): the template's tail back
                n = min(k, len(ids))
                ids[len(ids) - n :] = self.suffix[k - n :]
            rows.append(ids)
        lens = np.fromiter((len(r) for r in rows), np.int32, len(rows))
        if len(rows) and lens.min() == 0:
            raise InputError("a pair rendered to no tokens; the chat template gives empty text")
        cu = np.zeros(len(rows) + 1, np.int32)
        np.cumsum(lens, out=cu[1:])
        ids = np.concatenate(rows).astype(np.int32) if rows else np.zeros(0, np.int32)
        pos = (np.arange(len(ids), dtype=np.int32) - np.repeat(cu[:-1], lens)).astype(np.int32)
        return ids, pos + self.tok.position_offset, np.zeros(len(ids), np.int32), cu


class PromptPairEncoder(PairEncoder):
    """The tokenizer's pair encoding with a default prompt before each query, as
    sentence-transformers prepends a prompt to the first text of a pair."""

    def __init__(self, tokenizer, prompt: str):
        super().__init__(tokenizer)
        self.prompt = prompt

    def encode(self, pairs, max_len: int, strategy: str = "longest_first"):
        return super().encode([(self.prompt + a, b) for a, b in pairs], max_len, strategy)


def pair_encoder(tokenizer, meta: dict):
    """The pair encoder of an LLM reranker from its model.meta["pair_format"] (no record: the
    tokenizer's own pairs)."""
    fmt = meta.get("pair_format") or {"kind": "pairs", "prompt": ""}
    if not isinstance(fmt, dict) or fmt.get("kind") not in ("pairs", "chat"):
        raise CheckpointError(
            "the artifact's pair_format (meta) is malformed; re-compile the model folder"
        )
    if fmt["kind"] == "chat":
        return ChatPairEncoder(tokenizer, fmt)
    prompt = fmt.get("prompt") or ""
    if not isinstance(prompt, str):
        raise CheckpointError("the artifact's pair_format prompt should be a string")
    return PromptPairEncoder(tokenizer, prompt) if prompt else PairEncoder(tokenizer)
