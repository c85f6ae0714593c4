"""Tokenisation: the native WordPiece, byte-level BPE and SentencePiece (Unigram,
SentencePiece BPE) tokenizers, or HF `tokenizers` for the other families; truncation per
call, packing without padding."""

from __future__ import annotations

import json
import os
import re
import threading
from pathlib import Path

import numpy as np

from zoi.errors import CheckpointError, InputError
from zoi.frontend import bpe, sentencepiece
from zoi.frontend.wordpiece import native_config

# Characters kept per usable position before tokenising. A token is rarely longer than ~10
# characters of real text, so 32x keeps truncation exact for text while bounding the work a
# single huge string can cause.
CHARS_PER_POSITION = 32


_WORD = re.compile(r"\S+")


def clip_text(t: str, n: int) -> str:
    """`t` cut after its n-th non-whitespace character: whitespace does not count against the
    character cap (a text that starts with 9,000 spaces keeps its words). HF path only: the
    native tokenizer needs no cap (it stops at the token limit)."""
    kept = 0
    for m in _WORD.finditer(t):
        kept += m.end() - m.start()
        if kept >= n:
            return t[: m.end() - (kept - n)]
    return t


TOKENIZER_CHOICES = ("auto", "native", "hf")
TOKENIZER_ENV = "ZOI_TOKENIZER"


def check_tokenizer_choice(choice: str, what: str = "tokenizer") -> str:
    """`choice` normalised, or a ValueError naming the option (`what`)."""
    want = choice.strip().lower() if isinstance(choice, str) else choice
    if want not in TOKENIZER_CHOICES:
        raise ValueError(
            f"{what} must be 'auto' (the native tokenizer where it covers the file, else HF "
            f"tokenizers), 'native' or 'hf', got {choice!r}"
        )
    return want


def tokenizer_choice(choice: str | None = None, env=None) -> str:
    """The tokenizer option at the API's edge (zoi.compile / zoi.load / the CLI): `choice`
    when given, else ZOI_TOKENIZER from the environment, else 'auto'. The one place that reads
    ZOI_TOKENIZER; everything below takes the result as an argument."""
    if choice is not None:
        return check_tokenizer_choice(choice)
    env = os.environ if env is None else env
    raw = env.get(TOKENIZER_ENV)
    return "auto" if raw is None else check_tokenizer_choice(raw, TOKENIZER_ENV)


def _native_module():
    try:
        from zoi import _cpu
    except ImportError:  # pragma: no cover - a build without the native core
        return None
    return _cpu if hasattr(_cpu, "WordPiece") else None


def native_spec(parsed, max_positions: int) -> tuple[str, dict | str, str, str]:
    """Which native tokenizer runs this tokenizer.json (parsed): (zoi._cpu class name, its
    keyword arguments or the reason the family's reader refuses the file, the prefix of that
    reason, the kind reported)."""
    model = parsed.get("model") if isinstance(parsed, dict) else None
    mtype = model.get("type") if isinstance(model, dict) else None
    if mtype == "Unigram" or (mtype == "BPE" and sentencepiece.is_sentencepiece_bpe(parsed)):
        kind = "native Unigram" if mtype == "Unigram" else "native SentencePiece BPE"
        cfg = sentencepiece.native_config(parsed, max_positions)
        return "SentencePiece", cfg, f"model type {mtype!r}", kind
    if mtype == "BPE":
        cfg = bpe.native_config(parsed, max_positions)
        return "ByteBPE", cfg, "model type 'BPE'", "native byte-level BPE"
    return "WordPiece", native_config(parsed, max_positions), "", "native WordPiece"


