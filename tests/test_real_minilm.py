"""The real all-MiniLM-L6-v2 against sentence-transformers (cosine >= 0.99999 on >= 200 sentences)."""

from __future__ import annotations

import numpy as np
import pytest

import zoi
from conftest import minilm_path, real_sentences


@pytest.fixture(scope="module")
def st_model():
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(minilm_path()), device="cpu")


@pytest.fixture(scope="module")
def texts():
    base = real_sentences(240)
    # mixed lengths: single sentences, paragraphs, and a text over the 256-token limit
    paras = [" ".join(base[i : i + 6]) for i in range(0, 60, 6)]
    return base + paras + [" ".join(base[:40]), "", "x"]


def test_reference_matches_sentence_transformers(st_model, texts):
    eng = zoi.compile(device="reference")
    assert eng.spec.max_positions == 256 and eng.spec.pooling == "mean" and eng.spec.normalize
    ours = eng.encode(texts, batch_size=64)
    ref = st_model.encode(texts, batch_size=64, convert_to_numpy=True)
    cos = (ours * ref).sum(1) / np.linalg.norm(ours, axis=1) / np.linalg.norm(ref, axis=1)
    assert len(texts) >= 200
    assert cos.min() >= 0.99999, cos.min()
