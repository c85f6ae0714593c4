"""Token classification, SPLADE and token embeddings on the CUDA backend itself:
per-token logits [T, labels] and token embeddings copied from the arena, SPLADE pooled on the
GPU (kernels/sparse_pool.py), FP16 and INT8, against the reference engine on the same model
(INT8: its emulation) and transformers; NER entities aggregated on the host."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("triton")
pytest.importorskip("transformers")  # the random checkpoints

from tests import triton_mode  # noqa: E402
from tests.conftest import compile_int8_for_kernels, int8_features  # noqa: E402
from tests.heads.builders import SMALL_VOCAB, VOCAB  # noqa: E402
from tests.heads.helpers import hf_logits, hf_tokenizer, max_len  # noqa: E402

import zoi  # noqa: E402
from zoi.backends.cuda import CudaBackend  # noqa: E402

COMPILED = not triton_mode.interpreted()
if COMPILED:
    TEXTS = ["John Smith lives in New York.", "a", "tokens " * 19, ""]  # 35 tokens: bucket 64
    MAX_BATCH = None  # the engine's default
    SPLADE_VOCAB = "minilm"  # the MLM decoder over MiniLM's 30522 ids (+ 7 rows)
else:
    # the interpreter runs every Triton program in Python, so the cost is the number of
    # programs: 29 tokens (bucket 32; one at a time: bucket 16, the long text crosses no
    # other bucket), max_batch 8 (the attention grid has ~min(max_batch, bucket) + tiles
    # programs per head), SPLADE's decoder over a 177-id vocab (one program per 128 columns:
    # 2 instead of 239; sparse_pool's several V blocks are tests/heads/cuda/test_kernels.py's)
    TEXTS = ["John Smith lives in New York.", "a", "tokens " * 13, ""]
    MAX_BATCH = 8
    SPLADE_VOCAB = "small"


def _engines(folder, precision, max_tokens=128):
    """(cuda engine, reference engine) on the same compiled model (INT8: zoi.quant's, with a
    small calibration set: tests.conftest.compile_int8_for_kernels)."""
    size = dict(max_tokens=max_tokens, max_batch=MAX_BATCH)
    if precision == "int8":
        base = compile_int8_for_kernels(folder, **size)
        assert {"dynamic_asym", "act_mul"} <= int8_features(base.model)
    else:
        base = zoi.compile(folder, device="reference", **size)
        base.model = dataclasses.replace(base.model, precision="fp16")
    eng = zoi.Engine(base.model, base.tokenizer, "cuda")
    return eng, zoi.Engine(base.model, base.tokenizer, "reference")


# FP16 in the slow tier (~13 s in the interpreter): the per-token logits, NER and one at a
# time == batched run here in INT8, FP16 linears in test_splade_on_cuda / token embeddings
@pytest.mark.parametrize("precision", [pytest.param("fp16", marks=pytest.mark.slow), "int8"])
def test_token_classification_on_cuda(head_ckpts, precision):
    folder, model = head_ckpts("bert", "tok", 7)
    eng, ref = _engines(folder, precision)
    assert isinstance(eng.backend, CudaBackend)
    got, want = eng.predict_tokens(TEXTS), ref.predict_tokens(TEXTS)
    hf = hf_logits(model, hf_tokenizer(folder, max_len(model)), TEXTS)
    scale = max(np.abs(h).max() for h in hf)
    for g, w, h in zip(got, want, hf, strict=True):
        assert g.shape == w.shape == h.shape and np.isfinite(g).all()
        assert np.abs(g - w).max() < 0.02 * scale
        assert np.abs(g - h).max() < 0.05 * scale
    agree = np.mean([np.mean(g.argmax(1) == w.argmax(1)) for g, w in zip(got, want, strict=True)])
    assert agree > 0.9
    ents = eng.ner(TEXTS[0], aggregation_strategy="simple", ignore_labels=())
    assert ents and all(0 <= e["start"] < e["end"] <= len(TEXTS[0]) for e in ents)
    # one at a time == batched
    one = [eng.predict_tokens(t) for t in TEXTS]
    for o, g in zip(one, got, strict=True):
        assert np.abs(o - g).max() < 0.01 * scale


@pytest.mark.parametrize("precision", ["fp16", "int8"])
def test_splade_on_cuda(head_ckpts, precision):
    folder, _ = head_ckpts("bert", "mlm", vocab=SPLADE_VOCAB)
    eng, ref = _engines(folder, precision, max_tokens=64)
    assert eng.spec.vocab_size == (VOCAB if SPLADE_VOCAB == "minilm" else SMALL_VOCAB)
    assert isinstance(eng.backend, CudaBackend)
    texts = TEXTS[:2]  # short: the [T, vocab] decoder is slow in the interpreter
    got = eng.encode_sparse(texts, dense=True)
    want = ref.encode_sparse(texts, dense=True)
    assert got.shape == want.shape == (2, eng.spec.vocab_size)
    assert np.isfinite(got).all() and (got >= 0).all()
    scale = np.abs(want).max()
    assert np.abs(got - want).max() < 0.03 * scale
    for g, w in zip(got, want, strict=True):  # the top terms agree
        k = 20
        top_g, top_w = set(np.argsort(-g)[:k]), set(np.argsort(-w)[:k])
        assert len(top_g & top_w) >= 0.8 * k
    idx, val = eng.encode_sparse(texts[0])
    assert np.all(val > 0) and np.all(np.diff(idx) > 0)
    np.testing.assert_array_equal(idx, np.flatnonzero(got[0]))


# INT8 in the slow tier (~8 s in the interpreter): the token rows copied from the arena run here
# in FP16, the INT8 engine on cuda in test_token_classification_on_cuda / test_splade_on_cuda
@pytest.mark.parametrize("precision", ["fp16", pytest.param("int8", marks=pytest.mark.slow)])
def test_token_embeddings_on_cuda(small_bert_path, precision):
    eng, ref = _engines(small_bert_path, precision)
    got = eng.encode(TEXTS, output_value="token_embeddings")
    want = ref.encode(TEXTS, output_value="token_embeddings")
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        g, w = np.asarray(g), np.asarray(w)
        assert g.shape == w.shape and np.isfinite(g).all()
        cos = (g * w).sum(1) / np.linalg.norm(g, axis=1) / np.linalg.norm(w, axis=1)
        assert cos.min() > 0.999
    # the pooled embeddings of the same engine still come from the pool kernel
    emb = eng.encode(TEXTS[:2])
    assert np.isfinite(emb).all()
