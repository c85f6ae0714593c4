"""BGE-M3: dense, sparse and ColBERT outputs from one forward, against a torch implementation of
FlagEmbedding's formulas (random-init XLM-R of awkward sizes, XLM-R-style tokenizer), the
combined rerank score, INT8, artifacts and the serving routes."""

from __future__ import annotations

import json

import numpy as np
import pytest
from tests.conftest import compile_int8_for_kernels, real_sentences
from tests.heads.helpers import spearman
from tests.heads.mv_builders import (
    bge_m3_folder,
    flag_colbert_score,
    flag_lexical_score,
    m3_reference,
)

import zoi
from zoi.errors import CheckpointError, HeadError
from zoi.heads.multivector import combined_score, lexical_score, maxsim

TEXTS = [
    "hello world",
    "a",
    "",
    "naïve café — ünïcödé 中文",
    "The quick brown fox jumps over the lazy dog " * 6,  # truncated to the 40 positions
] + real_sentences(9)
QUERY = "what is the capital of france?"


@pytest.fixture(scope="module")
def m3(tmp_path_factory):
    return bge_m3_folder(tmp_path_factory.mktemp("bge-m3"))


@pytest.fixture(scope="module")
def ref(m3):
    folder, model, lins = m3
    return m3_reference(model, lins, folder, TEXTS + [QUERY])


@pytest.fixture(scope="module")
def eng(m3):
    return zoi.compile(m3[0], device="cpu")


def _sparse_close(got, want: dict, rtol: float):
    ids, w = got
    assert ids.dtype == np.int32 and w.dtype == np.float32
    assert np.all(np.diff(ids) > 0) and np.all(w > 0)
    g = dict(zip(ids.tolist(), w.tolist(), strict=True))
    keys = set(g) | set(want)
    if not keys:
        return
    scale = max(abs(v) for v in want.values()) if want else 1.0
    err = max(abs(g.get(k, 0.0) - want.get(k, 0.0)) for k in keys) / scale
    assert err <= rtol, f"sparse weights: max error {err:.2e} of the largest"


def _rel(got, want) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, (got.shape, want.shape)
    return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-12)) if want.size else 0.0


@pytest.mark.parametrize("device", ["cpu", "reference"])
def test_outputs_match_flagembedding(m3, ref, device):
    eng = zoi.compile(m3[0], device=device)
    assert eng.multivector.kind == "bge-m3"
    assert eng.multivector.outputs == ("dense", "sparse", "colbert")
    assert eng.multivector.sparse_skip_ids == (0, 1, 2, 3)  # <s> <pad> </s> <unk>
    out = eng.encode_multi(TEXTS)
    assert set(out) == {"dense", "sparse", "colbert"}
    cos = (out["dense"].astype(np.float64) * ref["dense"][: len(TEXTS)]).sum(1)
    assert cos.min() >= 0.99999, cos
    for got, want in zip(out["sparse"], ref["sparse"], strict=False):
        _sparse_close(got, want, 1e-5)
    assert sum(len(x[0]) for x in out["sparse"]) > 20  # the relu keeps a fair share
    for got, want in zip(out["colbert"], ref["colbert"], strict=False):
        assert got.dtype == np.float32 and got.shape == want.shape  # the tokens after <s>
        assert _rel(got, want) <= 1e-5
    # encode() is the dense output; a str gives one of each; subsets come out the same
    np.testing.assert_allclose(eng.encode(TEXTS), out["dense"], rtol=1e-5, atol=1e-6)
    one = eng.encode_multi(TEXTS[0])
    assert one["dense"].shape == (36,) and isinstance(one["sparse"], tuple)
    # (one text: another GEMM shape than the batch's, last-bit differences)
    np.testing.assert_allclose(one["colbert"], out["colbert"][0], rtol=1e-5, atol=1e-6)
    sp = eng.encode_multi(TEXTS, "sparse")
    for a, b in zip(sp, out["sparse"], strict=True):
        np.testing.assert_array_equal(a[0], b[0])
        np.testing.assert_array_equal(a[1], b[1])
    two = eng.encode_multi(TEXTS, ["colbert", "dense"])
    assert set(two) == {"colbert", "dense"}
    np.testing.assert_array_equal(two["dense"], out["dense"])


