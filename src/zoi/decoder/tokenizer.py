"""The decoder's tokenizer (Hugging Face `tokenizers`, tokenizer.json of the folder), its chat
template (rendered with jinja2 as transformers does) and incremental detokenisation."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
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
        # A prompt is exactly its tokens: the file's padding would prefill pad ids as context,
        # its truncation would cut the prompt silently (the context limit is checked with a
        # message instead), as the encoder's tokenizer does (zoi.frontend.tokenizer).
        self._tok.no_padding()
        self._tok.no_truncation()
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
                if (
                    isinstance(e, dict)
                    and e.get("name") == "default"
                    and isinstance(e.get("template"), str)
                ):
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

    def apply_chat_template(
        self, messages: list[dict], add_generation_prompt: bool = True, **kwargs
    ) -> str:
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

    from zoi.frontend.tokenizer import chat_environment

    def raise_exception(message):
        raise InputError(f"chat template: {message}")

    try:
        return chat_environment(raise_exception).from_string(template)
    except jinja2.TemplateError as e:
        raise CheckpointError(f"chat template does not compile: {e}") from e


PROMPT_CONTEXT = 6  # prompt ids kept in front of the generated ones when detokenising


class Detokenizer:
    """Text deltas from token ids, as vLLM and TGI do: decode a short window (a few ids before the
    last emitted one, for the tokenizers whose decoding depends on the previous token) and emit the
    new suffix, unless it ends in U+FFFD (a UTF-8 character cut between tokens: wait for the next)."""

    def __init__(self, decode: Callable[[Sequence[int]], str], prompt_tail: Sequence[int] = ()):
        self.decode = decode
        self.ids = [int(i) for i in prompt_tail]
        self.prefix = 0
        self.read = len(self.ids)

    def push(self, token_id: int) -> str:
        self.ids.append(int(token_id))
        return self._emit(final=False)

    def flush(self) -> str:
        """What is left at the end (an incomplete character shows as U+FFFD)."""
        return self._emit(final=True)

    def _emit(self, final: bool) -> str:
        if self.read == len(self.ids):
            return ""
        before = self.decode(self.ids[self.prefix : self.read])
        text = self.decode(self.ids[self.prefix :])
        if len(text) > len(before) and (final or not text.endswith("\ufffd")):
            delta = text[len(before) :]
            self.prefix, self.read = self.read, len(self.ids)
            if len(self.ids) > 64:  # keep the window short
                drop = self.prefix
                self.ids = self.ids[drop:]
                self.prefix -= drop
                self.read -= drop
            return delta
        if final:
            self.read = len(self.ids)
        return ""


class StopMatcher:
    """Stop strings on the text across deltas. feed() returns (text safe to emit, stopped): text
    that could still start a stop string is held back until the next delta shows it does not."""

    def __init__(self, stops: Sequence[str]):
        self.stops = tuple(s for s in stops if s)
        self.longest = max((len(s) for s in self.stops), default=0)
        self.pending = ""  # text received, not yet emitted

    def feed(self, delta: str) -> tuple[str, bool]:
        if not self.stops:
            return delta, False
        start = max(0, len(self.pending) - self.longest + 1)
        text = self.pending + delta
        hit = min(
            (i for i in (text.find(s, start) for s in self.stops) if i >= 0),
            default=-1,
        )
        if hit >= 0:
            self.pending = ""
            return text[:hit], True
        hold = 0
        for k in range(min(self.longest - 1, len(text)), 0, -1):
            tail = text[-k:]
            if any(s.startswith(tail) for s in self.stops):
                hold = k
                break
        self.pending = text[len(text) - hold :] if hold else ""
        return text[: len(text) - hold], False

    def flush(self) -> str:
        out, self.pending = self.pending, ""
        return out


class TextStream:
    """The text of one generation as its tokens arrive, for the Generator and the serving
    Scheduler alike: incremental detokenisation (Detokenizer), stop strings (StopMatcher), and the
    token that ended it (an EOS or stop token id: finish "stop" on one of `end_ids`) left out of
    the text, as vLLM does. push() returns the text to emit; `stopped` once a stop string matched
    (nothing after it is ever emitted)."""

    def __init__(
        self,
        decode: Callable[[Sequence[int]], str],
        prompt_ids: Sequence[int] = (),
        stops: Sequence[str] = (),
        end_ids: Sequence[int] = (),
    ):
        self.detok = Detokenizer(decode, [int(i) for i in prompt_ids][-PROMPT_CONTEXT:])
        self.stops = StopMatcher(stops)
        self.end_ids = frozenset(int(i) for i in end_ids)
        self.stopped = False

    def push(self, token_id: int, finish=None) -> str:
        """finish: the backend's FinishReason on the sequence's last token, else None."""
        if self.stopped:
            return ""
        ended = finish == "stop" and int(token_id) in self.end_ids
        delta = "" if ended else self.detok.push(token_id)
        if finish is not None:
            delta += self.detok.flush()
        text, self.stopped = self.stops.feed(delta)
        if not self.stopped and finish is not None:
            text += self.stops.flush()
        return text
