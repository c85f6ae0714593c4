"""Real text for the benchmark: token ids of exactly a given length, natural-length sets.

Two sources, both plain text, one paragraph or sentence per line:

- ``zoi/data/eval.txt`` (the quantisation evaluation set), used for accuracy when present;
- ``zoi/bench/data/corpus.txt`` (shipped with the harness: paragraphs of the Python standard
  library's documentation strings), used for the timing inputs and as the fallback for accuracy.

Everything is deterministic: the same ids for every provider and every run.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

_HERE = Path(__file__).resolve().parent
CORPUS = _HERE / "data" / "corpus.txt"
EVAL = _HERE.parent / "data" / "eval.txt"


def read_lines(path: Path) -> list[str]:
    with open(path, encoding="utf-8") as f:
        return [ln.strip() for ln in f if ln.strip() and not ln.startswith("#")]


def corpus_lines() -> list[str]:
    return read_lines(CORPUS)


def eval_sentences(n: int) -> tuple[list[str], str]:
    """At least ``n`` real sentences (fewer only if both sources together are shorter)."""
    src = []
    names = []
    if EVAL.exists():
        src += read_lines(EVAL)
        names.append("zoi/data/eval.txt")
    if len(src) < n:
        src += [s for s in corpus_lines() if s not in set(src)]
        names.append("zoi/bench/data/corpus.txt")
    return src[:n], "+".join(names)


class Tok:
    """The model's own tokenizer (HF ``tokenizers``), ids as int32."""

    def __init__(self, model_dir: str | os.PathLike):
        from tokenizers import Tokenizer

        self.tk = Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))
        self.tk.no_truncation()
        self.tk.no_padding()
        self.cls = self.tk.token_to_id("[CLS]")
        self.sep = self.tk.token_to_id("[SEP]")
        if self.cls is None or self.sep is None:
            raise ValueError("benchmark tokenizer needs [CLS]/[SEP] (BERT vocabulary)")

    def body(self, texts: list[str]) -> list[np.ndarray]:
        """Ids without special tokens."""
        encs = self.tk.encode_batch(texts, add_special_tokens=False)
        return [np.asarray(e.ids, dtype=np.int32) for e in encs]

    def encode(self, texts: list[str], max_len: int) -> list[np.ndarray]:
        """[CLS] text [SEP], truncated to ``max_len`` tokens in all."""
        out = []
        for b in self.body(texts):
            b = b[: max_len - 2]
            out.append(np.concatenate([[self.cls], b, [self.sep]]).astype(np.int32))
        return out


def exact_length_batch(tok: Tok, batch: int, seq: int, offset: int = 0) -> list[np.ndarray]:
    """``batch`` sequences of exactly ``seq`` tokens each: [CLS] + real text + [SEP].

    The text is the corpus read as one stream; row r starts ``(offset + r) * 97`` paragraphs in,
    so rows differ and every shape gets its own text.
    """
    lines = corpus_lines()
    need = seq - 2
    rows = []
    for r in range(batch):
        start = ((offset + r) * 97) % len(lines)
        ids: list[int] = []
        i = start
        while len(ids) < need:
            ids.extend(tok.body([lines[i % len(lines)]])[0].tolist())
            i += 1
        rows.append(np.asarray([tok.cls, *ids[:need], tok.sep], dtype=np.int32))
    return rows


def natural_set(tok: Tok, n: int, max_len: int, seed: int = 64) -> list[np.ndarray]:
    """``n`` real corpus paragraphs at their natural lengths (16 to ``max_len`` tokens, no
    padding, no cutting), drawn with a fixed seed."""
    lines = corpus_lines()
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(lines))
    out = []
    for i in order:
        ids = tok.encode([lines[i]], max_len)[0]
        if 16 <= len(ids) <= max_len:  # sentences, not fragments
            out.append(ids)
        if len(out) == n:
            break
    return out


@dataclass
class Packed:
    ids: np.ndarray  # int32[T]
    positions: np.ndarray  # int32[T]
    cu_seqlens: np.ndarray  # int32[B+1]


def pack(seqs: list[np.ndarray]) -> Packed:
    lens = np.asarray([len(s) for s in seqs], dtype=np.int32)
    cu = np.zeros(len(seqs) + 1, dtype=np.int32)
    np.cumsum(lens, out=cu[1:])
    pos = np.concatenate([np.arange(n, dtype=np.int32) for n in lens])
    return Packed(np.concatenate(seqs).astype(np.int32), pos, cu)


def padded_batches(
    seqs: list[np.ndarray], n_batches: int
) -> tuple[list[tuple[np.ndarray, np.ndarray]], np.ndarray]:
    """Sort by length and cut into ``n_batches`` padded batches (ids int64, mask int64).

    Returns the batches and the permutation (``order[i]`` = original index of sorted row i).
    """
    order = np.argsort([len(s) for s in seqs], kind="stable")
    chunks = np.array_split(order, n_batches)
    out = []
    for ch in chunks:
        if len(ch) == 0:
            continue
        L = max(len(seqs[i]) for i in ch)
        ids = np.zeros((len(ch), L), dtype=np.int64)
        mask = np.zeros((len(ch), L), dtype=np.int64)
        for r, i in enumerate(ch):
            ids[r, : len(seqs[i])] = seqs[i]
            mask[r, : len(seqs[i])] = 1
        out.append((ids, mask))
    return out, order


def exact_length_texts(tok: Tok, batch: int, seq: int, offset: int = 0) -> list[str]:
    """``batch`` real prose texts that the model's tokenizer turns into exactly ``seq``
    tokens each ([CLS] and [SEP] included): whole words from the corpus read as a stream,
    row r starting ``(offset + r) * 97`` paragraphs in (a start that cannot land exactly on
    ``seq`` moves on by a word)."""
    words = " ".join(corpus_lines()).split()
    per_line = max(1, len(words) // max(1, len(corpus_lines())))
    out = []
    for r in range(batch):
        start = ((offset + r) * 97 * per_line) % len(words)
        for shift in range(200):
            s = (start + shift) % len(words)
            cand = words[s : s + 4 * seq] if s + 4 * seq <= len(words) else words[s:] + words
            lo, hi = 1, len(cand)
            while lo < hi:  # the fewest words reaching seq tokens
                m = (lo + hi) // 2
                if len(tok.encode([" ".join(cand[:m])], 10**9)[0]) < seq:
                    lo = m + 1
                else:
                    hi = m
            text = " ".join(cand[:lo])
            if len(tok.encode([text], 10**9)[0]) == seq:
                out.append(text)
                break
        else:  # pragma: no cover - prose always lands within a few words
            raise RuntimeError(f"no text of exactly {seq} tokens near word {start}")
    return out


def natural_texts(tok: Tok, n: int, max_len: int, seed: int = 1000) -> list[str]:
    """``n`` real corpus paragraphs at their natural lengths (16 to ``max_len`` tokens),
    drawn with a fixed seed (with repeats only when the corpus holds fewer)."""
    lines = corpus_lines()
    rng = np.random.default_rng(seed)
    lens = [len(x) for x in tok.encode(lines, 10**9)]
    ok = [i for i in range(len(lines)) if 16 <= lens[i] <= max_len]
    picks = rng.permutation(ok).tolist()
    while len(picks) < n:
        picks += rng.permutation(ok).tolist()
    return [lines[i] for i in picks[:n]]
