"""Multi-vector and lexical outputs (docs/MULTIVECTOR.md): BGE-M3's dense, sparse and ColBERT
vectors, a ColBERT checkpoint's token vectors, all from one forward of the encoder, and the
scores over them (MaxSim, lexical matching, BGE-M3's combined score).

The forward is the embedding model's: the backend's run_outputs gives the pooled rows and the
pool's input, the last hidden state of every token (a tap). The heads (zoi.frontend.multivector
loads them) are small linears applied here on the host, in FP32 whatever the encoder's
precision: sparse weight of a token = relu(h_t . w + b); ColBERT vector = the projection of h_t,
L2-normalised.

ColBERT queries padded with [MASK] tokens that no token attends to (PyLate's and ColBERT's
default, attend_to_expansion_tokens false) need a key mask the kernels do not have: those
queries run through the numpy reference executor with per-sequence key lengths
(zoi.numerics.reference.execute's key_lens), the same graph and weights (the INT8 scheme
emulated), exact but slower; a query that fills query_length by itself has no expansion and
runs on the engine.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from zoi.errors import HeadError, InputError, NumericalError
from zoi.frontend.multivector import M3_WEIGHTS, OUTPUTS, MultiVectorConfig, config_from_meta
from zoi.frontend.tokenizer import Tokenizer, pack


# ---- scores ------------------------------------------------------------------------------------
def maxsim(q: np.ndarray, d: np.ndarray, reduce: str = "mean") -> float:
    """Late interaction: for each query vector the largest dot product with a document vector,
    averaged over the query vectors ("mean": FlagEmbedding's colbert_score, BGE-M3) or summed
    ("sum": ColBERT's and PyLate's). A document without vectors scores 0."""
    q, d = np.asarray(q, np.float32), np.asarray(d, np.float32)
    if q.ndim != 2 or d.ndim != 2 or (len(d) and q.shape[1] != d.shape[1]):
        raise ValueError(f"maxsim takes [n, D] and [m, D] arrays, got {q.shape} and {d.shape}")
    if reduce not in ("mean", "sum"):
        raise ValueError(f"reduce must be 'mean' or 'sum', got {reduce!r}")
    if not len(q) or not len(d):
        return 0.0
    best = (q @ d.T).max(axis=1).astype(np.float64)
    return float(best.sum() / (len(q) if reduce == "mean" else 1))


def lexical_score(a, b) -> float:
    """BGE-M3's lexical matching score: the sum over the token ids both texts hold of the
    product of their weights. a, b: (ids, weights) pairs as encode_sparse gives them, or
    {id: weight} dicts (FlagEmbedding's lexical_weights)."""
    ia, wa = _sparse_pair(a)
    ib, wb = _sparse_pair(b)
    _, xa, xb = np.intersect1d(ia, ib, assume_unique=True, return_indices=True)
    return float(np.dot(wa[xa].astype(np.float64), wb[xb].astype(np.float64)))


def _sparse_pair(x):
    if isinstance(x, Mapping):
        ids = np.fromiter((int(k) for k in x), np.int64, len(x))
        w = np.fromiter((float(v) for v in x.values()), np.float64, len(x))
        return ids, w
    ids, w = x
    return np.asarray(ids, np.int64), np.asarray(w, np.float64)


def combined_score(scores: Mapping[str, float], weights=None) -> float:
    """BGE-M3's combined score of one pair (FlagEmbedding compute_score's
    'colbert+sparse+dense'): sum of weight x score over the modes, divided by the sum of the
    weights. scores: {"dense", "sparse", "colbert"} (those the model has); weights: None (the
    model card's 0.4 / 0.2 / 0.4), (dense, sparse, colbert) or a dict."""
    w = mode_weights(weights, tuple(scores))
    total = sum(w.values())
    return float(sum(w[m] * float(scores[m]) for m in w) / total)


def mode_weights(weights, modes: tuple[str, ...]) -> dict[str, float]:
    """{mode: weight} of the modes a model has; refuses a weight on a mode it lacks."""
    if weights is None:
        w = {m: v for m, v in zip(OUTPUTS, M3_WEIGHTS, strict=True) if m in modes}
    elif isinstance(weights, Mapping):
        bad = set(weights) - set(OUTPUTS)
        if bad:
            raise ValueError(f"weights: unknown modes {sorted(bad)}; the modes are {OUTPUTS}")
        w = dict(weights)
    else:
        try:
            vals = list(weights)
        except TypeError:
            raise ValueError(
                f"weights should be (dense, sparse, colbert), got {weights!r}"
            ) from None
        if len(vals) != 3:
            raise ValueError(f"weights should be (dense, sparse, colbert), got {weights!r}")
        w = dict(zip(OUTPUTS, vals, strict=True))
    out = {}
    for m, v in w.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise ValueError(f"weights: {m} should be a number >= 0, got {v!r}")
        if m not in modes:
            if v:
                raise ValueError(
                    f"weights: this model has no {m} output (it has {', '.join(modes)})"
                )
            continue
        out[m] = float(v)
    if not out or sum(out.values()) <= 0:
        raise ValueError(f"weights: at least one of {', '.join(modes)} needs a weight > 0")
    return out


# ---- the heads on the token states -------------------------------------------------------------
def _pool_input(graph) -> str:
    return next(op for op in reversed(graph.ops) if op.kind == "pool").inputs[0]


def _normalize_rows(x: np.ndarray) -> np.ndarray:
    n = np.sqrt((x.astype(np.float64) ** 2).sum(axis=1, keepdims=True))
    return (x / np.maximum(n, 1e-12)).astype(np.float32)


def sparse_rows(cfg: MultiVectorConfig, weights, h, ids, cu) -> list[tuple[np.ndarray, np.ndarray]]:
    """(token ids ascending int32, weights float32 > 0) per sequence: relu(h_t . w + b), the
    largest over a token's occurrences, the skipped ids (cls, eos, pad, unk) left out."""
    w = np.maximum(h @ weights["mv.sparse.w"].T + weights["mv.sparse.b"], 0)[:, 0]
    skip = np.isin(ids, np.asarray(cfg.sparse_skip_ids, np.int64))
    out = []
    for i in range(len(cu) - 1):
        a, z = int(cu[i]), int(cu[i + 1])
        keep = ~skip[a:z] & (w[a:z] > 0)
        u, inv = np.unique(ids[a:z][keep], return_inverse=True)
        m = np.zeros(len(u), np.float32)
        np.maximum.at(m, inv, w[a:z][keep].astype(np.float32))
        out.append((u.astype(np.int32), m))
    return out


def colbert_rows(cfg: MultiVectorConfig, weights, h, ids, cu, is_query: bool) -> list[np.ndarray]:
    """[n_i, D] float32 per sequence: the projection of each token's state, L2-normalised;
    BGE-M3 leaves out [CLS] (skip_first), a ColBERT document its skiplist ids."""
    from zoi.numerics.reference import activation

    x = h
    for k, (act, _out) in enumerate(cfg.layers):
        x = x @ weights[f"mv.colbert{k}.w"].T + weights[f"mv.colbert{k}.b"]
        x = activation(x.astype(np.float32), act)
    x = _normalize_rows(x)
    keep = None
    if not is_query and cfg.document_skip_ids:
        keep = ~np.isin(ids, np.asarray(cfg.document_skip_ids, np.int64))
    out = []
    for i in range(len(cu) - 1):
        a, z = int(cu[i]) + cfg.skip_first, int(cu[i + 1])
        rows = x[a:z] if keep is None else x[a:z][keep[a:z]]
        out.append(np.ascontiguousarray(rows))
    return out


class MultiVectorMixin:
    """encode_multi and the multi-vector rerank; needs the Engine's model, spec, tokenizer,
    backend and HeadsMixin's _run_head / _max_seqs / _need."""

    @property
    def multivector(self) -> MultiVectorConfig | None:
        """The model's multi-vector / sparse heads (None: a plain model); .kind ("bge-m3",
        "colbert"), .outputs, .colbert_dim."""
        cached = self.__dict__.get("_mv_config", False)
        if cached is not False:
            return cached
        meta = self.model.meta.get("multivector")
        cfg = None
        if meta is not None:
            where = self.model.meta.get("artifact") or self.model.meta.get("source") or "model"
            cfg = config_from_meta(meta, self.model.weights, self.spec, f"{where} (zoi.json)")
        self.__dict__["_mv_config"] = cfg
        return cfg

    def _check_pooled(self, call: str) -> None:
        """A ColBERT model gives one vector per token, no pooled embedding."""
        cfg = self.multivector
        if cfg is not None and cfg.kind == "colbert":
            raise HeadError(
                f"{call}: {self.spec.name} is a ColBERT model: it gives one vector per token, "
                "no sentence embedding. Use encode_multi(texts, 'colbert', is_query=...) for "
                "its vectors, or rerank(query, documents) to score by MaxSim"
            )

    def _mv_need(self, call: str) -> MultiVectorConfig:
        cfg = self.multivector
        if cfg is None:
            raise HeadError(
                f"{call} needs a model with multi-vector or sparse heads (BGE-M3, a ColBERT "
                f"checkpoint); {self.spec.name} has none (docs/MULTIVECTOR.md)"
            )
        self._need(call, "")
        return cfg

    def encode_multi(
        self,
        texts: str | Sequence[str],
        output: str | Sequence[str] | None = None,
        is_query: bool = False,
        batch_size: int | None = None,
        truncate: bool = True,
        normalize_embeddings: bool | None = None,
    ):
        """The outputs of a multi-vector model, all from one forward of the encoder.

        output: "dense", "sparse" or "colbert" gives that output alone; a sequence of them, or
        None (every output the model has), a dict. Per output, for a list of n texts (a str:
        one text, the first element of each):
        - dense: float32 [n, H], the pooled vector (BGE-M3: [CLS]; L2-normalised as the model
          says, or per normalize_embeddings);
        - sparse: [(token ids int32 ascending, weights float32 > 0)] (BGE-M3's lexical weights);
        - colbert: [float32 [n_i, D]], one L2-normalised vector per token (BGE-M3: the tokens
          after [CLS]; a ColBERT document: without its skiplist tokens).
        is_query: a ColBERT model's query (its marker, [MASK] expansion to query_length); a
        document otherwise. BGE-M3 encodes both alike."""
        cfg = self._mv_need("encode_multi")
        want = _outputs(output, cfg)
        if not isinstance(is_query, bool):
            raise TypeError(f"is_query should be True or False, got {is_query!r}")
        single = isinstance(texts, str)
        items = Tokenizer.check_texts([texts] if single else texts)
        res = self._mv_forward(cfg, items, want, is_query, batch_size, truncate)
        if "dense" in res:
            norm = (
                self.spec.normalize if normalize_embeddings is None else bool(normalize_embeddings)
            )
            if norm:
                res["dense"] = _normalize_rows(res["dense"])
        if single:
            res = {k: v[0] for k, v in res.items()}
        return res[output] if isinstance(output, str) else res

    def _mv_pack(self, cfg: MultiVectorConfig, items, is_query: bool, truncate: bool):
        """(ids, positions, cu_seqlens, key_lens or None) of the texts as the model reads them."""
        limit = self.max_seq_tokens
        if cfg.kind == "bge-m3":
            ids, pos, cu = self.tokenizer.encode_packed(items, truncate, max_len=limit)
            return ids, pos, cu, None
        length = min(cfg.query_length if is_query else cfg.document_length, limit)
        marker = cfg.query_marker if is_query else cfg.document_marker
        inner = length - (marker is not None)
        try:
            seqs = self.tokenizer.encode_ids(items, truncate, max_len=inner)
        except InputError as e:
            what = "query_length" if is_query else "document_length"
            raise InputError(
                f"{e} (this ColBERT model reads {length} tokens of a "
                f"{'query' if is_query else 'document'}, its {what}, the marker included)"
            ) from None
        expand = is_query and cfg.query_expansion
        out, real = [], []
        for s in seqs:
            if marker is not None:  # after the first token ([CLS]), as PyLate inserts it
                s = np.concatenate([s[:1], np.array([marker], np.int32), s[1:]])
            real.append(len(s))
            if expand and len(s) < length:
                s = np.concatenate([s, np.full(length - len(s), cfg.mask_id, np.int32)])
            out.append(s.astype(np.int32, copy=False))
        ids, pos, cu = pack(out, self.spec.position_offset)
        key_lens = None
        if expand and not cfg.attend_to_expansion and any(r < length for r in real):
            key_lens = np.asarray(real, np.int32)
        return ids, pos, cu, key_lens

    def multivector_lengths(self, texts: Sequence[str], is_query: bool = False, truncate=True):
        """Tokens per text as the model reads them (marker and expansion included), int32 [n]:
        a bound on the ColBERT vectors of each, known before the model runs (zoi serve)."""
        cfg = self._mv_need("multivector_lengths")
        _, _, cu, _ = self._mv_pack(cfg, Tokenizer.check_texts(texts), is_query, truncate)
        return np.diff(cu).astype(np.int32) - cfg.skip_first

    def _mv_forward(self, cfg, items, want, is_query, batch_size, truncate) -> dict:
        ids, pos, cu, key_lens = self._mv_pack(cfg, items, is_query, truncate)
        graph = self.model.graph
        tap = _pool_input(graph)
        W = self.model.weights
        n = len(items)
        res: dict = {}
        if "dense" in want:
            res["dense"] = np.empty((n, self.spec.out_dim), np.float32)
        for k in ("sparse", "colbert"):
            if k in want:
                res[k] = []
        max_seqs = self._max_seqs(batch_size)
        if key_lens is None:
            chunks = self._run_head(ids, pos, None, cu, (tap,), max_seqs)
        else:
            chunks = self._mv_masked_chunks(ids, pos, cu, key_lens, tap, max_seqs)
        for s, e, a, z, o in chunks:
            sub = np.ascontiguousarray(cu[s : e + 1] - a)
            h = o[tap]
            if "dense" in res:
                res["dense"][s:e] = o[graph.output]
            if "sparse" in res:
                res["sparse"].extend(sparse_rows(cfg, W, h, ids[a:z], sub))
            if "colbert" in res:
                res["colbert"].extend(colbert_rows(cfg, W, h, ids[a:z], sub, is_query))
        return res

    def _mv_masked_chunks(self, ids, pos, cu, key_lens, tap, max_seqs):
        """_run_head's chunks through the reference executor with key lengths (queries whose
        expansion tokens no token attends to)."""
        from zoi.heads.names import packed_chunks
        from zoi.numerics.reference import execute

        self._check_ids(ids, pos)
        for s, e, a, z, sub in packed_chunks(cu, self.max_tokens, max_seqs):
            env = execute(
                self.model.graph,
                self.model.weights,
                ids[a:z],
                pos[a:z],
                sub,
                self.model.quant,
                matmul_exact=False,  # float32 sums of the integer products: BLAS speed
                key_lens=key_lens[s:e],
            )
            outs = {
                n: np.ascontiguousarray(env[n], np.float32) for n in (self.model.graph.output, tap)
            }
            for name, v in outs.items():
                if not np.isfinite(v).all():
                    raise NumericalError(
                        f"the model produced NaN/Inf in its {name!r} output (reference executor, "
                        "masked query expansion); the weights overflow float32 or the artifact "
                        "is corrupt"
                    )
            yield s, e, a, z, outs

    # ---- entry points of HeadsMixin -----------------------------------------------------------
    def _mv_encode_sparse(self, texts, batch_size, dense: bool, top_k, truncate):
        single = isinstance(texts, str)
        items = Tokenizer.check_texts([texts] if single else texts)
        rows = self.encode_multi(items, "sparse", batch_size=batch_size, truncate=truncate)
        if top_k is not None:
            if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
                raise ValueError(f"top_k must be a positive int or None, got {top_k!r}")
            kept = []
            for idx, val in rows:
                if len(idx) > top_k:
                    sel = np.sort(np.argpartition(-val, top_k - 1)[:top_k])
                    idx, val = idx[sel], val[sel]
                kept.append((idx, val))
            rows = kept
        if dense:
            full = np.zeros((len(items), self.spec.vocab_size), np.float32)
            for i, (idx, val) in enumerate(rows):
                full[i, idx] = val
            return full[0] if single else full
        return rows[0] if single else rows

    def _mv_rerank(self, cfg, query, docs, top_k, return_documents, batch_size, weights):
        if cfg.kind == "colbert":
            if weights is not None:
                raise ValueError(
                    "weights are BGE-M3's (dense, sparse, colbert); a ColBERT model scores by MaxSim alone"
                )
            q = self.encode_multi(query, "colbert", is_query=True, batch_size=batch_size)
            d = self.encode_multi(docs, "colbert", is_query=False, batch_size=batch_size)
            scores = np.array([maxsim(q, x, cfg.maxsim) for x in d])
            parts = None
        else:
            modes = cfg.outputs
            w = mode_weights(weights, modes)
            out = self.encode_multi([query, *docs], modes, batch_size=batch_size)  # one forward
            parts = {}
            if "dense" in w:
                parts["dense"] = out["dense"][1:].astype(np.float64) @ out["dense"][0].astype(
                    np.float64
                )
            if "sparse" in w:
                q = out["sparse"][0]
                parts["sparse"] = np.array([lexical_score(q, x) for x in out["sparse"][1:]])
            if "colbert" in w:
                q = out["colbert"][0]
                parts["colbert"] = np.array([maxsim(q, x, cfg.maxsim) for x in out["colbert"][1:]])
            scores = sum(w[m] * parts[m] for m in parts) / sum(w.values())
        order = np.argsort(-scores, kind="stable")[:top_k]
        res = []
        for i in order:
            r = {"corpus_id": int(i), "score": float(scores[i])}
            if parts is not None:
                r["scores"] = {m: float(v[i]) for m, v in parts.items()}
            if return_documents:
                r["text"] = docs[i]
            res.append(r)
        return res


def _outputs(output, cfg: MultiVectorConfig) -> tuple[str, ...]:
    if output is None:
        want = cfg.outputs
    elif isinstance(output, str):
        want = (output,)
    else:
        want = tuple(output)
    for o in want:
        if o not in OUTPUTS:
            raise ValueError(f"output must be one of {OUTPUTS} (or a list of them), got {o!r}")
        if o not in cfg.outputs:
            raise HeadError(
                f"this model ({cfg.kind}) has no {o!r} output; it gives {', '.join(cfg.outputs)}"
            )
    if not want:
        raise ValueError("output: name at least one output")
    return want