class Tokenizer:
    """Texts -> token ids. The native tokenizers, exact to HF, run the files they cover:
    WordPiece (zoi._cpu.WordPiece, zoi.frontend.wordpiece), byte-level BPE
    (zoi._cpu.ByteBPE, zoi.frontend.bpe), Unigram and SentencePiece BPE
    (zoi._cpu.SentencePiece, zoi.frontend.sentencepiece); HF `tokenizers` runs the others, or
    every file with tokenizer="hf". Thread-safe: truncation is an argument of each call."""

    def __init__(
        self,
        tokenizer_json: str,
        max_positions: int,
        position_offset: int = 0,
        source: str = "tokenizer.json",
        validate: bool = True,
        tokenizer: str = "auto",
    ):
        """validate=False: the file is known good (an artifact's, checked against its digest
        when it was compiled), so HF `tokenizers` need not load it to prove it.
        tokenizer: "auto" (native where it covers the file, else HF tokenizers), "native"
        (refuse a file it does not cover) or "hf" (HF tokenizers for every file); the
        environment (ZOI_TOKENIZER) is read by the callers at the API's edge
        (`tokenizer_choice`), never here."""
        self.json = tokenizer_json
        self.max_positions = max_positions
        self.position_offset = position_offset
        self.max_chars = CHARS_PER_POSITION * max_positions
        self.native = None
        self.native_kind = ""
        self.fallback_reason = ""
        self._lock = threading.Lock()
        self._hf_limits: dict = {}
        want = self.choice = check_tokenizer_choice(tokenizer)
        cpu = _native_module()
        if want == "hf":
            self.fallback_reason = "tokenizer='hf'"
        elif cpu is None:
            self.fallback_reason = "the native core has no tokenizer"
        else:
            try:
                parsed = json.loads(tokenizer_json)
            except ValueError as e:
                raise CheckpointError(
                    f"{source}: not a valid tokenizers file (not JSON: {e})"
                ) from e
            self._native_from(cpu, parsed, max_positions)
        if want == "native" and self.native is None:
            raise CheckpointError(
                f"{source}: tokenizer='native' (or ZOI_TOKENIZER=native), but the native "
                f"tokenizer cannot run this file ({self.fallback_reason}); pass tokenizer='auto' "
                "(and unset ZOI_TOKENIZER) to use HF tokenizers for it"
            )
        self._source = source
        self._hf_pair = None
        if self.native is None or validate:  # a bad file fails here, not at the first call
            self._hf_instances()

    def _native_from(self, cpu, parsed, max_positions: int) -> None:
        """The native tokenizer for this file, or the reason there is none."""
        self._build_native(cpu, *native_spec(parsed, max_positions))

    def _build_native(self, cpu, cls: str, cfg: dict | str, what: str, kind: str) -> None:
        """zoi._cpu.<cls>(**cfg) as this tokenizer's native one, or the reason it cannot be
        (cfg a str: why the family's reader refuses the file; `what` prefixes it)."""
        if not isinstance(cfg, str) and not hasattr(cpu, cls):  # pragma: no cover - an older core
            cfg = "a native core without it"
        if isinstance(cfg, str):
            self.fallback_reason = f"{what} with {cfg}" if what else cfg
            return
        try:
            self.native = getattr(cpu, cls)(**cfg)
        except ValueError as e:  # HF refuses such a file too (a merge outside the vocab)
            self.fallback_reason = f"{what}: {e}" if what else str(e)
            return
        self.native_kind = kind

    # HF `tokenizers` proves a new file at compile time; loading an artifact whose file the
    # native tokenizer runs, it is imported only when a caller needs what only it gives
    # (offsets, pairs): such a process never loads it (a smaller process, a faster start).
    def _hf_instances(self):
        with self._lock:
            if self._hf_pair is None:
                self._hf_pair = self._build_hf(self.json, self.max_positions, self._source)
            return self._hf_pair

    @staticmethod
    def _build_hf(tokenizer_json: str, max_positions: int, source: str):
        from tokenizers import Tokenizer as HFTokenizer

        try:
            # two HF instances with fixed settings: changing one's truncation while another
            # thread encodes with it would race (and PyO3 refuses a borrow it cannot give)
            full = HFTokenizer.from_str(tokenizer_json)
            full.no_padding()
            full.no_truncation()
            full.encode("probe", add_special_tokens=True)
            trunc = HFTokenizer.from_str(tokenizer_json)
            trunc.no_padding()
            trunc.enable_truncation(max_positions)
        except (KeyboardInterrupt, SystemExit):
            raise
        except (
            BaseException
        ) as e:  # Exception, or pyo3's PanicException (a BaseException) on corrupt files
            raise CheckpointError(
                f"{source}: not a valid tokenizers file ({type(e).__name__}: {e})"
            ) from e
        return full, trunc

    @property
    def _hf_full(self):
        return self._hf_instances()[0]

    @property
    def _hf_trunc(self):
        return self._hf_instances()[1]

    @property
    def kind(self) -> str:
        """Which tokenizer runs: 'native WordPiece', 'native byte-level BPE', 'native Unigram',
        'native SentencePiece BPE' or 'HF tokenizers (<why>)'."""
        if self.native is not None:
            return self.native_kind
        return f"HF tokenizers ({self.fallback_reason})"

    @classmethod
    def from_file(
        cls,
        path: str | Path,
        max_positions: int,
        position_offset: int = 0,
        validate: bool = True,
        tokenizer: str = "auto",
    ) -> Tokenizer:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise CheckpointError(f"{path}: cannot read ({e})") from e
        return cls(
            text,
            max_positions,
            position_offset,
            source=str(path),
            validate=validate,
            tokenizer=tokenizer,
        )

    @staticmethod
    def check_texts(texts) -> list[str]:
        if isinstance(texts, (str, bytes)):
            raise TypeError("expected a list of str")
        try:
            items = list(texts)
        except TypeError as e:
            raise TypeError(
                f"texts should be a str or a list of str, got {type(texts).__name__}"
            ) from e
        for i, t in enumerate(items):
            if not isinstance(t, str):
                raise TypeError(f"texts[{i}] is {type(t).__name__}, expected str")
        return items

    def _over(self, i: int, n: int | str, limit: int | None = None) -> InputError:
        if limit is None or limit >= self.max_positions:
            what = f"the model's limit of {self.max_positions}"
        else:
            what = f"the engine's limit of {limit} (its max_tokens)"
        return InputError(
            f"texts[{i}] has {n} tokens, over {what} (special tokens included); "
            "shorten it or pass truncate=True"
        )

    def encode_packed(
        self, texts, truncate: bool = True, nthreads: int = 0, max_len: int | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """All texts packed in order: (ids[T], positions[T], cu_seqlens[B+1]), int32. One
        native call (GIL released) with the native tokenizer; texts is a list of str.
        max_len: a tighter limit than the model's (an engine with max_tokens below it)."""
        limit = self.max_positions if max_len is None else min(int(max_len), self.max_positions)
        if self.native is None:
            seqs = self._hf_encode(self.check_texts(texts), truncate, limit)
            return pack(seqs, self.position_offset)
        try:
            ids, pos, cu, bad = self.native.encode_packed(
                texts, bool(truncate), self.position_offset, nthreads, limit
            )
        except ValueError as e:  # a lone surrogate: name the text
            raise InputError(str(e)) from None
        if bad >= 0:
            raise self.over_error(texts[bad], bad, limit)
        return ids, pos, cu

    def over_error(self, text: str, i: int, limit: int) -> InputError:
        """The error for texts[i] = text, over `limit` tokens (native tokenizer): its tokens
        counted up to a cap for the message."""
        cap = max(64 * limit, 1 << 16)
        n = len(self.native.encode_packed([text], True, 0, 1, cap)[0])
        return self._over(i, n if n < cap else f"at least {cap}", limit)

    def stream(self, texts, truncate: bool = True, max_len: int | None = None):
        """A native TokenStream over texts (zoi.pipeline.StreamSource: chunks tokenised on
        demand into staging buffers), or None when HF tokenizers runs this file."""
        if self.native is None:
            return None
        limit = self.max_positions if max_len is None else min(int(max_len), self.max_positions)
        try:
            return self.native.stream(texts, bool(truncate), self.position_offset, 0, limit)
        except ValueError as e:  # a lone surrogate: name the text
            raise InputError(str(e)) from None

    def _hf_for(self, limit: int):
        """An HF instance truncating at `limit` (settings fixed per instance: thread-safe)."""
        if limit >= self.max_positions:
            return self._hf_trunc
        with self._lock:
            tok = self._hf_limits.get(limit)
            if tok is None:
                from tokenizers import Tokenizer as HFTokenizer

                tok = HFTokenizer.from_str(self.json)
                tok.no_padding()
                tok.enable_truncation(limit)
                self._hf_limits[limit] = tok
            return tok

    def _hf_encode(
        self, texts: list[str], truncate: bool, limit: int | None = None
    ) -> list[np.ndarray]:
        limit = self.max_positions if limit is None else limit
        if not truncate:
            for i, t in enumerate(texts):
                if len(t) > self.max_chars and len(clip_text(t, self.max_chars)) < len(t):
                    raise InputError(
                        f"texts[{i}] has {len(t)} characters, over the cap of {self.max_chars} "
                        f"({CHARS_PER_POSITION} x {self.max_positions} positions); shorten it or pass truncate=True"
                    )
        clipped = [t if len(t) <= self.max_chars else clip_text(t, self.max_chars) for t in texts]
        tok = self._hf_for(limit) if truncate else self._hf_full
        try:
            encs = tok.encode_batch(clipped, add_special_tokens=True)
        except TypeError:
            for i, t in enumerate(texts):
                try:
                    t.encode("utf-8")
                except UnicodeEncodeError as e:
                    raise InputError(
                        f"texts[{i}] is not valid Unicode text (a lone surrogate "
                        f"{t[e.start]!r} at character {e.start}); decode it with "
                        "errors='replace' or fix its source"
                    ) from None
            raise
        out = []
        for i, e in enumerate(encs):
            ids = np.asarray(e.ids, dtype=np.int32)
            if len(ids) > limit:
                raise self._over(i, len(ids), limit)
            out.append(ids)
        return out

    def encode_ids(
        self, texts: list[str], truncate: bool = True, max_len: int | None = None
    ) -> list[np.ndarray]:
        """Token ids (int32 arrays, special tokens included) of each text, in order."""
        if self.native is None:
            limit = self.max_positions if max_len is None else min(max_len, self.max_positions)
            return self._hf_encode(texts, truncate, limit)
        ids, _, cu = self.encode_packed(texts, truncate, max_len=max_len)
        return np.split(ids, cu[1:-1]) if len(texts) else []

    def count_tokens(self, texts: list[str], truncate: bool = True) -> list[int]:
        if self.native is not None:
            return np.diff(self.encode_packed(texts, truncate)[2]).tolist()
        return [len(x) for x in self.encode_ids(texts, truncate)]


def pack(
    seqs: list[np.ndarray], position_offset: int = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pack token id arrays into (ids[T], positions[T], cu_seqlens[B+1]), all int32."""
    lens = np.fromiter((len(s) for s in seqs), dtype=np.int32, count=len(seqs))
    cu = np.zeros(len(seqs) + 1, dtype=np.int32)
    np.cumsum(lens, out=cu[1:])
    ids = np.concatenate(seqs).astype(np.int32, copy=False) if seqs else np.zeros(0, np.int32)
    starts = np.repeat(cu[:-1], lens)
    positions = (np.arange(len(ids), dtype=np.int32) - starts + position_offset).astype(np.int32)
    return ids, positions, cu


def chat_environment(raise_exception):
    """The jinja environment transformers renders chat templates in."""
    from datetime import datetime

    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env
