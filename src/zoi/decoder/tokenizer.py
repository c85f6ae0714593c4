"""The decoder's tokenizer (Hugging Face `tokenizers`, tokenizer.json of the folder), its chat
template (rendered with jinja2 as transformers does) and incremental detokenisation."""

from __future__ import annotations

import json
import os
from datetime import datetime
from pathlib import Path
from typing import Any

from zoi.errors import CheckpointError, InputError
from zoi.frontend.checkpoint import read_json
from zoi.frontend.paths import check_file

MAX_TOKENIZER_BYTES = 256 << 20


def _token_text(v: Any) -> str | None:
    if isinstance(v, str):
        return v
    if isinstance(v, dict) and isinstance(v.get("content"), str):
        return v["content"]
    return None


class DecoderTokenizer:
    """encode / decode / apply_chat_template of a decoder folder."""

    def __init__(self, folder: str | os.PathLike):
        from tokenizers import Tokenizer

        folder = Path(folder)
        tj = folder / "tokenizer.json"
        if not tj.exists():
            raise CheckpointError(
                f"{folder}: no tokenizer.json; zoi reads the fast (Hugging Face tokenizers) file. "
                "Save it once with AutoTokenizer.from_pretrained(DIR).save_pretrained(DIR)"
            )
        size = check_file(tj, folder)
        if size > MAX_TOKENIZER_BYTES:
            raise CheckpointError(f"{tj}: {size} bytes is too large for a tokenizer file")
        try:
            self._tok = Tokenizer.from_file(str(tj))
        except Exception as e:  # tokenizers raises its own Exception type
            raise CheckpointError(f"{tj}: not a valid tokenizer.json ({e})") from e
        cfg_path = folder / "tokenizer_config.json"
        cfg = read_json(cfg_path, folder) if cfg_path.exists() else {}
        self.config = cfg if isinstance(cfg, dict) else {}
        self.special: dict[str, str] = {}
        for k in ("bos_token", "eos_token", "unk_token", "pad_token"):
            t = _token_text(self.config.get(k))
            if t is not None:
                self.special[k] = t
        self.chat_template = self._find_template(folder)
        self._compiled = None
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)

    def _find_template(self, folder: Path) -> str | None:
        jf = folder / "chat_template.jinja"
        if jf.exists():
            check_file(jf, folder)
            return jf.read_text(encoding="utf-8")
        jj = folder / "chat_template.json"
        if jj.exists():
            d = read_json(jj, folder)
            if isinstance(d, dict) and isinstance(d.get("chat_template"), str):
                return d["chat_template"]
        t = self.config.get("chat_template")
        if isinstance(t, str):
            return t
        if isinstance(t, list):  # [{name, template}]: the "default" one
            for e in t:
                if isinstance(e, dict) and e.get("name") == "default" and isinstance(e.get("template"), str):
                    return e["template"]
        return None

    def token_id(self, text: str) -> int | None:
        return self._tok.token_to_id(text)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if not isinstance(text, str):
            raise InputError(f"a prompt must be a string, got {type(text).__name__}")
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True, **kwargs) -> str:
        """The rendered prompt text (as transformers' apply_chat_template(tokenize=False))."""
        if self.chat_template is None:
            raise InputError(
                "this model folder has no chat template (tokenizer_config.json 'chat_template' or "
                "chat_template.jinja); use generate() with a plain prompt"
            )
        if not isinstance(messages, list) or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages
        ):
            raise InputError("messages must be a list of {'role': ..., 'content': ...} objects")
        if self._compiled is None:
            self._compiled = _compile(self.chat_template)
        return self._compiled.render(
            messages=messages, add_generation_prompt=add_generation_prompt, **self.special, **kwargs
        )


def _compile(template: str):
    import jinja2
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise InputError(f"chat template: {message}")

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    try:
        return env.from_string(template)
    except jinja2.TemplateError as e:
        raise CheckpointError(f"chat template does not compile: {e}") from e


class IncrementalDecoder:
    """Text deltas of a growing id list that never split a UTF-8 character: a delta is emitted
    once the decoded window no longer ends in U+FFFD (an incomplete byte sequence)."""

    def __init__(self, tok: DecoderTokenizer, prompt_ids=()):
        self.tok = tok
        self.ids: list[int] = list(prompt_ids)[-4:]  # context for decoders that strip a leading space
        self.prefix = 0
        self.read = len(self.ids)

    def push(self, token_id: int) -> str:
        self.ids.append(int(token_id))
        prefix_text = self.tok.decode(self.ids[self.prefix:self.read])
        new_text = self.tok.decode(self.ids[self.prefix:])
        if len(new_text) > len(prefix_text) and not new_text.endswith("\ufffd"):
            delta = new_text[len(prefix_text):]
            self.prefix, self.read = self.read, len(self.ids)
            return delta
        return ""

    def flush(self) -> str:
        prefix_text = self.tok.decode(self.ids[self.prefix:self.read])
        new_text = self.tok.decode(self.ids[self.prefix:])
        self.prefix = self.read = len(self.ids)
        return new_text[len(prefix_text):] if len(new_text) > len(prefix_text) else ""


class StopMatcher:
    """Stop strings matched across deltas: text that could still start a stop string is held."""

    def __init__(self, stops):
        self.stops = [s for s in stops if s]
        self.pending = ""
        self.stopped = False

    def push(self, delta: str) -> str:
        if self.stopped:
            return ""
        self.pending += delta
        if not self.stops:
            out, self.pending = self.pending, ""
            return out
        hit = -1
        for s in self.stops:
            i = self.pending.find(s)
            if i >= 0 and (hit < 0 or i < hit):
                hit = i
        if hit >= 0:
            self.stopped = True
            out, self.pending = self.pending[:hit], ""
            return out
        hold = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(self.pending)), 0, -1):
                if self.pending.endswith(s[:n]):
                    hold = max(hold, n)
                    break
        out = self.pending[: len(self.pending) - hold]
        self.pending = self.pending[len(self.pending) - hold:]
        return out

    def flush(self) -> str:
        out, self.pending = ("" if self.stopped else self.pending), ""
        return out
