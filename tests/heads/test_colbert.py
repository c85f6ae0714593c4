"""ColBERT checkpoints (PyLate / sentence-transformers folders, Stanford HF_ColBERT): the token
vectors of queries (marker, [MASK] expansion, attended or not) and documents (marker, skiplist)
against a torch implementation of PyLate's encode, MaxSim rerank, INT8, the serving routes."""

from __future__ import annotations

import numpy as np
import pytest
from tests.conftest import compile_int8_for_kernels, real_sentences
from tests.heads.helpers import spearman
from tests.heads.mv_builders import pylate_folder, pylate_maxsim, pylate_reference, stanford_folder

import zoi
from zoi.errors import HeadError

QUERIES = ["what is the capital of france?", "a", "", "how do plants make food " * 5]
DOCS = [
    "Paris is the capital and largest city of France.",
    "Photosynthesis converts light energy into chemical energy!",
    "x",
    "naïve café — ünïcödé text, with 中文 characters...",
    "The quick brown fox jumps over the lazy dog; " * 5,  # past document_length
] + real_sentences(5)

CONFIGS = {  # PyLate's query expansion variants
    "masked-expansion": dict(expansion=True, attend=False),  # PyLate's and ColBERT's default
    "attended-expansion": dict(expansion=True, attend=True),
    "no-expansion": dict(expansion=False),
}


@pytest.fixture(scope="module")
def pylate(tmp_path_factory):
    cache = {}

    def get(name):
        if name not in cache:
            folder, model, lin, cfg = pylate_folder(tmp_path_factory.mktemp(name), **CONFIGS[name])
            cache[name] = (zoi.compile(folder, device="cpu"), model, lin, cfg, folder)
        return cache[name]

    return get


def _check(got, want, tol=1e-5):
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == np.float32 and g.shape == w.shape, (g.shape, w.shape)
        err = np.abs(g.astype(np.float64) - w).max() if w.size else 0.0
        assert err <= tol, err  # unit vectors: the absolute error is the relative one


@pytest.mark.parametrize("name", list(CONFIGS))
def test_vectors_match_pylate(pylate, name):
    eng, model, lin, cfg, folder = pylate(name)
    mv = eng.multivector
    assert mv.kind == "colbert" and mv.outputs == ("colbert",) and mv.colbert_dim == 13
    assert mv.query_expansion == cfg["do_query_expansion"]
    assert mv.attend_to_expansion == bool(
        cfg["do_query_expansion"] and cfg["attend_to_expansion_tokens"]
    )
    q = eng.encode_multi(QUERIES, "colbert", is_query=True)
    _check(q, pylate_reference(model, lin, folder, cfg, QUERIES, True))
    if cfg["do_query_expansion"]:
        assert {len(x) for x in q} == {cfg["query_length"]}
    d = eng.encode_multi(DOCS, "colbert", is_query=False)
    _check(d, pylate_reference(model, lin, folder, cfg, DOCS, False))
    assert max(len(x) for x in d) <= cfg["document_length"]  # past sentence_bert_config's 20
    # the same on the reference backend
    ref_eng = zoi.Engine(eng.model, eng.tokenizer, "reference")
    _check(ref_eng.encode_multi(QUERIES, "colbert", is_query=True), q, 1e-5)


def test_rerank_maxsim(pylate):
    eng, model, lin, cfg, folder = pylate("masked-expansion")
    q = pylate_reference(model, lin, folder, cfg, [QUERIES[0]], True)[0]
    d = pylate_reference(model, lin, folder, cfg, DOCS, False)
    want = np.array([pylate_maxsim(q, x) for x in d])
    got = eng.rerank(QUERIES[0], DOCS, return_documents=True)
    assert [r["corpus_id"] for r in got] == list(np.argsort(-want, kind="stable"))
    for r in got:
        assert abs(r["score"] - want[r["corpus_id"]]) <= 1e-5 * abs(want[r["corpus_id"]])
        assert r["text"] == DOCS[r["corpus_id"]] and "scores" not in r
    assert len(eng.rerank(QUERIES[0], DOCS, top_k=2)) == 2
    with pytest.raises(ValueError, match="MaxSim"):
        eng.rerank(QUERIES[0], DOCS, weights=(1, 0, 0))


