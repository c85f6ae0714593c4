"""The Engine's head API (mixed into zoi.engine.Engine): predict / rerank (cross-encoders and
sequence classifiers, shaped like sentence-transformers' CrossEncoder), predict_tokens / ner
(token classification, entities as transformers' pipeline), encode_sparse (SPLADE), and the
per-token hidden states behind encode(output_value="token_embeddings"); encode_multi and the
multi-vector rerank of BGE-M3 and ColBERT models (zoi.heads.multivector)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from zoi.backends.base import HeadRunner
from zoi.errors import BackendUnavailableError, HeadError, InputError, NumericalError, ZoiError
from zoi.frontend.pairs import PairEncoder, check_pairs
from zoi.frontend.tokenizer import Tokenizer, pack
from zoi.heads.multivector import MultiVectorMixin
from zoi.heads.names import HEAD_NAMES, a_, packed_chunks, score_pooling
from zoi.heads.options import EncodeOptionsMixin

ACTIVATIONS = ("sigmoid", "softmax", "identity")
SPLADE_ARENA_BYTES = 256 << 20  # default cap of the [max_tokens, vocab] logits buffer


def default_max_tokens(spec, max_tokens: int) -> int:
    """SPLADE's [T, vocab] logits live in the arena: by default fewer tokens per call, so the
    buffer stays near SPLADE_ARENA_BYTES (at least one full sequence)."""
    if spec.head != "splade":
        return max_tokens
    return min(max_tokens, max(spec.max_positions, SPLADE_ARENA_BYTES // (4 * spec.vocab_size)))


HEAD_DEVICES = ("cpu", "reference", "cuda")  # the backends with run_outputs (HeadRunner)


def check_head_device(spec, device: str) -> None:
    """A model with a task head needs a backend that runs heads (HeadRunner); on cuda the
    sequence classifiers run through zoi.heads.hybrid, token classification and SPLADE on the
    CUDA backend itself (its run_outputs)."""
    if spec.head and device not in HEAD_DEVICES:
        raise BackendUnavailableError(
            f"{spec.name} has {a_(HEAD_NAMES[spec.head])} head, which device={device!r} does not "
            f"run yet; compile or load it with device='cpu' (or 'reference')"
        )


def head_backend(model, device: str, device_index: int | None = None, cuda_options=None):
    """The backend of a head model where the device's own backend does not run heads (cuda:
    zoi.heads.hybrid); None where make_backend's does. device_index: the GPU (cuda:N);
    cuda_options: the CUDA backend's switches (make_backend)."""
    check_head_device(model.spec, device)
    if model.spec.head == "seq_cls" and device == "cuda":
        import functools

        from zoi.backends import make_backend
        from zoi.heads.hybrid import HybridHeadRunner

        return HybridHeadRunner(
            model,
            functools.partial(make_backend, device_index=device_index, cuda_options=cuda_options),
        )
    return None


def score_of(spec, logits: np.ndarray) -> np.ndarray:
    """The classifier's logits [B, labels] from the graph's output: an LLM reranker's graph
    gives the LM logits of its true (and false) token [B, 1 or 2], the score is
    logit[true] - logit[false] (one float32 subtraction, as sentence-transformers' LogitScore)."""
    if not spec.score_tokens or logits.shape[1] == 1:
        return logits
    return np.ascontiguousarray(logits[:, :1] - logits[:, 1:2], dtype=np.float32)


def quantize_heads(spec, weights, tokenizer, calibration, config, progress):
    """INT8 of a model with a head: the encoder as zoi.quant quantises an embedding model (its
    score: the pooled embeddings the head reads: [CLS] for seq_cls, the last token for an LLM
    reranker), then the head. The classifier heads stay FP32 (a few rows; an LLM reranker's
    two LM-head rows); SPLADE's decoder [vocab, H], the largest GEMM, gets per-channel INT8
    weights and dynamic per-token activations."""
    from zoi import quant
    from zoi.graph.compiled import LinearQuant
    from zoi.numerics import primitives as P

    head_keys = [k for k in weights if k.startswith(("head.", "mlm."))]
    body = {k: v for k, v in weights.items() if k not in head_keys}
    body_spec = spec.replace(
        head="",
        head_act="",
        labels=(),
        head_fn="",
        score_tokens=(),
        pooling=score_pooling(spec),
    )
    report: dict = {}
    wq, q = quant.quantize_model(
        body_spec,
        body,
        tokenizer,
        calibration=calibration,
        config=config,
        progress=progress,
        report=report,
    )
    wq = dict(wq)
    for k in head_keys:
        wq[k] = weights[k]
    if spec.head == "splade":
        wq["mlm.dec.w_q"], wq["mlm.dec.w_scale"] = P.quantize_weight(wq.pop("mlm.dec.w"))
        q["mlm.dec"] = LinearQuant("dynamic", info={"head": True})
    report["head"] = {"head": spec.head, "int8": ["mlm.dec"] if spec.head == "splade" else []}
    return wq, q, report


