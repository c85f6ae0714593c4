"""Real clients against the real server: openai, tritonclient[http], TEI-style JSON, curl-like
calls; and the recipes of docs/CLIENTS.md (openai, cohere, LangChain, LlamaIndex,
sentence-transformers-style code), run as written."""

from __future__ import annotations

import base64
import re

import numpy as np
import pytest

from .serve_helpers import MODEL_NAME, REPO, cosine_rows, mixed_texts

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


# ---- the client recipes of docs/CLIENTS.md, run as written ------------------------------------
# Each marked block is executed against one `zoi serve` holding both of the page's models: a
# cross-encoder named as the page's reranker (random weights, first, so that TEI-style requests
# that name no model reach it) and the bundled MiniLM. The page's two addresses (8080 for
# embeddings, 8081 for rerank) both become this server's; nothing else in a block changes.

CLIENTS = (REPO / "docs" / "CLIENTS.md").read_text(encoding="utf-8")
RERANKER = "ms-marco-MiniLM-L-6-v2"
EMB_TEXTS = ["A man is eating food.", "A monkey is playing drums."]
DOCS = ["Paris is the capital of France.", "Bananas are yellow.", "Berlin is in Germany."]
QUERY = "capital of France"


def recipe(name: str) -> str:
    m = re.search(rf"<!-- tested: {re.escape(name)} -->\n```python\n(.*?)```", CLIENTS, re.S)
    assert m, f"docs/CLIENTS.md has no block marked {name!r}"
    return m.group(1)


def run_recipe(name: str, url: str, device: str = "cpu") -> dict:
    code = recipe(name)
    for port in ("8080", "8081"):
        code = code.replace(f"http://127.0.0.1:{port}", url)
    if device != "cpu":  # no native core built: the numpy reference engine
        code = code.replace("zoi.compile(folder)", f"zoi.compile(folder, device={device!r})")
    ns: dict = {"__name__": f"clients_{name}"}
    exec(compile(code, f"docs/CLIENTS.md[{name}]", "exec"), ns)  # noqa: S102 - the doc's code
    return ns


@pytest.fixture(scope="module")
def recipes(device, tmp_path_factory):
    pytest.importorskip("transformers")
    from tests.heads.builders import head_checkpoint

    from zoi.bench.loadtest import ServerProcess
    from zoi.engine import default_model_path

    ce, _ = head_checkpoint(tmp_path_factory.mktemp("ce") / RERANKER, "bert", "seq", num_labels=1)
    srv = ServerProcess(
        env={"ZOI_DEVICE": device, "ZOI_LOG_LEVEL": "warning"},
        args=[f"{RERANKER}={ce}", f"{MODEL_NAME}={default_model_path()}"],
        log_path=tmp_path_factory.mktemp("recipes") / "server.log",
    )
    yield srv, ce
    assert srv.stop() == 0, srv.log()[-3000:]


@pytest.fixture(scope="module")
def reranker(recipes, device):
    import zoi

    return zoi.compile(recipes[1], device=device)


def _unit(rows) -> np.ndarray:
    a = np.asarray(rows, np.float64)
    return a / np.linalg.norm(a, axis=-1, keepdims=True)


def _check_ranking(got: list[tuple[int, float]], reranker, top: int = 2):
    """(index, score) pairs against the in-process cross-encoder: each score its document's,
    best first (a random-weight model's scores are close, so ties are compared by score)."""
    want = {w["corpus_id"]: w["score"] for w in reranker.rerank(QUERY, DOCS)}
    assert len(got) == top
    for i, s in got:
        assert abs(s - want[i]) <= 1e-4, (got, want)
    scores = [s for _, s in got]
    assert scores == sorted(scores, reverse=True)
    assert min(scores) >= sorted(want.values(), reverse=True)[top - 1] - 1e-4


def test_recipe_openai(recipes, engine):
    pytest.importorskip("openai")
    ns = run_recipe("openai", recipes[0].url)
    ref = engine.encode(EMB_TEXTS)
    for key in ("vectors", "floats"):
        got = np.array(ns[key], np.float32)
        assert got.shape == (2, 384) and cosine_rows(got, ref).min() >= 0.9999, key
    assert ns["tokens"] == sum(len(s) for s in engine.tokenize(EMB_TEXTS))
    short = np.array(ns["short"])
    assert short.shape == (2, 128)
    assert np.allclose(short, _unit(ref[:, :128]), atol=1e-4)


