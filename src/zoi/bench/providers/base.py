"""What every provider implements. A provider lives in its own worker process."""

from __future__ import annotations

import numpy as np

from zoi.bench.text import padded_batches


class Provider:
    """``call(prepared)`` is what is timed: token ids already in host memory in the form the
    library takes, to the pooled ``float32 [B, H]`` result in host memory."""

    def __init__(
        self,
        spec,
        model_dir: str,
        artifacts: dict,
        threads: int,
        max_tokens: int,
        max_batch: int = 256,
    ):
        self.spec = spec
        self.model_dir = model_dir
        self.artifacts = artifacts
        self.threads = threads
        self.max_tokens = max_tokens
        self.max_batch = max_batch

    # -- parent side ---------------------------------------------------------------------
    @classmethod
    def convert(cls, spec, model, cache) -> dict:
        """Build (or find in the cache) what ``load`` needs; runs in the parent process."""
        return {}

    # -- worker side ---------------------------------------------------------------------
    def load(self) -> None:
        raise NotImplementedError

    def prepare(self, seqs: list[np.ndarray], n_batches: int):
        raise NotImplementedError

    def call(self, prepared) -> np.ndarray:
        raise NotImplementedError

    def embed(self, seqs: list[np.ndarray], batch: int) -> np.ndarray:
        """Pooled embeddings of ``seqs`` in their order (length-sorted chunks of ``batch``)."""
        raise NotImplementedError

    def memory(self) -> dict:
        """``weights_bytes`` (and ``arena_bytes``, ``gpu_reserved_bytes`` where known)."""
        return {}

    # -- text workloads: texts in host memory -> float32 [B, H] in host memory -------------
    def prepare_texts(self, texts: list[str], n_batches: int):
        return texts, n_batches

    def call_texts(self, prepared) -> np.ndarray:
        """Tokenise (the library's own way, or the model's HF tokenizer for runtimes that
        have none) and run; what is timed for the text workloads."""
        raise NotImplementedError(f"{type(self).__name__} has no text path")


def hf_tokenizer(model_dir: str, max_len: int, pad: bool):
    """The model's fast tokenizer as a user of a runtime without one would set it up."""
    from pathlib import Path

    from tokenizers import Tokenizer

    tk = Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))
    tk.enable_truncation(max_len)
    if pad:
        tk.enable_padding()  # to the longest of each batch
    else:
        tk.no_padding()
    return tk


class PaddedProvider(Provider):
    """Peers take padded batches: sequences sorted by length, cut into ``n_batches`` batches,
    each padded to its longest (for a fixed shape every row has the same length)."""

    def feed(self, ids: np.ndarray, mask: np.ndarray):
        """Host-side inputs of one padded batch (ids, mask: int64 [B, S])."""
        return ids, mask

    def run(self, feed) -> np.ndarray:
        raise NotImplementedError

    def prepare(self, seqs, n_batches):
        batches, order = padded_batches(seqs, n_batches)
        return [self.feed(ids, mask) for ids, mask in batches]

    def call(self, prepared) -> np.ndarray:
        outs = [self.run(f) for f in prepared]
        return outs[0] if len(outs) == 1 else np.concatenate(outs)

    def prepare_texts(self, texts, n_batches):
        if not hasattr(self, "_tk"):
            self._tk = hf_tokenizer(self.model_dir, self.spec_max_len(), pad=True)
        return [list(c) for c in np.array_split(np.asarray(texts, dtype=object), n_batches)]

    def spec_max_len(self) -> int:
        return min(512, self.max_tokens)

    def call_texts(self, prepared) -> np.ndarray:
        outs = []
        for chunk in prepared:
            encs = self._tk.encode_batch(chunk)
            ids = np.asarray([e.ids for e in encs], dtype=np.int64)
            mask = np.asarray([e.attention_mask for e in encs], dtype=np.int64)
            outs.append(self.run(self.feed(ids, mask)))
        return outs[0] if len(outs) == 1 else np.concatenate(outs)

    def embed(self, seqs, batch):
        n_batches = max(1, -(-len(seqs) // batch))
        batches, order = padded_batches(seqs, n_batches)
        out = np.concatenate([self.run(self.feed(i, m)) for i, m in batches]).astype(np.float32)
        res = np.empty_like(out)
        res[order] = out
        return res


def file_bytes(*paths) -> int:
    """Size of model files (a folder counts all its files)."""
    from pathlib import Path

    total = 0
    for p in paths:
        p = Path(p)
        if p.is_dir():
            total += sum(f.stat().st_size for f in p.rglob("*") if f.is_file())
        elif p.exists():
            total += p.stat().st_size
    return total


def masked_mean(h: np.ndarray, mask: np.ndarray) -> np.ndarray:
    m = mask[..., None].astype(h.dtype)
    return (h * m).sum(1) / np.maximum(m.sum(1), 1e-9)