def _activation(fn, n_labels: int, default: str) -> Callable[[np.ndarray], np.ndarray]:
    if fn is None:
        fn = default or ("sigmoid" if n_labels == 1 else "identity")
    if callable(fn) and not isinstance(fn, str):
        name = type(fn).__name__.lower()  # a torch module (nn.Sigmoid() ...) or any callable
        if name in ACTIVATIONS:
            fn = name
        else:
            return lambda x: np.asarray(fn(x), dtype=np.float32)
    if fn == "sigmoid":
        return _sigmoid
    if fn == "softmax":
        return _softmax
    if fn == "identity":
        return lambda x: x
    raise ValueError(f"activation_fn must be one of {ACTIVATIONS}, a callable or None, got {fn!r}")


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return (1.0 / (1.0 + np.exp(-x.astype(np.float64)))).astype(np.float32)


def _softmax(x: np.ndarray) -> np.ndarray:
    z = x.astype(np.float64)
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True)).astype(np.float32)


class HeadsMixin(EncodeOptionsMixin, MultiVectorMixin):
    """Needs the Engine's model, spec, tokenizer, backend, _lock, max_tokens, max_batch,
    max_seq_tokens and device."""

    # ---- what the model is ------------------------------------------------------------
    @property
    def head(self) -> str:
        """The task head: "" (embeddings), "seq_cls", "token_cls" or "splade"."""
        return self.spec.head

    @property
    def labels(self) -> tuple[str, ...]:
        return self.spec.labels

    def _need(self, call: str, *heads: str) -> None:
        if self.spec.head not in heads:
            want = " or ".join(HEAD_NAMES[h] for h in heads)
            raise HeadError(
                f"{call} needs {a_(want)} model; {self.spec.name} is {a_(HEAD_NAMES[self.spec.head])} "
                "model. Compile a checkpoint with that head (e.g. a *ForSequenceClassification "
                "folder for predict / rerank)"
            )
        if not isinstance(self.backend, HeadRunner):
            raise ZoiError(
                f"{call}: device={self.device} does not run task heads yet; compile the model "
                "with device='cpu' (or 'reference')"
            )

    def _pairs(self) -> PairEncoder:
        """The pair tokenisation: the tokenizer's own pairs, or an LLM reranker's (its chat
        template or prompt: zoi.heads.llm_rerank)."""
        enc = self.__dict__.get("_pair_encoder")
        if enc is None:
            if self.spec.score_tokens:
                from zoi.heads.llm_rerank import pair_encoder

                enc = pair_encoder(self.tokenizer, self.model.meta)
            else:
                enc = PairEncoder(self.tokenizer)
            self.__dict__["_pair_encoder"] = enc
        return enc

    def _check_ids(self, ids: np.ndarray, pos: np.ndarray) -> None:
        """A chunk's ids and positions within the tables (a tokenizer the engine cannot trust):
        the encoder path and the heads' both check here."""
        npos = self.model.position_rows()
        if len(ids) and (ids.min() < 0 or ids.max() >= self.spec.vocab_size):
            raise InputError(
                f"the tokenizer produced ids outside the model's vocabulary of "
                f"{self.spec.vocab_size}; the tokenizer.json does not belong to this model"
            )
        if len(pos) and pos.max() >= npos:
            raise InputError(f"positions must lie in [0, {npos})")

    def _max_seqs(self, batch_size) -> int:
        if batch_size is None:
            return self.max_batch
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int or None, got {batch_size!r}")
        return min(batch_size, self.max_batch)

    def _run_head(self, ids, pos, types, cu, taps=(), max_seqs=None):
        """Greedy chunks under max_tokens / max_seqs; yields (s, e, a, z, outputs) per chunk:
        sequences s:e, tokens a:z, the backend's run_outputs. NaN / Inf: NumericalError."""
        self._check_ids(ids, pos)
        if types is not None and "types" not in self.model.graph.inputs:
            types = None  # a model without a type table: every token is type 0 anyway
        if types is not None and len(types) and types.max() >= self.spec.type_vocab_size:
            raise InputError(
                f"token type {int(types.max())} is outside the model's "
                f"{self.spec.type_vocab_size} types"
            )
        max_seqs = max_seqs or self.max_batch
        for s, e, a, z, sub in packed_chunks(cu, self.max_tokens, max_seqs):
            t = None if types is None else np.ascontiguousarray(types[a:z], dtype=np.int32)
            with self._lock:
                outs = self.backend.run_outputs(ids[a:z], pos[a:z], sub, t, taps)
            for name, v in outs.items():
                if not np.isfinite(v).all():
                    raise NumericalError(
                        f"the model produced NaN/Inf in its {name!r} output on device="
                        f"{self.device}. The input is not at fault: the weights overflow float32 "
                        "or the config or artifact is corrupt; re-compile from a sane checkpoint"
                    )
            yield s, e, a, z, outs

    @property
    def head_cols(self) -> int:
        """Columns of the head's output: labels (seq_cls, token_cls), vocab (splade)."""
        if self.spec.score_tokens:  # the score, from the graph's [B, 2] (score_of)
            return self.spec.num_labels
        return int(self.model.graph.buffers[self.model.graph.output].cols)

    def run_head_packed(self, ids, positions, cu_seqlens, types=None) -> np.ndarray:
        """The head's output of packed sequences (zoi serve's batcher): [B, cols] for seq_cls
        logits / splade vectors, [T, cols] for token logits."""
        self._need("run_head_packed", "seq_cls", "token_cls", "splade")
        ids = np.ascontiguousarray(ids, dtype=np.int32)
        pos = np.ascontiguousarray(positions, dtype=np.int32)
        cu = np.ascontiguousarray(cu_seqlens, dtype=np.int32)
        rows_t = self.model.graph.buffers[self.model.graph.output].rows == "T"
        out = np.empty((len(ids) if rows_t else len(cu) - 1, self.head_cols), np.float32)
        for s, e, a, z, o in self._run_head(ids, pos, types, cu):
            if rows_t:
                out[a:z] = o[self.model.graph.output]
            else:
                out[s:e] = score_of(self.spec, o[self.model.graph.output])
        return out

    # ---- sequence classification / cross-encoders ----------------------------------------
    def predict(
        self,
        inputs,
        batch_size: int | None = None,
        activation_fn=None,
        convert_to_numpy: bool = True,
        apply_softmax: bool = False,
        truncation: str = "longest_first",
    ):
        """Scores of pairs [a, b] (or single texts), as sentence-transformers' CrossEncoder.predict:
        one pair gives a float (1 label) or [labels]; a list gives [n] or [n, labels] float32.
        activation_fn: None (the model's: sigmoid for 1 label, else identity), "sigmoid",
        "softmax", "identity" or a callable on the logits array. Pairs are truncated to the
        model's positions as HF tokenizers' `truncation` strategy does (longest_first)."""
        self._need("predict", "seq_cls")
        items, single, is_pairs = check_pairs(inputs)
        logits = self._logits(items, is_pairs, batch_size, truncation)
        NL = self.spec.num_labels
        scores = _activation(activation_fn, NL, self.spec.head_fn)(logits)
        if NL == 1 and scores.ndim > 1:
            scores = scores[:, 0]
        if apply_softmax and scores.ndim > 1:
            scores = _softmax(scores)
        scores = np.asarray(scores, dtype=np.float32)
        if single:
            return scores[0]
        return scores if convert_to_numpy else list(scores)

    def _logits(self, items, is_pairs: bool, batch_size, truncation) -> np.ndarray:
        limit = self.max_seq_tokens
        if (
            not is_pairs
            and self.spec.score_tokens
            and self.model.meta.get("pair_format", {}).get("kind") == "chat"
        ):
            raise HeadError(
                f"{self.spec.name} is an LLM reranker whose chat template places a query and a "
                "document: predict takes pairs [query, document]"
            )
        if is_pairs:
            ids, pos, types, cu = self._pairs().encode(items, limit, truncation)
        else:
            ids, pos, cu = self.tokenizer.encode_packed(
                Tokenizer.check_texts(items), True, max_len=limit
            )
            types = None
        out = np.empty((len(cu) - 1, self.spec.num_labels), np.float32)
        for s, e, _, _, o in self._run_head(
            ids, pos, types, cu, max_seqs=self._max_seqs(batch_size)
        ):
            out[s:e] = score_of(self.spec, o["logits"])
        return out

    def rerank(
        self,
        query: str,
        documents: Sequence[str],
        top_k: int | None = None,
        return_documents: bool = False,
        batch_size: int | None = None,
        activation_fn=None,
        truncation: str = "longest_first",
        weights=None,
    ) -> list[dict]:
        """Documents ranked by the cross-encoder's score for (query, document), as
        CrossEncoder.rank: [{"corpus_id", "score"[, "text"]}] best first, top_k of them.

        A multi-vector model (docs/MULTIVECTOR.md) ranks by its own score: a ColBERT model by
        MaxSim (summed over the query vectors); BGE-M3 by its combined score, weights (dense,
        sparse, colbert) (default 0.4, 0.2, 0.4) divided by their sum, each result also giving
        "scores" {dense, sparse, colbert}."""
        cfg = self.multivector
        if cfg is not None:
            if activation_fn is not None or truncation != "longest_first":
                raise ValueError(
                    "activation_fn and truncation are a cross-encoder's; a multi-vector model "
                    "encodes the query and the documents apart"
                )
            self._mv_need("rerank")
            return self._mv_rerank(
                cfg, *self._rerank_args(query, documents, top_k), return_documents, batch_size,
                weights,
            )  # fmt: skip
        if weights is not None:
            raise ValueError("weights are BGE-M3's (dense, sparse, colbert) modes")
        self._need("rerank", "seq_cls")
        if self.spec.num_labels != 1:
            raise HeadError(
                f"rerank needs a cross-encoder with one label; {self.spec.name} has "
                f"{self.spec.num_labels} ({', '.join(self.spec.labels[:5])}): use predict"
            )
        query, docs, top_k = self._rerank_args(query, documents, top_k)
        if not docs:
            return []
        scores = self.predict(
            [(query, d) for d in docs], batch_size, activation_fn, truncation=truncation
        )
        order = np.argsort(-scores, kind="stable")[:top_k]
        out = []
        for i in order:
            r = {"corpus_id": int(i), "score": float(scores[i])}
            if return_documents:
                r["text"] = docs[i]
            out.append(r)
        return out

    @staticmethod
    def _rerank_args(query, documents, top_k):
        if not isinstance(query, str):
            raise TypeError(f"query should be a str, got {type(query).__name__}")
        docs = Tokenizer.check_texts(documents)
        if top_k is not None and (
            isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1
        ):
            raise ValueError(f"top_k must be a positive int or None, got {top_k!r}")
        return query, docs, top_k

    # ---- token classification ------------------------------------------------------------
    def _hf_encode_offsets(self, texts: list[str]):
        hf = self.tokenizer._hf_for(self.max_seq_tokens)
        from zoi.frontend.tokenizer import clip_text

        mc = self.tokenizer.max_chars
        encs = hf.encode_batch([t if len(t) <= mc else clip_text(t, mc) for t in texts])
        return hf, encs

    def predict_tokens(self, texts: str | Sequence[str], batch_size: int | None = None):
        """Per-token logits of a token classifier: [n_i, labels] float32 per text (special
        tokens included, in the tokenizer's order); a str gives one array."""
        self._need("predict_tokens", "token_cls")
        single = isinstance(texts, str)
        items = Tokenizer.check_texts([texts] if single else texts)
        ids, pos, cu = self.tokenizer.encode_packed(items, True, max_len=self.max_seq_tokens)
        out = self._token_logits(ids, pos, cu, batch_size)
        res = np.split(out, cu[1:-1]) if len(items) else []
        return res[0] if single else res

    def _token_logits(self, ids, pos, cu, batch_size) -> np.ndarray:
        out = np.empty((len(ids), self.spec.num_labels), np.float32)
        for _, _, a, z, o in self._run_head(
            ids, pos, None, cu, max_seqs=self._max_seqs(batch_size)
        ):
            out[a:z] = o["logits"]
        return out

    def ner(
        self,
        texts: str | Sequence[str],
        aggregation_strategy: str = "simple",
        ignore_labels: Sequence[str] = ("O",),
        batch_size: int | None = None,
    ):
        """Entities as transformers' TokenClassificationPipeline gives them (entity_group /
        entity, score, word, start, end: offsets into the original text). A str gives a list
        of entities, a list of texts a list of such lists."""
        from zoi.heads.entities import STRATEGIES, _Words, entities

        self._need("ner", "token_cls")
        if aggregation_strategy not in STRATEGIES:
            raise ValueError(
                f"aggregation_strategy must be one of {STRATEGIES}, got {aggregation_strategy!r}"
            )
        single = isinstance(texts, str)
        items = Tokenizer.check_texts([texts] if single else texts)
        hf, encs = self._hf_encode_offsets(items)
        ids, pos, cu = pack([np.asarray(e.ids, np.int32) for e in encs], self.spec.position_offset)
        logits = self._token_logits(ids, pos, cu, batch_size)
        words = _Words(hf)
        out = []
        for i, enc in enumerate(encs):
            lg = logits[cu[i] : cu[i + 1]]
            out.append(
                entities(
                    words,
                    items[i],
                    enc.ids,
                    enc.offsets,
                    enc.special_tokens_mask,
                    lg,
                    self.spec.labels,
                    aggregation_strategy,
                    tuple(ignore_labels),
                )
            )
        return out[0] if single else out

    # ---- SPLADE ------------------------------------------------------------------------------
    def encode_sparse(
        self,
        texts: str | Sequence[str],
        batch_size: int | None = None,
        dense: bool = False,
        top_k: int | None = None,
        truncate: bool = True,
    ):
        """SPLADE vectors: per text (indices int32 ascending, values float32 > 0) of
        max over tokens of log1p(relu(MLM logits)); dense=True gives float32 [n, vocab]
        instead (a str: [vocab]). top_k keeps the k largest values of each text.
        BGE-M3 (docs/MULTIVECTOR.md): its lexical weights, the same shapes (token id, weight)."""
        cfg = self.multivector
        if cfg is not None and cfg.sparse:
            self._mv_need("encode_sparse")
            return self._mv_encode_sparse(texts, batch_size, dense, top_k, truncate)
        self._need("encode_sparse", "splade")
        single = isinstance(texts, str)
        items = Tokenizer.check_texts([texts] if single else texts)
        ids, pos, cu = self.tokenizer.encode_packed(items, truncate, max_len=self.max_seq_tokens)
        V = self.spec.vocab_size
        full = np.zeros((len(items), V), np.float32) if dense else None
        sparse: list = []
        for s, e, _, _, o in self._run_head(
            ids, pos, None, cu, max_seqs=self._max_seqs(batch_size)
        ):
            v = o["sparse"]
            if top_k is not None:
                v = _keep_top(v, top_k)
            if dense:
                full[s:e] = v
                continue
            for row in v:
                nz = np.flatnonzero(row > 0).astype(np.int32)
                sparse.append((nz, row[nz].astype(np.float32)))
        res = full if dense else sparse
        return res[0] if single else res

    # ---- token embeddings --------------------------------------------------------------------
    def token_embeddings(self, texts: Sequence[str], batch_size: int | None = None, truncate=True):
        """The last hidden state of every token ([n_i, H] float32 per text, special tokens
        included), as sentence-transformers' encode(output_value="token_embeddings")."""
        if self.spec.head:
            raise HeadError(
                f"token embeddings come from an embedding model; {self.spec.name} is "
                f"{a_(HEAD_NAMES[self.spec.head])} model"
            )
        self._need("encode(output_value='token_embeddings')", "")
        items = Tokenizer.check_texts(texts)
        ids, pos, cu = self.tokenizer.encode_packed(items, truncate, max_len=self.max_seq_tokens)
        # the pool's input: intact after the run (Dense modules may follow the pool)
        tap = next(op for op in reversed(self.model.graph.ops) if op.kind == "pool").inputs[0]
        out = np.empty((len(ids), self.spec.hidden), np.float32)
        for _, _, a, z, o in self._run_head(ids, pos, None, cu, (tap,), self._max_seqs(batch_size)):
            out[a:z] = o[tap]
        return np.split(out, cu[1:-1]) if len(items) else []


def _keep_top(v: np.ndarray, k: int) -> np.ndarray:
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"top_k must be a positive int or None, got {k!r}")
    if k >= v.shape[1]:
        return v
    out = np.zeros_like(v)
    idx = np.argpartition(-v, k - 1, axis=1)[:, :k]
    rows = np.arange(v.shape[0])[:, None]
    out[rows, idx] = v[rows, idx]
    return out
