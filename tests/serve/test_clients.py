"""Real clients against the real server: openai, tritonclient[http], TEI-style JSON, curl-like calls."""

from __future__ import annotations

import base64

import numpy as np
import pytest

from .serve_helpers import MODEL_NAME, cosine_rows, mixed_texts

httpx = pytest.importorskip("httpx")

TEXTS = [
    "A man is eating food.",
    "The girl is carrying a baby.",
    "hello",
    "Zoi serves embeddings over HTTP, batching requests from many clients into one engine call.",
] + mixed_texts(12, seed=3)


def test_openai_client_base64_default(server, engine):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    r = client.embeddings.create(model=MODEL_NAME, input=TEXTS)  # the client asks for base64
    got = np.array([d.embedding for d in r.data], dtype=np.float32)
    ref = engine.encode(TEXTS)
    assert got.shape == ref.shape == (len(TEXTS), 384)
    assert [d.index for d in r.data] == list(range(len(TEXTS)))
    assert cosine_rows(got, ref).min() >= 0.9999
    assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    assert r.model == MODEL_NAME
    ntok = sum(len(s) for s in engine.tokenize(TEXTS))
    assert r.usage.prompt_tokens == r.usage.total_tokens == ntok


def test_openai_client_float_and_single_string(server, engine):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    r = client.embeddings.create(
        model=MODEL_NAME, input="A man is eating food.", encoding_format="float"
    )
    assert len(r.data) == 1
    assert (
        cosine_rows(np.array(r.data[0].embedding), engine.encode("A man is eating food."))[()]
        >= 0.9999
    )


def test_openai_token_ids(server, engine):
    ids = [[int(x) for x in s] for s in engine.tokenize(TEXTS[:3])]
    r = httpx.post(
        server.url + "/v1/embeddings", json={"model": MODEL_NAME, "input": ids}, timeout=60
    )
    assert r.status_code == 200, r.text
    got = np.array([d["embedding"] for d in r.json()["data"]])
    assert cosine_rows(got, engine.encode(TEXTS[:3])).min() >= 0.9999
    r1 = httpx.post(
        server.url + "/v1/embeddings",
        json={"model": MODEL_NAME, "input": ids[0], "encoding_format": "base64"},
        timeout=60,
    )
    assert r1.status_code == 200, r1.text
    row = np.frombuffer(base64.b64decode(r1.json()["data"][0]["embedding"]), "<f4")
    assert cosine_rows(row, got[0])[()] >= 0.99999
    assert r1.json()["usage"]["prompt_tokens"] == len(ids[0])


def test_tritonclient_binary_defaults(server, engine):
    th = pytest.importorskip("tritonclient.http")
    client = th.InferenceServerClient(server.url.split("://", 1)[1])
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready(MODEL_NAME)
    meta = client.get_model_metadata(MODEL_NAME)
    assert meta["inputs"][0]["datatype"] == "BYTES" and meta["outputs"][0]["shape"] == [-1, 384]
    assert "binary_tensor_data" in client.get_server_metadata()["extensions"]
    inp = th.InferInput("TEXT", [len(TEXTS)], "BYTES")
    inp.set_data_from_numpy(
        np.array([t.encode() for t in TEXTS], dtype=np.object_)
    )  # binary by default
    ref = engine.encode(TEXTS)
    res = client.infer(MODEL_NAME, [inp], outputs=[th.InferRequestedOutput("EMBEDDING")])
    got = res.as_numpy("EMBEDDING")
    assert got.dtype == np.float32 and got.shape == ref.shape
    assert cosine_rows(got, ref).min() >= 0.9999
    # no outputs named: the client asks for every output in binary
    got2 = client.infer(MODEL_NAME, [inp]).as_numpy("EMBEDDING")
    assert np.array_equal(got, got2)
    client.close()


def test_tritonclient_json_tensors(server, engine):
    th = pytest.importorskip("tritonclient.http")
    client = th.InferenceServerClient(server.url.split("://", 1)[1])
    texts = TEXTS[:5]
    inp = th.InferInput("TEXT", [len(texts), 1], "BYTES")
    inp.set_data_from_numpy(np.array([[t] for t in texts], dtype=np.object_), binary_data=False)
    out = th.InferRequestedOutput("EMBEDDING", binary_data=False)
    got = client.infer(MODEL_NAME, [inp], outputs=[out], request_id="r-7").as_numpy("EMBEDDING")
    assert cosine_rows(got, engine.encode(texts)).min() >= 0.9999
    # gzip-compressed binary request, as `request_compression_algorithm` sends it
    inp2 = th.InferInput("TEXT", [len(texts)], "BYTES")
    inp2.set_data_from_numpy(np.array([t.encode() for t in texts], dtype=np.object_))
    got2 = client.infer(MODEL_NAME, [inp2], request_compression_algorithm="gzip").as_numpy(
        "EMBEDDING"
    )
    assert np.array_equal(got, got2)
    client.close()


