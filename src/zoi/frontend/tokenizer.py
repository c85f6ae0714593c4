"""Tokenisation with HF `tokenizers`: truncation, a character cap, packing without padding."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from zoi.errors import CheckpointError, InputError

# Characters kept per usable position before tokenising. A token is rarely longer than ~10
# characters of real text, so 32x keeps truncation exact for text while bounding the work a
# single huge string can cause.
CHARS_PER_POSITION = 32


_WORD = re.compile(r"\S+")


def clip_text(t: str, n: int) -> str:
    """`t` cut after its n-th non-whitespace character: whitespace does not count against the
    character cap (a text that starts with 9,000 spaces keeps its words)."""
    kept = 0
    for m in _WORD.finditer(t):
        kept += m.end() - m.start()
        if kept >= n:
            return t[: m.end() - (kept - n)]
    return t


class Tokenizer:
    def __init__(
        self,
        tokenizer_json: str,
        max_positions: int,
        position_offset: int = 0,
        source: str = "tokenizer.json",
    ):
        from tokenizers import Tokenizer as HFTokenizer

        try:
            self._tok = HFTokenizer.from_str(tokenizer_json)
            self._tok.no_padding()
            self._tok.no_truncation()
            self._special = self._tok.num_special_tokens_to_add(False)
            self._tok.encode("probe", add_special_tokens=True)
        except (KeyboardInterrupt, SystemExit):
            raise
        except (
            BaseException
        ) as e:  # Exception, or pyo3's PanicException (a BaseException) on corrupt files
            raise CheckpointError(
                f"{source}: not a valid tokenizers file ({type(e).__name__}: {e})"
            ) from e
        self.json = tokenizer_json
        self.max_positions = max_positions
        self.position_offset = position_offset
        self.max_chars = CHARS_PER_POSITION * max_positions
        self._trunc = False

    @classmethod
    def from_file(cls, path: str | Path, max_positions: int, position_offset: int = 0) -> Tokenizer:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise CheckpointError(f"{path}: cannot read ({e})") from e
        return cls(text, max_positions, position_offset, source=str(path))

    def _set_truncation(self, on: bool) -> None:
        if on != self._trunc:
            if on:
                self._tok.enable_truncation(self.max_positions)
            else:
                self._tok.no_truncation()
            self._trunc = on

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

    def encode_ids(self, texts: list[str], truncate: bool = True) -> list[np.ndarray]:
        """Token ids (int32 arrays, special tokens included) of each text, in order."""
        if not truncate:
            for i, t in enumerate(texts):
                if len(t) > self.max_chars and len(clip_text(t, self.max_chars)) < len(t):
                    raise InputError(
                        f"texts[{i}] has {len(t)} characters, over the cap of {self.max_chars} "
                        f"({CHARS_PER_POSITION} x {self.max_positions} positions); shorten it or pass truncate=True"
                    )
        clipped = [t if len(t) <= self.max_chars else clip_text(t, self.max_chars) for t in texts]
        self._set_truncation(truncate)
        try:
            encs = self._tok.encode_batch(clipped, add_special_tokens=True)
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
            if len(ids) > self.max_positions:
                raise InputError(
                    f"texts[{i}] has {len(ids)} tokens, over the model's limit of {self.max_positions}; "
                    "shorten it or pass truncate=True"
                )
            out.append(ids)
        return out

    def count_tokens(self, texts: list[str], truncate: bool = True) -> list[int]:
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
