"""encode's sentence-transformers options: token embeddings, truncate_dim, prompts."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
from tests.conftest import build_hf_model, real_sentences, save_checkpoint
from tests.heads.helpers import close

import zoi

TEXTS = ["hello world", "a", "token embeddings of every token, specials included"] + real_sentences(
    5
)


@pytest.fixture(scope="module")
def st_folder(tmp_path_factory):
    f = save_checkpoint(
        build_hf_model("bert", seed=4),
        tmp_path_factory.mktemp("st"),
        pooling="mean",
        normalize=True,
    )
    (f / "config_sentence_transformers.json").write_text(
        json.dumps(
            {"prompts": {"query": "query: ", "doc": "passage: "}, "default_prompt_name": None}
        )
    )
    (f / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 64}))
    return f


def _st(folder):
    from sentence_transformers import SentenceTransformer

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return SentenceTransformer(str(folder), device="cpu")


@pytest.mark.parametrize("device", ["reference", "cpu"])
def test_token_embeddings_match_sentence_transformers(st_folder, device):
    ref = _st(st_folder).encode(TEXTS, output_value="token_embeddings")
    eng = zoi.compile(st_folder, device=device)
    got = eng.encode(TEXTS, output_value="token_embeddings")
    assert len(got) == len(ref)
    for g, r in zip(got, ref, strict=True):
        close(g, r.numpy())
    one = eng.encode("hello world", output_value="token_embeddings")
    np.testing.assert_allclose(one, got[0], rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="output_value"):
        eng.encode(TEXTS, output_value="cls")


def test_truncate_dim(st_folder, tmp_path):
    st = _st(st_folder)
    ref = st.encode(TEXTS, truncate_dim=24, normalize_embeddings=True)
    eng = zoi.compile(st_folder, device="cpu")
    got = eng.encode(TEXTS, truncate_dim=24)
    assert got.shape == (len(TEXTS), 24)
    close(got, ref)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1, atol=1e-6)
    raw = eng.encode(TEXTS, truncate_dim=24, normalize_embeddings=False)
    full = eng.encode(TEXTS, normalize_embeddings=False)
    np.testing.assert_allclose(raw, full[:, :24], rtol=1e-6, atol=1e-7)
    # the compile option is the default, kept by the artifact; 0 turns it off
    eng2 = zoi.compile(st_folder, device="cpu", truncate_dim=24)
    np.testing.assert_allclose(eng2.encode(TEXTS), got, rtol=1e-6, atol=1e-7)
    assert eng2.encode(TEXTS, truncate_dim=0).shape == (len(TEXTS), 60)
    eng2.save(tmp_path / "a")
    assert zoi.load(tmp_path / "a").encode("x").shape == (24,)
    for bad in (0.5, 61, -1, True):
        with pytest.raises(ValueError, match="truncate_dim"):
            eng.encode(TEXTS, truncate_dim=bad)
    with pytest.raises(ValueError, match="truncate_dim"):
        zoi.compile(st_folder, device="reference", truncate_dim=100)


def test_prompts(st_folder, tmp_path):
    st = _st(st_folder)
    eng = zoi.compile(st_folder, device="cpu")
    assert eng.prompts == {"query": "query: ", "doc": "passage: "}
    close(eng.encode(TEXTS, prompt_name="query"), st.encode(TEXTS, prompt_name="query"))
    close(eng.encode(TEXTS, prompt="search: "), st.encode(TEXTS, prompt="search: "))
    close(eng.encode("x", prompt_name="doc"), eng.encode("passage: x"))
    with pytest.raises(ValueError, match="prompt_name 'nope'"):
        eng.encode(TEXTS, prompt_name="nope")
    # default_prompt_name applies when nothing is passed
    cfg = json.loads((st_folder / "config_sentence_transformers.json").read_text())
    f2 = tmp_path / "m"
    import shutil

    shutil.copytree(st_folder, f2)
    cfg["default_prompt_name"] = "query"
    (f2 / "config_sentence_transformers.json").write_text(json.dumps(cfg))
    eng2 = zoi.compile(f2, device="cpu")
    close(eng2.encode(TEXTS), eng.encode(TEXTS, prompt_name="query"))
    # the default prompt once, with truncate_dim too (a re-entrant encode must not add it twice)
    close(
        eng2.encode(TEXTS, truncate_dim=20), eng.encode(TEXTS, prompt_name="query", truncate_dim=20)
    )
    close(eng2.encode(TEXTS, prompt=""), eng.encode(TEXTS))
    eng2.save(tmp_path / "art")
    close(zoi.load(tmp_path / "art").encode(TEXTS), eng.encode(TEXTS, prompt_name="query"))


def test_token_embeddings_every_isa(st_folder):
    from tests.fixtures import supported_isas

    from zoi.backends.cpu import CpuBackend

    eng = zoi.compile(st_folder, device="cpu", max_tokens=80)  # several chunks
    ref = zoi.Engine(eng.model, eng.tokenizer, "reference").encode(
        TEXTS, output_value="token_embeddings"
    )
    for isa in supported_isas():
        eng.backend = CpuBackend(eng.model, isa=isa)
        got = eng.encode(TEXTS, output_value="token_embeddings", batch_size=3)
        for g, r in zip(got, ref, strict=True):
            close(g, r)