def test_kserve_raw_json(server, engine):
    body = {
        "id": "abc",
        "inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [2], "data": TEXTS[:2]}],
        "parameters": {"normalize": False},
    }
    r = httpx.post(f"{server.url}/v2/models/{MODEL_NAME}/versions/1/infer", json=body, timeout=60)
    assert r.status_code == 200, r.text
    j = r.json()
    assert j["id"] == "abc" and j["model_name"] == MODEL_NAME
    out = j["outputs"][0]
    assert out["name"] == "EMBEDDING" and out["datatype"] == "FP32" and out["shape"] == [2, 384]
    got = np.array(out["data"], np.float32).reshape(2, 384)
    ref = engine.encode(TEXTS[:2], normalize_embeddings=False)
    assert cosine_rows(got, ref).min() >= 0.9999
    assert np.allclose(np.linalg.norm(got, axis=1), np.linalg.norm(ref, axis=1), rtol=1e-4)
    for path in (
        "/v2",
        "/v2/health/live",
        "/v2/health/ready",
        f"/v2/models/{MODEL_NAME}",
        f"/v2/models/{MODEL_NAME}/ready",
        f"/v2/models/{MODEL_NAME}/config",
    ):
        assert httpx.get(server.url + path).status_code == 200, path


def test_tei_embed_tokenize_info_health(server, engine):
    r = httpx.post(server.url + "/embed", json={"inputs": TEXTS}, timeout=60)
    assert r.status_code == 200, r.text
    for h in ("x-queue-time", "x-inference-time", "x-tokenization-time", "x-total-time"):
        assert float(r.headers[h]) >= 0.0
    assert float(r.headers["x-inference-time"]) > 0.0
    got = np.array(r.json(), np.float32)
    assert cosine_rows(got, engine.encode(TEXTS)).min() >= 0.9999
    # normalize=false gives the raw pooled vectors
    r = httpx.post(server.url + "/embed", json={"inputs": TEXTS[0], "normalize": False}, timeout=60)
    raw = np.array(r.json()[0])
    ref_raw = engine.encode(TEXTS[0], normalize_embeddings=False)
    assert abs(np.linalg.norm(raw) - np.linalg.norm(ref_raw)) < 1e-3 * np.linalg.norm(ref_raw)
    assert (
        abs(np.linalg.norm(raw) - 1.0) > 1e-2
    )  # MiniLM's raw mean-pooled vectors are not unit length

    r = httpx.post(server.url + "/tokenize", json={"inputs": ["Hello world"]})
    toks = r.json()[0]
    assert [t["id"] for t in toks] == [int(x) for x in engine.tokenize(["Hello world"])[0]]
    assert (
        toks[0]["special"]
        and toks[1]["text"] == "Hello"
        and (toks[1]["start"], toks[1]["stop"]) == (0, 5)
    )

    info = httpx.get(server.url + "/info").json()
    assert info["model_id"] == MODEL_NAME and info["max_input_length"] == 256
    assert info["model_dtype"] == "float32" and info["device"] in ("cpu", "reference")
    assert info["max_batch_tokens"] >= 256 and info["version"]
    assert httpx.get(server.url + "/health").status_code == 200
    assert httpx.get(server.url + "/v1/models").json()["data"][0]["id"] == MODEL_NAME


def test_truncation_and_long_inputs(server, engine):
    long = " ".join(mixed_texts(40, seed=5))  # well over 256 tokens, under the character cap
    assert len(engine.tokenize([long], truncate=True)[0]) == 256
    r = httpx.post(server.url + "/embed", json={"inputs": [long, "short"]}, timeout=60)
    assert r.status_code == 200
    assert cosine_rows(np.array(r.json()), engine.encode([long, "short"])).min() >= 0.9999
    r = httpx.post(server.url + "/embed", json={"inputs": [long], "truncate": False}, timeout=60)
    assert r.status_code == 413 and r.json()["error_type"] == "Validation"


def test_metrics_exposed(server):
    httpx.post(server.url + "/embed", json={"inputs": ["metrics please"]}, timeout=60)
    text = httpx.get(server.url + "/metrics").text
    for name in (
        "zoi_request_total",
        "zoi_request_success_total",
        "zoi_queue_size",
        "zoi_batch_size_bucket",
        "zoi_batch_tokens_bucket",
        "zoi_tokenization_duration_seconds_bucket",
        "zoi_queue_duration_seconds_bucket",
        "zoi_inference_duration_seconds_bucket",
        "zoi_request_failure_total",
    ):
        assert name in text, name


def test_tei_token_ids(server, engine):
    ids = [int(x) for x in engine.tokenize(["token ids in, embedding out"])[0]]
    r1 = httpx.post(server.url + "/embed", json={"inputs": ids}, timeout=60)
    r2 = httpx.post(server.url + "/embed", json={"inputs": [ids, ids[:3]]}, timeout=60)
    assert r1.status_code == 200 and r2.status_code == 200, (r1.text, r2.text)
    ref = engine.encode("token ids in, embedding out")
    assert cosine_rows(np.array(r1.json()[0]), ref)[()] >= 0.9999
    assert cosine_rows(np.array(r2.json()[0]), ref)[()] >= 0.9999 and len(r2.json()) == 2
