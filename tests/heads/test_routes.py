"""The head routes through the ASGI app (httpx's ASGI transport, no socket)."""

from __future__ import annotations

import asyncio
import contextlib

import numpy as np
import pytest

import zoi

httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")

DOCS = ["Paris is the capital of France.", "a fish", "zoi runs encoders", "x " * 80, "b"]


@contextlib.asynccontextmanager
async def client(engine, **cfg):
    from zoi.serve.app import create_app
    from zoi.serve.config import ServeConfig
    from zoi.serve.service import Service

    svc = Service(engine, ServeConfig(**cfg))
    try:
        app = create_app(svc)
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://t"
        ) as c:
            c.svc = svc
            yield c
    finally:
        svc.close()


def run(coro):
    return asyncio.run(coro)


@pytest.fixture(scope="module")
def ce1(head_ckpts):
    return zoi.compile(head_ckpts("bert", "seq", 1)[0], device="cpu")


@pytest.fixture(scope="module")
def ce3(head_ckpts):
    return zoi.compile(head_ckpts("bert", "seq", 3)[0], device="cpu")


def test_rerank_routes(ce1):
    async def go():
        async with client(ce1, max_queue_delay_us=20000) as c:
            r = await c.post(
                "/rerank", json={"query": "capital of France", "texts": DOCS, "return_text": True}
            )
            assert r.status_code == 200, r.text
            want = ce1.rerank("capital of France", DOCS, return_documents=True)
            got = r.json()
            assert [x["index"] for x in got] == [w["corpus_id"] for w in want]
            assert [x["text"] for x in got] == [w["text"] for w in want]
            np.testing.assert_allclose(
                [x["score"] for x in got], [w["score"] for w in want], rtol=1e-6
            )
            r = await c.post("/rerank", json={"query": "q", "texts": DOCS, "raw_scores": True})
            raw = ce1.predict([("q", d) for d in DOCS], activation_fn="identity")
            np.testing.assert_allclose(sorted(x["score"] for x in r.json()), sorted(raw), rtol=1e-5)
            r = await c.post(
                "/v1/rerank",
                json={"model": ce1.spec.name, "query": "q", "documents": [DOCS[0], {"text": DOCS[1]}, DOCS[2]],
                      "top_n": 2, "return_documents": True},
            )  # fmt: skip
            assert r.status_code == 200, r.text
            res = r.json()["results"]
            want = ce1.rerank("q", DOCS[:3], top_k=2, return_documents=True)
            assert [x["index"] for x in res] == [w["corpus_id"] for w in want]
            assert res[0]["document"] == {"text": want[0]["text"]}
            np.testing.assert_allclose(
                [x["relevance_score"] for x in res], [w["score"] for w in want], rtol=1e-6
            )
            assert (
                await c.post(
                    "/v1/rerank", json={"model": "other", "query": "q", "documents": ["d"]}
                )
            ).status_code == 404
            assert (await c.post("/rerank", json={"query": "", "texts": ["d"]})).status_code == 400
            assert (await c.post("/rerank", json={"query": "q", "texts": []})).status_code == 400
            assert (await c.post("/rerank", json={"query": 3, "texts": ["d"]})).status_code == 422
            # concurrent requests share batches (pairs packed like any sequences)
            b0 = c.svc.heads.batcher.batches
            reqs = [c.post("/rerank", json={"query": f"q{i}", "texts": DOCS}) for i in range(6)]
            outs = await asyncio.gather(*reqs)
            assert c.svc.heads.batcher.batches - b0 < 6
            for i, o in enumerate(outs):
                want = ce1.rerank(f"q{i}", DOCS)
                np.testing.assert_allclose(
                    [x["score"] for x in o.json()], [w["score"] for w in want], rtol=1e-5
                )
            # the embedding routes name the head
            r = await c.post("/embed", json={"inputs": "x"})
            assert r.status_code == 400 and "sequence classification" in r.json()["error"]
            r = await c.post("/embed_sparse", json={"inputs": "x"})
            assert r.status_code == 404 and "sequence classification" in r.json()["error"]
            doc = (await c.get("/openapi.json")).json()["paths"]
            assert {"/rerank", "/predict", "/v1/rerank"} <= set(doc) and "/embed_sparse" not in doc

    run(go())


def test_predict_route(ce3):
    async def go():
        async with client(ce3) as c:
            r = await c.post("/predict", json={"inputs": ["what", "that"]})
            assert r.status_code == 200, r.text
            got = r.json()
            assert len(got) == 3 and abs(sum(x["score"] for x in got) - 1) < 1e-5
            probs = ce3.predict(["what", "that"], activation_fn="softmax")
            assert got[0]["label"] == ce3.labels[int(np.argmax(probs))]
            assert [x["score"] for x in got] == sorted((x["score"] for x in got), reverse=True)
            r = await c.post(
                "/predict",
                json={"inputs": [["what", "that"], "single text", ["a", "b"]], "raw_scores": True},
            )
            rows = r.json()
            assert len(rows) == 3
            for row, want in zip(rows, [ce3.predict(["what", "that"]), ce3.predict(["single text"])[0],
                                        ce3.predict(["a", "b"])], strict=True):  # fmt: skip
                d = {x["label"]: x["score"] for x in row}
                np.testing.assert_allclose([d[lb] for lb in ce3.labels], want, rtol=1e-5, atol=1e-6)
            assert (await c.post("/predict", json={"inputs": [1, 2]})).status_code == 422
            assert (await c.post("/predict", json={})).status_code == 422
            r = await c.post("/rerank", json={"query": "q", "texts": ["d"]})
            assert r.status_code == 400 and "labels" in r.json()["error"]

    run(go())


