"""SPLADE sparse vectors from a *ForMaskedLM checkpoint, against transformers' MLM logits and
sentence-transformers' SparseEncoder."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from tests.conftest import real_sentences
from tests.fixtures import supported_isas
from tests.heads.helpers import close, hf_tokenizer, max_len

import zoi

TEXTS = [
    "hello world",
    "a",
    "SPLADE max-pools log1p(relu(logits)) over the tokens " * 3,
] + real_sentences(9)


def _reference(model, folder, texts) -> np.ndarray:
    import torch

    tok = hf_tokenizer(folder, max_len(model))
    out = []
    for t in texts:
        e = tok.encode(t)
        with torch.no_grad():
            lg = model(input_ids=torch.tensor([e.ids])).logits[0].numpy()
        out.append(np.log1p(np.maximum(lg, 0)).max(0))
    return np.stack(out)


@pytest.mark.parametrize("device", ["reference", "cpu"])
@pytest.mark.parametrize("arch", ["bert", "roberta", "distilbert"])
def test_sparse_matches_transformers(head_ckpts, arch, device):
    folder, model = head_ckpts(arch, "mlm")
    eng = zoi.compile(folder, device=device)
    assert eng.head == "splade"
    ref = _reference(model, folder, TEXTS)
    dense = eng.encode_sparse(TEXTS, dense=True)
    assert dense.shape == (len(TEXTS), model.config.vocab_size)
    close(dense, ref)
    for (idx, val), row in zip(eng.encode_sparse(TEXTS), dense, strict=True):
        assert idx.dtype == np.int32 and val.dtype == np.float32
        assert np.all(np.diff(idx) > 0) and np.all(val > 0)
        np.testing.assert_array_equal(idx, np.flatnonzero(row))
        np.testing.assert_array_equal(val, row[idx])
    idx, val = eng.encode_sparse("hello world")
    np.testing.assert_allclose(val, dense[0][idx], rtol=1e-5, atol=1e-6)


def test_sparse_encoder_and_its_folder(head_ckpts, tmp_path):
    from sentence_transformers import SparseEncoder

    folder, model = head_ckpts("bert", "mlm")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        se = SparseEncoder(str(folder), device="cpu")
        se.max_seq_length = max_len(model)
        ref = np.asarray(se.encode(TEXTS, convert_to_sparse_tensor=False, convert_to_tensor=False))
        se.save(str(tmp_path / "st"))
    close(zoi.compile(folder, device="cpu").encode_sparse(TEXTS, dense=True), ref)
    eng = zoi.compile(tmp_path / "st", device="cpu")  # modules.json: Transformer + SpladePooling
    assert eng.head == "splade"
    close(eng.encode_sparse(TEXTS, dense=True), ref)


def test_top_k_chunks_isas_int8(head_ckpts, tmp_path):
    from zoi.backends.cpu import CpuBackend

    folder, _ = head_ckpts("bert", "mlm")
    eng = zoi.compile(folder, device="cpu", max_tokens=64)  # the [T, vocab] logits in chunks
    full = eng.encode_sparse(TEXTS, dense=True)
    ref = zoi.Engine(eng.model, eng.tokenizer, "reference").encode_sparse(TEXTS, dense=True)
    close(full, ref)
    one = np.stack([eng.encode_sparse(t, dense=True) for t in TEXTS])
    np.testing.assert_allclose(full, one, rtol=1e-5, atol=1e-6)
    for isa in supported_isas():
        eng.backend = CpuBackend(eng.model, isa=isa)
        close(eng.encode_sparse(TEXTS, dense=True), ref)
    top = eng.encode_sparse(TEXTS, top_k=10)
    for (idx, _val), row in zip(top, full, strict=True):
        assert len(idx) == 10
        assert set(idx.tolist()) == set(np.argsort(-row)[:10].tolist())
    q = zoi.compile(folder, device="cpu", precision="int8")
    assert q.backend.linear_kinds["mlm.dec"] == "int8"
    qd = q.encode_sparse(TEXTS, dense=True)
    for a, b in zip(qd, full, strict=True):
        ka, kb = set(np.argsort(-a)[:20].tolist()), set(np.argsort(-b)[:20].tolist())
        assert len(ka & kb) >= 16
    q.save(tmp_path / "q")
    np.testing.assert_array_equal(zoi.load(tmp_path / "q").encode_sparse(TEXTS, dense=True), qd)


def test_default_arena_is_bounded(head_ckpts):
    from zoi.heads.api import SPLADE_ARENA_BYTES

    folder, model = head_ckpts("bert", "mlm")
    eng = zoi.compile(folder, device="cpu")
    V = model.config.vocab_size
    assert eng.max_tokens * V * 4 <= SPLADE_ARENA_BYTES
    assert eng.max_tokens >= eng.spec.max_positions
