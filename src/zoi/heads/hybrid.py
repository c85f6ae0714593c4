"""Cross-encoders / sequence classifiers on device="cuda", without head kernels in
the CUDA backend yet: the encoder runs on the GPU backend as the embedding graph it already
runs (pool "cls", FP16 or INT8; an LLM reranker's decoder pools its last token), the head's
ops (a [B, H] x [H, H] pooler and the classifier, or an LLM reranker's LM-head rows, in
zoi.graph.heads' IR) run on the host through zoi.numerics.reference on the B pooled rows (a
few microseconds against the encoder's milliseconds).

Token types reach the GPU embedding without a kernel change: the body's word table holds one
copy of the words per type, `word[v] + type[t] - type[0]` at row `t * V + v`, and the token id
of a type-t token is `t * V + id` (the backend adds type[0] as for any embedding model): the
same sum, rounded once more. Token classification and SPLADE run on the CUDA backend itself
(CudaBackend.run_outputs: per-token outputs from its arena, SPLADE pooled on the GPU).
"""

from __future__ import annotations

import numpy as np

from zoi.backends.base import SyncSubmit
from zoi.graph.compiled import CompiledModel
from zoi.graph.heads import uses_types
from zoi.heads.names import score_pooling
from zoi.numerics.reference import activation, linear_apply


def body_model(model: CompiledModel) -> CompiledModel:
    """The encoder of a seq_cls model as an embedding model pooling [CLS] (an LLM reranker:
    the last token), with the words copied per token type when the head reads token types."""
    spec, W = model.spec, model.weights
    body_spec = spec.replace(
        head="", head_act="", labels=(), head_fn="", score_tokens=(), pooling=score_pooling(spec)
    )
    bw = {k: v for k, v in W.items() if not k.startswith("head.")}
    if uses_types(spec):
        from zoi.numerics.reference import gather_rows

        V = spec.vocab_size
        word = gather_rows(W, "embed.word", np.arange(V)).astype(np.float32)
        t = W["embed.type"].astype(np.float32)
        bw.pop("embed.word_q", None)
        bw.pop("embed.word_scale", None)
        bw["embed.word"] = np.concatenate([word + (t[i] - t[0]) for i in range(len(t))])
        body_spec = body_spec.replace(vocab_size=V * len(t))
    quant = {p: q for p, q in model.quant.items() if not p.startswith("head.")}
    return CompiledModel.build(
        body_spec, bw, model.precision, model.plan.max_tokens, model.plan.max_batch, quant
    )


class HybridHeadRunner(SyncSubmit):
    """Backend + HeadRunner of a seq_cls model on cuda: GPU encoder, host head."""

    def __init__(self, model: CompiledModel, make_backend):
        self.model = model
        self.body = make_backend(body_model(model), "cuda")
        self.name = self.body.name
        self.V = model.spec.vocab_size
        self.types = uses_types(model.spec)
        ops = model.graph.ops
        i = next(k for k, o in enumerate(ops) if o.kind == "pool")
        self.pooled, self.head_ops = ops[i].output, ops[i + 1 :]

    def _head(self, pooled: np.ndarray) -> np.ndarray:
        env = {self.pooled: pooled.astype(np.float32)}
        for op in self.head_ops:
            p = op.prefix
            y = linear_apply(env[op.inputs[0]], self.model.weights, p, self.model.quant.get(p))
            env[op.output] = activation(y, op.attrs.get("act", "none"))
        return env[self.model.graph.output]

    def run_outputs(self, ids, positions, cu_seqlens, types=None, taps=()) -> dict:
        if taps:
            raise ValueError("device='cuda' gives no per-token outputs of a head model")
        ids = np.asarray(ids, np.int32)
        if types is not None and self.types:
            ids = (ids + np.asarray(types, np.int32) * self.V).astype(np.int32)
        pooled = self.body.run(ids, positions, cu_seqlens, False)
        return {self.model.graph.output: self._head(pooled)}

    def run(self, ids, positions, cu_seqlens, normalize: bool) -> np.ndarray:
        out = self.run_outputs(ids, positions, cu_seqlens)[self.model.graph.output]
        if normalize:
            out = out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)
        return np.ascontiguousarray(out, dtype=np.float32)

    def run_into(self, ids, positions, cu_seqlens, normalize: bool, out: np.ndarray) -> np.ndarray:
        out[: len(cu_seqlens) - 1] = self.run(ids, positions, cu_seqlens, normalize)
        return out

    def memory(self) -> dict:
        m = dict(self.body.memory())
        m["head_bytes"] = int(
            sum(v.nbytes for k, v in self.model.weights.items() if k.startswith("head."))
        )
        return m