def test_refusals(pylate):
    eng = pylate("masked-expansion")[0]
    with pytest.raises(HeadError, match="ColBERT model"):
        eng.encode(DOCS)
    with pytest.raises(HeadError, match="no 'dense' output"):
        eng.encode_multi(DOCS, "dense")
    with pytest.raises(HeadError, match="no 'sparse'|SPLADE"):
        eng.encode_sparse(DOCS)
    with pytest.raises(ValueError, match="ColBERT model"):
        zoi.compile(pylate("no-expansion")[4], device="cpu", pooling="cls")
    with pytest.raises(TypeError, match="is_query"):
        eng.encode_multi(DOCS, "colbert", is_query="yes")
    with pytest.raises(zoi.errors.InputError, match="document_length"):
        eng.encode_multi(DOCS, "colbert", truncate=False)
    # token embeddings stay the encoder's (TEI /embed_all)
    te = eng.encode(["hello world"], output_value="token_embeddings")
    assert te[0].shape == (4, eng.spec.hidden)


def test_stanford_checkpoint(tmp_path):
    folder, model, lin, cfg = stanford_folder(tmp_path / "colbertv2")
    eng = zoi.compile(folder, device="cpu")
    mv = eng.multivector
    assert mv.source.startswith("Stanford") and (mv.query_marker, mv.document_marker) == (1, 2)
    _check(
        eng.encode_multi(QUERIES, "colbert", is_query=True),
        pylate_reference(model, lin, folder, cfg, QUERIES, True),
    )
    _check(
        eng.encode_multi(DOCS, "colbert"), pylate_reference(model, lin, folder, cfg, DOCS, False)
    )


def test_int8_and_artifact(pylate, tmp_path):
    eng, model, lin, cfg, folder = pylate("masked-expansion")
    q8 = compile_int8_for_kernels(folder)
    for is_query, texts in ((True, QUERIES), (False, DOCS)):
        a = eng.encode_multi(texts, "colbert", is_query=is_query)
        b = q8.encode_multi(texts, "colbert", is_query=is_query)
        for x, y in zip(a, b, strict=True):
            assert x.shape == y.shape and (x * y).sum(1).min() >= 0.99
    sa = [r["score"] for r in sorted(eng.rerank(QUERIES[0], DOCS), key=lambda r: r["corpus_id"])]
    sb = [r["score"] for r in sorted(q8.rerank(QUERIES[0], DOCS), key=lambda r: r["corpus_id"])]
    assert spearman(sa, sb) > 0.95 and int(np.argmax(sa)) == int(np.argmax(sb))
    q8.save(tmp_path / "c.zoi")
    back = zoi.load(tmp_path / "c.zoi")
    assert back.multivector == q8.multivector
    for x, y in zip(back.encode_multi(QUERIES, "colbert", is_query=True),
                    q8.encode_multi(QUERIES, "colbert", is_query=True), strict=True):  # fmt: skip
        np.testing.assert_array_equal(x, y)


def test_routes(pylate):
    from tests.heads.test_routes import client, run

    eng = pylate("attended-expansion")[0]
    texts = [t for t in QUERIES if t]

    async def go():
        async with client(eng) as c:
            r = await c.post("/embed_multivector", json={"inputs": texts, "is_query": True})
            assert r.status_code == 200, r.text
            for got, want in zip(
                r.json(), eng.encode_multi(texts, "colbert", is_query=True), strict=True
            ):
                np.testing.assert_allclose(np.asarray(got, np.float32), want, rtol=1e-6, atol=1e-7)
            r = await c.post("/embed_multivector", json={"inputs": DOCS[0]})
            assert np.asarray(r.json()[0]).shape == eng.encode_multi(DOCS[0], "colbert").shape
            r = await c.post("/embed", json={"inputs": "x"})
            assert r.status_code == 400 and "ColBERT" in r.json()["error"]
            r = await c.post("/v1/embeddings", json={"input": "x"})
            assert r.status_code == 400 and "ColBERT" in r.text
            r = await c.post("/embed_sparse", json={"inputs": "x"})
            assert r.status_code == 404 and "/embed_all, /embed_multivector" in r.json()["error"]
            doc = (await c.get("/openapi.json")).json()["paths"]
            assert "/embed_multivector" in doc and "/embed_sparse" not in doc

    run(go())


def test_multivector_route_absent(small_bert):
    from tests.heads.test_routes import client, run

    async def go():
        async with client(zoi.compile(small_bert, device="cpu")) as c:
            r = await c.post("/embed_multivector", json={"inputs": "x"})
            assert r.status_code == 404 and "ColBERT vectors" in r.json()["error"]

    run(go())
