"""Calibration: run the FP32 model over calibration texts and record what quantisation needs.

For every linear (weight prefix `p`) the pass collects, from its input x [T, K]:

- `chan_absmax[k] = max_t |x[t, k]|`, `chan_min`, `chan_max` (SmoothQuant, shifts);
- per-token absmax statistics (mean, max) of the dynamic scheme;
- optionally the Gram matrix `x^T x` (for GPTQ's error-compensating rounding), each token's
  row weighted by its text's length (`gram_weight`, see `token_weights`);
- optionally an activation observer (static scheme).

It also keeps the FP32 sentence embeddings of every calibration text, the yardstick of the
SmoothQuant alpha search. The activations are the native CPU engine's own FP32 ones
(zoi.quant.native: the engine stopped before each linear, its input read from the arena),
one batch at a time: nothing but the statistics outlives a batch. The reductions are plain
numpy / BLAS, in an order fixed by the shapes (the Gram: float32 products summed per half
batch by single-threaded BLAS, zoi.quant.blas), so one machine gives the same bits whatever
the thread counts; another CPU's FP32 kernels (ISA) round differently (docs/QUANT.md,
"Reproducible compiles").
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from zoi.quant import blas

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
    gram: np.ndarray | None = None  # float32 [K, K] (float32 products; see update)
    observer: object | None = None
    # the Gram's own weighted channel sums and total weight (the shift correction of a
    # weighted Gram, pipeline._transform_gram); equal to chan_sum / tokens when unweighted
    gram_sum: np.ndarray | None = None
    gram_weight: float = 0.0
    gram_file: str | None = None  # where the Gram waits on disk from calibration to GPTQ

    @property
    def tok_absmax_mean(self) -> float:
        return self.tok_absmax_sum / max(self.tokens, 1)

    def update(self, x: np.ndarray, gram: bool, row_scale: np.ndarray | None = None) -> None:
        """Add the tokens x [T, K] (float32). row_scale [T] (optional): the Gram sums
        (row_scale[t] x[t])^T (row_scale[t] x[t]), i.e. token t weighs row_scale[t]**2.

        The Gram is summed in float32 (each batch's product by BLAS, batches added in
        order): its relative error, ~1e-6, is far below GPTQ's damping (1% of the diagonal)."""
        if not x.shape[0]:
            return
        mx, mn = x.max(axis=0), x.min(axis=0)
        np.maximum(self.chan_max, mx, out=self.chan_max)
        np.minimum(self.chan_min, mn, out=self.chan_min)
        np.maximum(self.chan_absmax, np.maximum(mx, -mn), out=self.chan_absmax)
        # column sums as matrix-vector products (float32 sums of a batch, batches in float64)
        cs = (np.ones(x.shape[0], np.float32) @ x).astype(np.float64)
        self.chan_sum = cs if self.chan_sum is None else self.chan_sum + cs
        ta = np.maximum(x.max(axis=1), -x.min(axis=1))
        self.tokens += x.shape[0]
        self.tok_absmax_sum += float(ta.sum(dtype=np.float64))
        self.tok_absmax_max = max(self.tok_absmax_max, float(ta.max()))
        if gram:
            if row_scale is None:
                xs, wt = x, None
            else:
                rs = row_scale.astype(np.float32)
                xs = x * rs[:, None]
                wt = row_scale.astype(np.float64) ** 2
            g = blas.gram(xs)
            if self.gram is None:
                self.gram = g
            else:
                self.gram += g
            gs = cs if wt is None else (wt.astype(np.float32) @ x).astype(np.float64)
            self.gram_sum = gs if self.gram_sum is None else self.gram_sum + gs
            self.gram_weight += float(x.shape[0] if wt is None else wt.sum())
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