def test_one_forward(eng, monkeypatch):
    calls = []
    orig = eng.backend.run_outputs

    def counted(*a, **k):
        calls.append(k.get("taps", a[4] if len(a) > 4 else None))
        return orig(*a, **k)

    monkeypatch.setattr(eng.backend, "run_outputs", counted)
    eng.encode_multi(TEXTS)  # the three outputs of 14 texts: one backend call
    assert len(calls) == 1
    calls.clear()
    eng.rerank(QUERY, TEXTS)  # the query and the documents in one forward too
    assert len(calls) == 1


def test_scores_and_rerank(eng, ref):
    docs = TEXTS
    q = {k: v[-1] for k, v in ref.items()}
    want_parts = {
        "dense": [float(ref["dense"][i] @ q["dense"]) for i in range(len(docs))],
        "sparse": [flag_lexical_score(q["sparse"], ref["sparse"][i]) for i in range(len(docs))],
        "colbert": [flag_colbert_score(q["colbert"], ref["colbert"][i]) for i in range(len(docs))],
    }
    w = (0.4, 0.2, 0.4)
    want = [
        sum(wi * want_parts[m][i] for wi, m in zip(w, ("dense", "sparse", "colbert"), strict=True))
        / sum(w)
        for i in range(len(docs))
    ]
    got = eng.rerank(QUERY, docs, return_documents=True)
    assert [r["corpus_id"] for r in got] == list(np.argsort(-np.asarray(want), kind="stable"))
    for r in got:
        i = r["corpus_id"]
        assert r["text"] == docs[i]
        assert abs(r["score"] - want[i]) <= 1e-5 * max(abs(want[i]), 1)
        for m in ("dense", "sparse", "colbert"):
            assert abs(r["scores"][m] - want_parts[m][i]) <= 1e-5 * max(abs(want_parts[m][i]), 1)
        assert abs(combined_score(r["scores"]) - r["score"]) < 1e-9
    # FlagEmbedding's own default weights [1, 1, 1], as a dict, top_k
    eq = eng.rerank(QUERY, docs, weights=(1, 1, 1), top_k=3)
    mean = np.mean([want_parts[m] for m in want_parts], axis=0)
    assert [r["corpus_id"] for r in eq] == list(np.argsort(-mean, kind="stable")[:3])
    only = eng.rerank(QUERY, docs, weights={"colbert": 1.0})
    assert [r["corpus_id"] for r in only] == list(
        np.argsort(-np.asarray(want_parts["colbert"]), kind="stable")
    )
    for bad in ((1, 1), {"lexical": 1}, (0, 0, 0), (-1, 1, 1), (float("nan"), 1, 1)):
        with pytest.raises(ValueError, match="weights"):
            eng.rerank(QUERY, docs, weights=bad)
    with pytest.raises(ValueError, match="cross-encoder"):
        eng.rerank(QUERY, docs, activation_fn="sigmoid")
    assert eng.rerank(QUERY, []) == []
    # the public helpers on FlagEmbedding's own shapes
    a, b = eng.encode_sparse([QUERY, docs[5]])
    da = dict(zip(a[0].tolist(), a[1].tolist(), strict=True))
    db = {str(k): v for k, v in zip(b[0].tolist(), b[1].tolist(), strict=True)}
    assert (
        abs(
            lexical_score(a, b)
            - flag_lexical_score(da, dict(zip(b[0].tolist(), b[1].tolist(), strict=True)))
        )
        < 1e-9
    )
    assert abs(lexical_score(da, {int(k): v for k, v in db.items()}) - lexical_score(a, b)) < 1e-9
    c = eng.encode_multi([QUERY, docs[5]], "colbert")
    assert abs(maxsim(c[0], c[1]) - flag_colbert_score(c[0], c[1])) < 1e-6
    assert maxsim(c[0], c[1], "sum") == pytest.approx(maxsim(c[0], c[1]) * len(c[0]), rel=1e-6)


