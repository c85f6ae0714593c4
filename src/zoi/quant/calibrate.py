"""Calibration: run the FP32 model over calibration texts and record what quantisation needs.

For every linear (weight prefix `p`) the pass collects, from its input x [T, K]:

- `chan_absmax[k] = max_t |x[t, k]|`, `chan_min`, `chan_max` (SmoothQuant, shifts);
- per-token absmax statistics (mean, max) of the dynamic scheme;
- optionally the Gram matrix `x^T x` (float64, for GPTQ's error-compensating rounding),
  each token's row weighted by its text's length (`gram_weight`, see `token_weights`);
- optionally an activation observer (static scheme).

It also keeps the FP32 sentence embeddings of every calibration text, the yardstick of the
SmoothQuant alpha search. All through `zoi.quant.detforward.run_graph` (numpy, float32
buffers, every reduction order-independent: the statistics, and so the artifact, are the
same bits on every machine, numpy version and thread count; zoi.quant.detmath).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from zoi.graph.build import linear_prefix
from zoi.quant.detforward import run_graph
from zoi.quant.detmath import det_matmul, fixed_sum

Batch = tuple[np.ndarray, np.ndarray, np.ndarray]  # ids, positions, cu_seqlens


def pack_seqs(seqs: Sequence[np.ndarray], position_offset: int = 0) -> Batch:
    lens = np.array([len(s) for s in seqs], dtype=np.int32)
    cu = np.zeros(len(seqs) + 1, np.int32)
    np.cumsum(lens, out=cu[1:])
    ids = np.concatenate([np.asarray(s, np.int32) for s in seqs]) if seqs else np.zeros(0, np.int32)
    pos = (np.arange(len(ids), dtype=np.int32) - np.repeat(cu[:-1], lens) + position_offset).astype(
        np.int32
    )
    return ids, pos, cu


def token_batches(
    seqs: Sequence[np.ndarray], position_offset: int = 0, chunk_tokens: int = 4096
) -> list[Batch]:
    """Pack token id arrays (input order kept) into batches of at most chunk_tokens tokens."""
    out: list[Batch] = []
    cur: list[np.ndarray] = []
    n = 0
    for s in seqs:
        if cur and n + len(s) > chunk_tokens:
            out.append(pack_seqs(cur, position_offset))
            cur, n = [], 0
        cur.append(s)
        n += len(s)
    if cur:
        out.append(pack_seqs(cur, position_offset))
    return out


def tokenize(tokenizer, texts: Sequence[str]) -> list[np.ndarray]:
    """Token ids of each text with zoi's Tokenizer (encode_ids) or an HF `tokenizers.Tokenizer`."""
    if hasattr(tokenizer, "encode_ids"):
        return [np.asarray(s, np.int32) for s in tokenizer.encode_ids(list(texts))]
    return [np.asarray(e.ids, np.int32) for e in tokenizer.encode_batch(list(texts))]


@dataclass
class LinearStats:
    k: int
    chan_absmax: np.ndarray
    chan_min: np.ndarray
    chan_max: np.ndarray
    chan_sum: np.ndarray | None = None
    tokens: int = 0
    tok_absmax_sum: float = 0.0
    tok_absmax_max: float = 0.0
    gram: np.ndarray | None = None
    observer: object | None = None
    # the Gram's own weighted channel sums and total weight (the shift correction of a
    # weighted Gram, pipeline._transform_gram); equal to chan_sum / tokens when unweighted
    gram_sum: np.ndarray | None = None
    gram_weight: float = 0.0

    @property
    def tok_absmax_mean(self) -> float:
        return self.tok_absmax_sum / max(self.tokens, 1)

    def update(self, x: np.ndarray, gram: bool, row_scale: np.ndarray | None = None) -> None:
        """Add the tokens x [T, K]. row_scale [T] (float64, optional): the Gram sums
        (row_scale[t] x[t])^T (row_scale[t] x[t]), i.e. token t weighs row_scale[t]**2."""
        np.maximum(self.chan_absmax, np.abs(x).max(axis=0), out=self.chan_absmax)
        np.minimum(self.chan_min, x.min(axis=0), out=self.chan_min)
        np.maximum(self.chan_max, x.max(axis=0), out=self.chan_max)
        cs = fixed_sum(x, 0)
        self.chan_sum = cs if self.chan_sum is None else self.chan_sum + cs
        ta = np.abs(x).max(axis=1)
        self.tokens += x.shape[0]
        self.tok_absmax_sum += float(fixed_sum(ta))
        self.tok_absmax_max = max(self.tok_absmax_max, float(ta.max()))
        if gram:  # order-independent product per chunk, chunks accumulated in order
            if row_scale is None:
                xs, wt = x, np.ones(x.shape[0])  # the sums exact: weight == token count
            else:  # one correctly rounded product per element: the same bits everywhere
                xs, wt = x.astype(np.float64) * row_scale[:, None], row_scale * row_scale
            g = det_matmul(np.ascontiguousarray(xs.T))  # x^T x (symmetric BLAS product)
            self.gram = g if self.gram is None else self.gram + g
            gs = cs if row_scale is None else fixed_sum(x.astype(np.float64) * wt[:, None], 0)
            self.gram_sum = gs if self.gram_sum is None else self.gram_sum + gs
            self.gram_weight += float(fixed_sum(wt))
        if self.observer is not None:
            self.observer.update(x)