def spread_batches(batches: Sequence[Batch], max_tokens: int) -> set[int] | None:
    """Indices of batches spread evenly over `batches` whose tokens add up to at most
    max_tokens (at least one batch); None when all fit or max_tokens <= 0."""
    sizes = [len(b[0]) for b in batches]
    if max_tokens <= 0 or sum(sizes) <= max_tokens:
        return None
    n = len(sizes)
    for k in range(n, 0, -1):
        idx = {round(j * (n - 1) / max(k - 1, 1)) for j in range(k)} if k > 1 else {n // 2}
        if sum(sizes[i] for i in idx) <= max_tokens:
            return idx
    return {int(np.argmin(sizes))}


def token_weights(cu_seqlens: np.ndarray, mode: str) -> np.ndarray | None:
    """Row scales of the Gram (LinearStats.update) for the tokens of a packed batch.

    - "token": None, every token weighs 1 (GPTQ's usual x^T x): a text weighs its length;
    - "text": token t of a text of L tokens weighs 1 / L (scale sqrt(1 / L)): every text
      weighs the same, whatever its length;
    - "pooled": weighs 1 / L**2 (scale 1 / L): the squared error of a text's mean-pooled
      output when the tokens' errors are independent, sum_t |e_t|**2 / L**2 — short texts
      count most, as their few tokens average the rounding noise least (the
      worst text of the held-out sets is always a 4-6 token one, docs/QUANT.md)."""
    if mode == "token":
        return None
    if mode not in GRAM_WEIGHTS:
        raise ValueError(f"gram weighting must be one of {GRAM_WEIGHTS}, got {mode!r}")
    lens = np.diff(np.asarray(cu_seqlens, np.int64))
    per_tok = np.repeat(lens.astype(np.float64), lens)
    return np.sqrt(1.0 / per_tok) if mode == "text" else 1.0 / per_tok


def new_stats(prefixes_k: dict[str, int], observer_factory=None) -> dict[str, LinearStats]:
    return {
        p: LinearStats(
            k,
            np.zeros(k, np.float32),
            np.full(k, np.inf, np.float32),
            np.full(k, -np.inf, np.float32),
            observer=observer_factory() if observer_factory else None,
        )
        for p, k in prefixes_k.items()
    }


def calibrate(
    spec,
    weights: dict,
    batches: Sequence[Batch],
    gram: bool = False,
    observer_factory: Callable[[], object] | None = None,
    progress: bool = False,
    desc: str = "calibrating",
    gram_weight: str = "token",
    graph=None,
    gram_batches=None,
) -> Calibration:
    """One FP32 pass (the native CPU engine of spec + weights; graph: the op list when not
    spec's own) over `batches`; returns the per-linear statistics and the reference
    embeddings (L2-normalised pooled outputs). gram_weight: how the Gram weighs each token
    (`token_weights`); gram_batches: the indices of the batches whose tokens enter the Grams
    (None: all)."""
    from zoi.quant.native import LinearInputs, batch_tokens, l2_normalize

    t0 = time.perf_counter()
    if gram:
        token_weights(np.zeros(1, np.int32), gram_weight)  # an unknown mode fails here
    runner = LinearInputs(spec, weights, batch_tokens(batches), graph=graph)
    ks = {p: cols for _, p, _, cols, _ in runner.linears}
    stats = new_stats(ks, observer_factory)
    scale: list = [None]
    gram_now = [gram]

    def visit(p, x):
        # token weights apply to token rows; a linear over the pooled rows (sentence-transformers'
        # Dense modules) sees one row per text, each weighing the same
        rs = scale[0] if scale[0] is not None and len(scale[0]) == len(x) else None
        stats[p].update(x, gram_now[0], rs)

    refs = []
    total = int(sum(len(b[0]) for b in batches))
    with blas.single_threaded(), _progress_bar(total, desc, progress) as bar:
        for i, (ids, pos, cu) in enumerate(batches):
            gram_now[0] = gram and (gram_batches is None or i in gram_batches)
            scale[0] = token_weights(cu, gram_weight) if gram_now[0] else None
            refs.append(l2_normalize(runner.run(ids, pos, cu, visit)))
            bar.update(len(ids))
    del runner
    ref = np.concatenate(refs) if refs else np.zeros((0, 0), np.float32)
    return Calibration(stats, ref, time.perf_counter() - t0, total, int(ref.shape[0]))


def observe(
    spec,
    weights: dict,
    batches: Sequence[Batch],
    factory: Callable[[], object],
    transform: Callable[[str, np.ndarray], np.ndarray] | None = None,
    progress: bool = False,
    graph=None,
) -> dict[str, object]:
    """Feed every linear's input, through transform(prefix, x) when given, to a fresh
    observer; returns them by prefix. The FP32 engine of spec + weights makes the inputs."""
    from zoi.quant.native import LinearInputs, batch_tokens

    runner = LinearInputs(spec, weights, batch_tokens(batches), graph=graph)
    obs: dict[str, object] = {}

    def visit(p, x):
        o = obs.setdefault(p, factory())
        o.update(x if transform is None else transform(p, x))

    total = int(sum(len(b[0]) for b in batches))
    with _progress_bar(total, "observing", progress) as bar:
        for ids, pos, cu in batches:
            runner.run(ids, pos, cu, visit)
            bar.update(len(ids))
    return obs