def test_encode_sparse_shapes(eng):
    rows = eng.encode_sparse(TEXTS)
    full = eng.encode_sparse(TEXTS, dense=True)
    assert full.shape == (len(TEXTS), eng.spec.vocab_size) and full.dtype == np.float32
    for (idx, val), row in zip(rows, full, strict=True):
        np.testing.assert_array_equal(idx, np.flatnonzero(row))
        np.testing.assert_array_equal(val, row[idx])
    top = eng.encode_sparse(TEXTS, top_k=2)
    for (idx, val), (i0, v0) in zip(top, rows, strict=True):
        assert len(idx) == min(2, len(i0)) and np.all(np.diff(idx) > 0)
        assert set(val.tolist()) == set(np.sort(v0)[::-1][:2].tolist())
    i, v = eng.encode_sparse(TEXTS[0])
    np.testing.assert_array_equal(i, rows[0][0])
    with pytest.raises(ValueError, match="top_k"):
        eng.encode_sparse(TEXTS, top_k=0)


def test_int8_close(m3, eng):
    q = compile_int8_for_kernels(m3[0])
    assert q.precision == "int8" and q.multivector.kind == "bge-m3"
    a, b = eng.encode_multi(TEXTS), q.encode_multi(TEXTS)
    assert ((a["dense"] * b["dense"]).sum(1)).min() >= 0.999
    for (ia, va), (ib, vb) in zip(a["sparse"], b["sparse"], strict=True):
        da = dict(zip(ia.tolist(), va.tolist(), strict=True))
        db = dict(zip(ib.tolist(), vb.tolist(), strict=True))
        keys = set(da) | set(db)
        if keys:
            err = max(abs(da.get(k, 0) - db.get(k, 0)) for k in keys) / max(va, default=1e-3)
            assert err <= 0.1
    for x, y in zip(a["colbert"], b["colbert"], strict=True):
        assert (x * y).sum(1).min() >= 0.999
    ra = eng.rerank(QUERY, TEXTS)
    rb = q.rerank(QUERY, TEXTS)
    sa = [r["score"] for r in sorted(ra, key=lambda r: r["corpus_id"])]
    sb = [r["score"] for r in sorted(rb, key=lambda r: r["corpus_id"])]
    assert max(abs(x - y) for x, y in zip(sa, sb, strict=True)) < 0.01
    # the same top 3, but for two documents whose FP32 scores are closer than the two INT8
    # errors allowed above (2 x 0.01): such a near-tie may swap; a misranking over a real gap fails
    by_a = {r["corpus_id"]: r["score"] for r in ra}
    top_a, top_b = [r["corpus_id"] for r in ra[:3]], [r["corpus_id"] for r in rb[:3]]
    for x, y in zip(top_a, top_b, strict=True):
        assert x == y or abs(by_a[x] - by_a[y]) < 0.02, (top_a, top_b)
    assert spearman(sa, sb) > 0.95