def test_sparse_and_token_routes(head_ckpts, small_bert_path):
    sp = zoi.compile(head_ckpts("bert", "mlm")[0], device="cpu")
    emb = zoi.compile(small_bert_path, device="cpu")

    async def go():
        async with client(sp) as c:
            r = await c.post("/embed_sparse", json={"inputs": ["hello world", "b"]})
            assert r.status_code == 200, r.text
            for row, (idx, val) in zip(
                r.json(), sp.encode_sparse(["hello world", "b"]), strict=True
            ):
                assert [x["index"] for x in row] == idx.tolist()
                np.testing.assert_allclose([x["value"] for x in row], val, rtol=1e-5, atol=1e-6)
            r = await c.post("/embed_all", json={"inputs": "x"})
            assert r.status_code == 404 and "SPLADE" in r.json()["error"]
        async with client(emb) as c:
            r = await c.post("/embed_all", json={"inputs": ["hello world", "a b c"]})
            assert r.status_code == 200, r.text
            for got, want in zip(r.json(), emb.encode(["hello world", "a b c"], output_value="token_embeddings"),
                                 strict=True):  # fmt: skip
                np.testing.assert_allclose(np.array(got), want, rtol=1e-5, atol=1e-6)
            r = await c.post("/v1/embeddings", json={"input": ["hello", "world"], "dimensions": 16})
            assert r.status_code == 200, r.text
            got = np.array([d["embedding"] for d in r.json()["data"]])
            want = emb.encode(["hello", "world"], truncate_dim=16, normalize_embeddings=True)
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
            for bad in (0, emb.spec.hidden + 1):
                r = await c.post("/v1/embeddings", json={"input": "x", "dimensions": bad})
                assert r.status_code == 400 and "dimensions" in r.text
            r = await c.post("/rerank", json={"query": "q", "texts": ["d"]})
            assert r.status_code == 404 and "embedding" in r.json()["error"]

    run(go())


def test_kserve_heads(ce3, head_ckpts):
    tok = zoi.compile(head_ckpts("bert", "tok", 7)[0], device="cpu")
    sp = zoi.compile(head_ckpts("bert", "mlm")[0], device="cpu")

    async def go():
        async with client(ce3) as c:
            name = c.svc.model_name
            meta = (await c.get(f"/v2/models/{name}")).json()
            assert meta["outputs"] == [{"name": "SCORES", "datatype": "FP32", "shape": [-1, 3]}]
            body = {"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [2, 2],
                                "data": ["what", "that", "a", "b"]}],
                    "parameters": {"raw_scores": True}}  # fmt: skip
            r = await c.post(f"/v2/models/{name}/infer", json=body)
            assert r.status_code == 200, r.text
            out = r.json()["outputs"][0]
            assert out["name"] == "SCORES" and out["shape"] == [2, 3]
            want = ce3.predict([("what", "that"), ("a", "b")])
            np.testing.assert_allclose(
                np.array(out["data"]).reshape(2, 3), want, rtol=1e-5, atol=1e-6
            )
            assert (await c.get(f"/v2/models/{name}/config")).json()["output"][0][
                "name"
            ] == "SCORES"
        async with client(tok) as c:
            name = c.svc.model_name
            body = {
                "inputs": [
                    {"name": "TEXT", "datatype": "BYTES", "shape": [2], "data": ["John lives", "a"]}
                ]
            }
            r = await c.post(f"/v2/models/{name}/infer", json=body)
            assert r.status_code == 200, r.text
            o = {x["name"]: x for x in r.json()["outputs"]}
            counts = o["TOKEN_COUNT"]["data"]
            lg = np.array(o["TOKEN_LOGITS"]["data"]).reshape(o["TOKEN_LOGITS"]["shape"])
            for i, want in enumerate(tok.predict_tokens(["John lives", "a"])):
                assert counts[i] == len(want)
                np.testing.assert_allclose(lg[i, : len(want)], want, rtol=1e-5, atol=1e-6)
                assert not lg[i, len(want) :].any()
        async with client(sp) as c:
            name = c.svc.model_name
            body = {"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [1], "data": ["hello"]}],
                    "outputs": [{"name": "SPARSE"}]}  # fmt: skip
            r = await c.post(f"/v2/models/{name}/infer", json=body)
            out = r.json()["outputs"][0]
            np.testing.assert_allclose(
                np.array(out["data"]), sp.encode_sparse("hello", dense=True), rtol=1e-5, atol=1e-6
            )
            body["outputs"] = [{"name": "EMBEDDING"}]
            assert (await c.post(f"/v2/models/{name}/infer", json=body)).status_code == 422

    run(go())