def test_recipe_cohere(recipes, engine, reranker):
    pytest.importorskip("cohere")
    ns = run_recipe("cohere", recipes[0].url)
    ref = engine.encode(EMB_TEXTS)
    assert cosine_rows(np.array(ns["vectors"]), ref).min() >= 0.9999
    assert np.abs(np.array(ns["int8"]) - np.rint(ref * 127)).max() <= 1
    _check_ranking(ns["best"], reranker)


def test_recipe_langchain(recipes, engine):
    pytest.importorskip("langchain_openai")
    ns = run_recipe("langchain", recipes[0].url)
    assert cosine_rows(np.array(ns["docs"]), engine.encode(EMB_TEXTS)).min() >= 0.9999
    assert cosine_rows(np.array(ns["query"]), engine.encode("Someone is eating."))[()] >= 0.9999


def test_langchain_default_token_ids_are_refused_naming_the_setting(recipes, monkeypatch):
    """OpenAIEmbeddings' default sends tiktoken ids; zoi's 422 for those outside the vocabulary
    names the setting. tiktoken's vocabulary file is a download, so a stand-in encoding gives
    ids in its range (one past MiniLM's 30522)."""
    lc = pytest.importorskip("langchain_openai")
    import openai
    import tiktoken

    class Encoding:
        def encode_ordinary(self, text: str) -> list[int]:
            return [32, 1332, 31261]

        encode = encode_ordinary

    def get(*_a, **_k):
        return Encoding()

    monkeypatch.setattr(tiktoken, "encoding_for_model", get)
    monkeypatch.setattr(tiktoken, "get_encoding", get)
    emb = lc.OpenAIEmbeddings(
        model=MODEL_NAME, base_url=recipes[0].url + "/v1", api_key="unused", max_retries=0
    )
    with pytest.raises(openai.UnprocessableEntityError) as e:
        emb.embed_query("Someone is eating.")
    err = e.value.body if isinstance(e.value.body, dict) else {}
    err = err.get("error", err)
    assert err["param"] == "input" and err["code"] == "invalid_value", err
    assert "token id 31261, outside the vocabulary [0, 30522)" in err["message"], err
    assert "check_embedding_ctx_length=False" in err["message"], err
    # the page quotes the message
    assert " ".join(err["message"].split()) in " ".join(CLIENTS.split())


def test_recipe_llamaindex_embedding(recipes, engine):
    pytest.importorskip("llama_index.embeddings.openai_like")
    ns = run_recipe("llamaindex-embed", recipes[0].url)
    assert cosine_rows(np.array(ns["docs"]), engine.encode(EMB_TEXTS)).min() >= 0.9999
    assert cosine_rows(np.array(ns["query"]), engine.encode("Someone is eating."))[()] >= 0.9999


def test_recipe_llamaindex_rerank(recipes, reranker):
    pytest.importorskip("llama_index.postprocessor.jinaai_rerank")
    pytest.importorskip("llama_index.postprocessor.tei_rerank")
    ns = run_recipe("llamaindex-rerank", recipes[0].url)
    for key in ("best", "best_tei"):
        got = [(DOCS.index(n.node.get_content()), n.score) for n in ns[key]]
        _check_ranking(got, reranker)


def test_recipe_sentence_transformers(device):
    pytest.importorskip("sentence_transformers")
    torch = pytest.importorskip("torch")
    ns = run_recipe("sentence-transformers", "", device)
    emb, ref = ns["emb"], ns["reference"]
    assert emb.dtype == np.float32 and emb.shape == ref.shape == (2, 384) and ns["dim"] == 384
    assert np.abs(emb - ref).max() <= 1e-4 and cosine_rows(emb, ref).min() >= 0.99999
    assert isinstance(ns["tensor"], torch.Tensor)
    assert np.allclose(ns["tensor"].numpy(), emb, atol=1e-6)


def test_the_page_names_the_pinned_versions():
    """docs/CLIENTS.md's version table: each package at the version the test extra pins."""
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    pins = dict(
        re.match(r"([\w.-]+)(?:\[[^\]]*\])?==([\w.]+)", r).groups()
        for r in project["optional-dependencies"]["test"]
        if "==" in r
    )
    rows = re.findall(r"^\| `([\w.-]+)` \| ([\w.]+) \|", CLIENTS, re.M)
    assert len(rows) >= 6
    for name, version in rows:
        assert pins.get(name) == version, (name, version, pins.get(name))