def test_artifact_roundtrip(eng, tmp_path):
    eng.save(tmp_path / "m3.zoi")
    back = zoi.load(tmp_path / "m3.zoi")
    assert back.multivector == eng.multivector
    a, b = eng.encode_multi(TEXTS), back.encode_multi(TEXTS)
    np.testing.assert_array_equal(a["dense"], b["dense"])
    for x, y in zip(a["colbert"], b["colbert"], strict=True):
        np.testing.assert_array_equal(x, y)
    # a record that does not match the weights is refused at load, naming the file
    meta = json.loads((tmp_path / "m3.zoi" / "zoi.json").read_text())
    meta["meta"]["multivector"]["layers"] = [["none", 7]]
    (tmp_path / "m3.zoi" / "zoi.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="mv.colbert0.w"):
        zoi.load(tmp_path / "m3.zoi")


def test_one_head_and_plain_folder(tmp_path):
    """A folder with the sparse head alone, without sentence-transformers modules: dense is
    FlagEmbedding's [CLS], normalised; the missing output is named."""
    folder, model, lins = bge_m3_folder(tmp_path / "sp", seed=3, heads=("sparse",), st=False)
    e = zoi.compile(folder, device="cpu")
    assert e.multivector.outputs == ("dense", "sparse")
    assert e.spec.pooling == "cls" and e.spec.normalize
    ref = m3_reference(model, lins, folder, TEXTS[:6])
    out = e.encode_multi(TEXTS[:6])
    assert ((out["dense"] * ref["dense"]).sum(1)).min() >= 0.99999
    for got, want in zip(out["sparse"], ref["sparse"], strict=True):
        _sparse_close(got, want, 1e-5)
    with pytest.raises(HeadError, match="no 'colbert' output"):
        e.encode_multi(TEXTS, "colbert")
    with pytest.raises(ValueError, match="no colbert output"):
        e.rerank(QUERY, TEXTS, weights=(0.4, 0.2, 0.4))
    r = e.rerank(QUERY, TEXTS[:6])  # the default weights over the outputs it has
    assert set(r[0]["scores"]) == {"dense", "sparse"}
    with pytest.raises(ValueError, match="output must be one of"):
        e.encode_multi(TEXTS, "lexical")


def test_plain_models_have_no_multivector(small_bert):
    e = zoi.compile(small_bert, device="reference")
    assert e.multivector is None
    with pytest.raises(HeadError, match="multi-vector"):
        e.encode_multi(["x"])


def test_routes(eng):
    from tests.heads.test_routes import client, run

    async def go():
        async with client(eng) as c:
            texts = [t for t in TEXTS[:6] if t]  # the server refuses an empty input
            r = await c.post("/embed_sparse", json={"inputs": texts})
            assert r.status_code == 200, r.text
            want = eng.encode_sparse(texts)
            for got, (idx, val) in zip(r.json(), want, strict=True):
                assert [x["index"] for x in got] == idx.tolist()
                np.testing.assert_allclose([x["value"] for x in got], val, rtol=1e-6)
            r = await c.post("/embed_multivector", json={"inputs": "hello world"})
            assert r.status_code == 200, r.text
            np.testing.assert_allclose(
                np.asarray(r.json()[0]), eng.encode_multi("hello world", "colbert"), rtol=1e-6
            )
            r = await c.post("/embed", json={"inputs": ["hello world"]})  # the dense vector
            assert r.status_code == 200
            np.testing.assert_allclose(r.json()[0], eng.encode("hello world"), rtol=1e-5, atol=1e-6)
            r = await c.post("/embed_multivector", json={"inputs": "x", "is_query": "yes"})
            assert r.status_code == 422
            doc = (await c.get("/openapi.json")).json()["paths"]
            assert {"/embed_sparse", "/embed_multivector", "/embed", "/embed_all"} <= set(doc)
            assert "/rerank" not in doc
            for p in ("/embed_sparse", "/embed_multivector"):
                assert doc[p]["post"]["summary"] != "(undocumented route)"
            r = await c.post("/rerank", json={"query": "q", "texts": ["d"]})
            assert r.status_code == 404 and "/embed_sparse, /embed_multivector" in r.json()["error"]
        async with client(eng, max_output_floats=100) as c:
            r = await c.post("/embed_multivector", json={"inputs": TEXTS[4:]})
            assert r.status_code == 413 and "vectors x 36 dimensions" in r.json()["error"]

    run(go())