@dataclass
class Calibration:
    stats: dict[str, LinearStats]
    reference: np.ndarray  # FP32 pooled, L2-normalised embeddings of the calibration texts [n, H]
    seconds: float = 0.0
    tokens: int = 0
    texts: int = 0
    extra: dict = field(default_factory=dict)


def _progress_bar(total: int, desc: str, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="tok", disable=not enabled, leave=False)


GRAM_WEIGHTS = ("token", "text", "pooled")


def token_weights(cu_seqlens: np.ndarray, mode: str) -> np.ndarray | None:
    """Row scales of the Gram (LinearStats.update) for the tokens of a packed batch.

    - "token": None, every token weighs 1 (GPTQ's usual x^T x): a text weighs its length;
    - "text": token t of a text of L tokens weighs 1 / L (scale sqrt(1 / L)): every text
      weighs the same, whatever its length;
    - "pooled": weighs 1 / L**2 (scale 1 / L): the squared error of a text's mean-pooled
      output when the tokens' errors are independent, sum_t |e_t|**2 / L**2 — short texts
      count most, as their few tokens average the rounding noise least (issue 21: the
      worst text of the held-out sets is always a 4-6 token one, docs/QUANT.md)."""
    if mode == "token":
        return None
    if mode not in GRAM_WEIGHTS:
        raise ValueError(f"gram weighting must be one of {GRAM_WEIGHTS}, got {mode!r}")
    lens = np.diff(np.asarray(cu_seqlens, np.int64))
    per_tok = np.repeat(lens.astype(np.float64), lens)
    return np.sqrt(1.0 / per_tok) if mode == "text" else 1.0 / per_tok


def calibrate(
    graph,
    weights: dict,
    batches: Sequence[Batch],
    gram: bool = False,
    observer_factory: Callable[[], object] | None = None,
    progress: bool = False,
    desc: str = "calibrating",
    gram_weight: str = "token",
) -> Calibration:
    """One FP32 pass over `batches`; returns per-linear statistics and the reference embeddings.
    gram_weight: how the Gram weighs each token (`token_weights`)."""
    t0 = time.perf_counter()
    stats: dict[str, LinearStats] = {}
    for op in graph.ops:
        if op.kind == "linear":
            p = linear_prefix(op)
            k = weights[p + ".w"].shape[1] if p + ".w" in weights else weights[p + ".w_q"].shape[1]
            stats[p] = LinearStats(
                k,
                np.zeros(k, np.float32),
                np.full(k, np.inf, np.float32),
                np.full(k, -np.inf, np.float32),
                observer=observer_factory() if observer_factory else None,
            )

    if gram:
        token_weights(np.zeros(1, np.int32), gram_weight)  # an unknown mode fails here
    scale: list = [None]

    def tap(p, x, y):
        stats[p].update(x, gram, scale[0])

    refs = []
    total = int(sum(len(b[0]) for b in batches))
    with _progress_bar(total, desc, progress) as bar:
        for ids, pos, cu in batches:
            scale[0] = token_weights(cu, gram_weight) if gram else None
            refs.append(run_graph(graph, weights, ids, pos, cu, normalize=True, tap=tap))
            bar.update(len(ids))
    ref = np.concatenate(refs) if refs else np.zeros((0, 0), np.float32)
    return Calibration(stats, ref, time.perf_counter() - t0, total, int(ref.shape[0]))


def observe(
    graph,
    weights: dict,
    batches: Sequence[Batch],
    factory: Callable[[], object],
    prefixes: Sequence[str] | None = None,
    transform: Callable | None = None,
    progress: bool = False,
) -> dict[str, object]:
    """Feed every linear's (pre-transformed) input to a fresh observer; returns them by prefix."""
    from zoi.numerics.reference import pre_transform

    obs: dict[str, object] = {}

    def tap(p, x, y):
        if prefixes is not None and p not in prefixes:
            return
        o = obs.setdefault(p, factory())
        o.update(pre_transform(x, weights, p) if transform is None else transform(p, x))

    total = int(sum(len(b[0]) for b in batches))
    with _progress_bar(total, "observing", progress) as bar:
        for ids, pos, cu in batches:
            run_graph(graph, weights, ids, pos, cu, tap=tap)
            bar.update(len(ids))
    return obs
