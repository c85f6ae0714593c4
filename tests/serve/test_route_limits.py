"""What a hostile client runs into on the embedding server's routes: a bound on answers of token
vectors (built off the event loop), fair slicing of big requests, token ids of any size, and
the small points of the contract (Retry-After, consistent counters, strict flags, one limit for
pairs).

Server behaviour is checked through real HTTP (`zoi serve` in a subprocess); the task-head
models, which need checkpoints built here, through the ASGI app.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import threading
import time

import numpy as np
import pytest

from zoi.bench.loadtest import ServerProcess

from .serve_helpers import MODEL_NAME, metric, serve_device

httpx = pytest.importorskip("httpx")

OPENAI = "/v1/embeddings"
INFER = f"/v2/models/{MODEL_NAME}/infer"
OUTPUT_LIMIT = 100_000  # --max-output-floats of the test server
LONG = "the river runs past an old mill where children play " * 40  # over 256 tokens


def post(server, path, body=None, content=None, headers=None, timeout=120):
    if content is None:
        content = json.dumps(body).encode()
    h = {"content-type": "application/json", **(headers or {})}
    return httpx.post(server.url + path, content=content, headers=h, timeout=timeout)


def metrics_text(server) -> str:
    return httpx.get(server.url + "/metrics").text


@pytest.fixture(scope="module")
def srv(device, tmp_path_factory):
    """MiniLM with batches of 256 tokens (a big request is many slices) and a low answer bound."""
    s = ServerProcess(
        env={
            "ZOI_DEVICE": device,
            "ZOI_LOG_LEVEL": "warning",
            "ZOI_MAX_BATCH_TOKENS": "256",
            "ZOI_MAX_OUTPUT_FLOATS": str(OUTPUT_LIMIT),
        },
        log_path=tmp_path_factory.mktemp("limits") / "server.log",
    )
    yield s
    rc = s.stop()
    assert rc == 0, f"server exited with {rc}:\n{s.log()[-3000:]}"


# ---- the answer bound ---------------------------------------------------------------------------
def test_embed_all_over_the_bound_is_413_before_the_model_runs(srv):
    inputs0 = metric(metrics_text(srv), "zoi_request_inputs_total")
    r = post(srv, "/embed_all", {"inputs": [LONG] * 4})
    assert r.status_code == 413, r.text
    body = r.json()
    assert body["error_type"] == "Validation"
    msg = body["error"]
    # 4 texts truncated to 256 tokens: 1,024 tokens x 384 dimensions
    assert "393,216 floats" in msg and "1,024 tokens x 384 dimensions" in msg, msg
    assert "100,000" in msg and "--max-output-floats" in msg, msg
    # the model never ran: its inputs are counted once it has
    assert metric(metrics_text(srv), "zoi_request_inputs_total") == inputs0
    info = httpx.get(srv.url + "/info").json()
    assert info["max_output_floats"] == OUTPUT_LIMIT


def test_embed_all_within_the_bound(srv, engine):
    texts = ["hello world", "a b c d e"]
    r = post(srv, "/embed_all", {"inputs": texts})
    assert r.status_code == 200, r.text
    want = engine.token_embeddings(texts)
    got = r.json()
    assert [len(g) for g in got] == [len(w) for w in want]
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(np.array(g, np.float32), w, rtol=1e-5, atol=1e-6)


def test_embed_all_truncation_off_is_still_413_for_long_texts(srv):
    r = post(srv, "/embed_all", {"inputs": ["short", LONG], "truncate": False})
    assert r.status_code == 413, r.text
    assert "truncat" in r.json()["error"]


def test_big_answers_are_serialised_in_pieces_off_the_event_loop(monkeypatch):
    from zoi.serve import handler
    from zoi.serve.http import dumps

    threads: list[str] = []
    real = handler.dumps

    def spy(obj):
        threads.append(threading.current_thread().name)
        return real(obj)

    monkeypatch.setattr(handler, "dumps", spy)
    rng = np.random.default_rng(0)
    rows = [rng.standard_normal((n, 384)).astype(np.float32) for n in (256, 200, 3)]
    big = {"object": "list", "data": [{"index": i, "embedding": r} for i, r in enumerate(rows)]}
    floats = sum(r.size for r in rows)
    resp = asyncio.run(handler.json_answer(big, floats, headers={"x-a": "1"}))
    assert resp.body == dumps(big) and resp.headers["x-a"] == "1"
    assert resp.headers["content-type"] == "application/json"
    assert len(threads) > 3 and all(t.startswith("zoi-answer") for t in threads), threads
    threads.clear()
    small = [rows[2]]
    assert asyncio.run(handler.json_answer(small, rows[2].size)).body == dumps(small)
    assert threads == []  # a small answer: serialised at once, on the loop


@pytest.mark.parametrize(
    "obj",
    [
        [],
        {},
        [np.zeros((0, 4), np.float32)],
        np.arange(200_001, dtype=np.float32) / 7,
        {"a": [np.ones((3, 70_000), np.float32), "x"], "b": None, "c": {"d": [1, 2.5]}},
        [[{"index": 1, "value": 0.5}], [], [{"index": 2, "value": 1.5}]],
        ("t", np.arange(6, dtype=np.int32).reshape(2, 3)),
    ],
)
def test_answer_pieces_join_to_the_whole(obj, monkeypatch):
    from zoi.serve import handler
    from zoi.serve.http import dumps

    monkeypatch.setattr(handler, "PIECE_FLOATS", 1000)  # many pieces
    out: list[bytes] = []
    handler.dumps_pieces(obj, out)
    assert b"".join(out) == dumps(obj)


# ---- fair slicing -------------------------------------------------------------------------------
def test_small_request_is_not_queued_behind_a_big_one(srv, device):
    big = [f"{i} {LONG}" for i in range(24)]  # 24 texts of 256 tokens: 24 slices of 256
    small = ["A man is eating food."]
    done: list[str] = []
    answers: dict[str, httpx.Response] = {}

    def send(name, texts):
        answers[name] = post(srv, "/embed", {"inputs": texts})
        done.append(name)

    t_big = threading.Thread(target=send, args=("big", big))
    t_big.start()
    t0 = time.monotonic()
    while metric(metrics_text(srv), "zoi_queue_tokens") == 0:  # the big one is queued
        assert t_big.is_alive(), answers["big"].text
        assert time.monotonic() - t0 < 60, "the big request never queued"
        time.sleep(0.01)
    t_small = threading.Thread(target=send, args=("small", small))
    t_small.start()
    t_small.join(300)
    t_big.join(300)
    assert answers["big"].status_code == 200 and answers["small"].status_code == 200
    assert done == ["small", "big"]
    # the rows are those of each text sent alone (the engine computes each sequence alone)
    alone = [np.array(post(srv, "/embed", {"inputs": [t]}).json()[0], np.float32) for t in big]
    got = np.array(answers["big"].json(), np.float32)
    small_alone = np.array(post(srv, "/embed", {"inputs": small}).json(), np.float32)
    if device == "cpu":
        assert np.array_equal(got, np.stack(alone))
        assert np.array_equal(np.array(answers["small"].json(), np.float32), small_alone)
    else:  # the numpy reference engine: BLAS may round differently by batch shape
        np.testing.assert_allclose(got, np.stack(alone), rtol=1e-5, atol=1e-6)


# ---- token ids ----------------------------------------------------------------------------------
BAD_IDS = [
    [101, 2**63],
    [[101, 2**63, 102]],
    [101, 2**64 - 1],
    [[101], [-(2**63) - 1]],  # past 64 bits: a float once parsed
    [101, -1],
    [[101, 30522]],
    [101, 1.5],
    [[101, 2.0]],
    [101, True],
    [[False, 102]],
]


@pytest.mark.parametrize("ids", BAD_IDS, ids=[json.dumps(x)[:30] for x in BAD_IDS])
def test_token_ids_outside_the_vocabulary_are_422_in_each_shape(srv, ids):
    r = post(srv, OPENAI, {"input": ids, "model": MODEL_NAME})
    assert r.status_code == 422, r.text
    err = r.json()["error"]
    assert err["param"] == "input" and err["code"] == "invalid_value", err
    assert err["type"] == "invalid_request_error" and "token id" in err["message"], err
    r = post(srv, "/embed", {"inputs": ids})
    assert r.status_code == 422, r.text
    body = r.json()
    assert body["error_type"] == "Validation" and "token id" in body["error"], body
    assert re.search(r"inputs(\[\d+\])+ is ", body["error"]), body  # names the element


def test_big_integers_in_kserve_requests_are_422(srv):
    text = {"name": "TEXT", "datatype": "BYTES", "shape": [1], "data": ["a"]}
    for tensor in (
        {**text, "shape": [2**63]},
        {**text, "shape": [2**64 - 1, 1]},
        {**text, "shape": [-1]},
        {**text, "shape": [1.5]},
        {**text, "shape": [True]},
        {**text, "data": [2**63]},
        {**text, "datatype": "INT64", "data": [2**63]},
        {**text, "data": None, "parameters": {"binary_data_size": 2**63}},
    ):
        r = post(srv, INFER, {"inputs": [tensor]})
        assert r.status_code == 422, (tensor, r.text)
        assert set(r.json()) == {"error"}, r.text
    r = post(srv, INFER, content=b'{"inputs": []}', headers={
        "inference-header-content-length": str(2**63)})  # fmt: skip
    assert r.status_code == 422, r.text


# ---- the small points ---------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["", 0, [], {}, "FLOAT", True, "hex"])
def test_encoding_format_other_than_float_or_base64_is_422(srv, fmt):
    r = post(srv, OPENAI, {"input": "a", "encoding_format": fmt})
    assert r.status_code == 422, r.text
    err = r.json()["error"]
    assert err["param"] == "encoding_format", err
    assert '"float"' in err["message"] and '"base64"' in err["message"], err


def test_encoding_format_absent_or_null_is_float(srv):
    for body in ({"input": "a"}, {"input": "a", "encoding_format": None}):
        r = post(srv, OPENAI, body)
        assert r.status_code == 200 and len(r.json()["data"][0]["embedding"]) == 384


def kserve_body(**params):
    body = {"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [1], "data": ["hello"]}]}
    if params:
        body["parameters"] = params
    return body


@pytest.mark.parametrize("flag", ["no", "false", 0, 1, None, [], {}])
def test_kserve_binary_data_output_takes_only_a_boolean(srv, flag):
    r = post(srv, INFER, kserve_body(binary_data_output=flag))
    assert r.status_code == 422, r.text
    assert "binary_data_output should be true or false" in r.json()["error"]
    body = kserve_body()
    body["outputs"] = [{"name": "EMBEDDING", "parameters": {"binary_data": flag}}]
    r = post(srv, INFER, body)
    assert r.status_code == 422, r.text
    assert "binary_data should be true or false" in r.json()["error"]


def test_kserve_binary_data_output_booleans(srv):
    r = post(srv, INFER, kserve_body(binary_data_output=True))
    assert r.status_code == 200 and r.headers["content-type"] == "application/octet-stream"
    hl = int(r.headers["inference-header-content-length"])
    assert len(r.content) - hl == 384 * 4
    r = post(srv, INFER, kserve_body(binary_data_output=False))
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    assert len(r.json()["outputs"][0]["data"]) == 384


def route_counts(text: str, route: str) -> tuple[float, float, float]:
    """(requests, successes, failures of every status) of one route label."""
    req = metric(text, "zoi_request_total", f'route="{route}"')
    ok = metric(text, "zoi_request_success_total", f'route="{route}"')
    fail = sum(
        float(v)
        for v in re.findall(
            rf'^zoi_request_failure_total\{{route="{route}",status="\d+"\}} (\S+)$', text, re.M
        )
    )
    return req, ok, fail


def test_requests_are_successes_plus_failures_also_before_admission(srv):
    before = metrics_text(srv)
    r = post(srv, "/v2/models/nope/infer", kserve_body())
    assert r.status_code == 404, r.text
    r = post(srv, "/embed", content=b"x" * 2_000_001)  # over the payload limit
    assert r.status_code == 413, r.text
    after = metrics_text(srv)
    for route, status in (("kserve", "404"), ("tei", "413")):
        r0, r1 = route_counts(before, route), route_counts(after, route)
        assert r1[0] - r0[0] == 1, (route, r0, r1)
        lab = f'route="{route}",status="{status}"'
        assert metric(after, "zoi_request_failure_total", lab) == (
            metric(before, "zoi_request_failure_total", lab) + 1
        )
    for route in ("openai", "tei", "kserve", "tokenize", "heads"):
        req, ok, fail = route_counts(after, route)
        assert req == ok + fail, (route, req, ok, fail)


@pytest.fixture(scope="module")
def one_slot(device, tmp_path_factory):
    """One request slot, held 3 s in the queue by a queue delay."""
    s = ServerProcess(
        env={
            "ZOI_DEVICE": device,
            "ZOI_LOG_LEVEL": "warning",
            "ZOI_MAX_CONCURRENT_REQUESTS": "1",
            "ZOI_MAX_QUEUE_DELAY_US": "3000000",
        },
        log_path=tmp_path_factory.mktemp("one-slot") / "server.log",
    )
    yield s
    s.stop()


def test_429_says_retry_after_on_every_embedding_route(one_slot):
    held = threading.Thread(target=post, args=(one_slot, "/embed", {"inputs": ["held"]}))
    held.start()
    t0 = time.monotonic()
    while httpx.get(one_slot.url + "/health").status_code == 200:  # until the slot is taken
        assert time.monotonic() - t0 < 30, "the held request was never admitted"
        time.sleep(0.01)
    answers = {
        "tei": post(one_slot, "/embed", {"inputs": ["x"]}),
        "openai": post(one_slot, OPENAI, {"input": "x"}),
        "kserve": post(one_slot, INFER, kserve_body()),
    }
    held.join(60)
    for shape, r in answers.items():
        assert r.status_code == 429, (shape, r.text)
        assert r.headers.get("retry-after") == "1", (shape, r.headers)
    assert answers["tei"].json()["error_type"] == "Overloaded"
    assert answers["openai"].json()["error"]["type"] == "rate_limit_error"
    assert set(answers["kserve"].json()) == {"error"}


# ---- task heads (through the ASGI app) ----------------------------------------------------------
@pytest.fixture(scope="module")
def heads(tmp_path_factory):
    """task -> engine of a small random checkpoint (built on first use)."""
    import zoi

    made = {}

    def get(task: str):
        if task not in made:
            from tests.heads.builders import head_checkpoint

            labels = {"seq": 1, "tok": 7, "mlm": 3}[task]
            folder = head_checkpoint(tmp_path_factory.mktemp(task), "bert", task, labels, 0)[0]
            made[task] = zoi.compile(folder, device=serve_device())
        return made[task]

    return get


@contextlib.asynccontextmanager
async def client(engine, **cfg):
    from zoi.serve.app import create_app
    from zoi.serve.config import ServeConfig
    from zoi.serve.service import Service

    svc = Service(engine, ServeConfig(**cfg))
    try:
        transport = httpx.ASGITransport(app=create_app(svc))
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            c.svc = svc
            yield c
    finally:
        svc.close()


def test_cohere_rerank_model_of_a_wrong_type_is_422(heads):
    async def go():
        async with client(heads("seq")) as c:
            body = {"query": "q", "documents": ["a", "b"]}
            for model in (5, ["x"], {"a": 1}, True):
                r = await c.post("/v1/rerank", json={**body, "model": model})
                assert r.status_code == 422 and "model should be a string" in r.text, r.text
            r = await c.post("/v1/rerank", json={**body, "model": "other"})
            assert r.status_code == 404, r.text
            r = await c.post("/v1/rerank", json={**body, "model": c.svc.model_name})
            assert r.status_code == 200, r.text

    asyncio.run(go())


def test_pairs_share_one_limit_on_every_route(heads):
    n = 6  # pairs, under --max-client-batch-size 8 (but 12 texts)

    async def go():
        async with client(heads("seq"), max_client_batch_size=8) as c:
            name = c.svc.model_name
            pairs = [["q", f"doc {i}"] for i in range(n)]
            tensor = {"name": "TEXT", "datatype": "BYTES", "shape": [n, 2],
                      "data": [x for p in pairs for x in p]}  # fmt: skip
            r = await c.post(f"/v2/models/{name}/infer", json={"inputs": [tensor]})
            assert r.status_code == 200, r.text
            assert r.json()["outputs"][0]["shape"] == [n, 1]
            r = await c.post("/predict", json={"inputs": pairs})
            assert r.status_code == 200 and len(r.json()) == n, r.text
            over = [["q", f"doc {i}"] for i in range(9)]
            tensor = {**tensor, "shape": [9, 2], "data": [x for p in over for x in p]}
            r = await c.post(f"/v2/models/{name}/infer", json={"inputs": [tensor]})
            assert r.status_code == 413, r.text
            msg = r.json()["error"]
            assert "9 pairs" in msg and "8 (--max-client-batch-size)" in msg, msg
            docs = [f"doc {i}" for i in range(9)]
            for path, body in (
                ("/rerank", {"query": "q", "texts": docs}),
                ("/v1/rerank", {"query": "q", "documents": docs}),
                ("/predict", {"inputs": over}),
            ):
                r = await c.post(path, json=body)
                assert r.status_code == 413, (path, r.text)
                assert "8 (--max-client-batch-size)" in r.json()["error"], (path, r.text)

    asyncio.run(go())


def test_kserve_token_and_vocabulary_outputs_are_bounded(heads):
    tok, sp = heads("tok"), heads("mlm")
    text = {"name": "TEXT", "datatype": "BYTES", "shape": [2], "data": ["a b", LONG[:1000]]}

    async def go():
        async with client(tok, max_output_floats=300) as c:
            url = f"/v2/models/{c.svc.model_name}/infer"
            r = await c.post(url, json={"inputs": [text]})
            assert r.status_code == 413, r.text
            msg = r.json()["error"]
            longest = c.svc.max_positions  # LONG is truncated to the positions
            assert f"2 texts x {longest} tokens (the longest) x 7 labels" in msg, msg
            assert "--max-output-floats" in msg, msg
            r = await c.post(url, json={"inputs": [{**text, "shape": [1], "data": ["a b"]}]})
            assert r.status_code == 200, r.text
        vocab = sp.spec.vocab_size
        async with client(sp, max_output_floats=vocab + 1) as c:
            url = f"/v2/models/{c.svc.model_name}/infer"
            r = await c.post(url, json={"inputs": [text]})
            assert r.status_code == 413, r.text
            assert f"2 texts x {vocab} vocabulary entries" in r.json()["error"], r.text
            r = await c.post(url, json={"inputs": [{**text, "shape": [1], "data": ["a b"]}]})
            assert r.status_code == 200, r.text

    asyncio.run(go())


def test_embed_all_does_not_run_the_model_over_the_bound(engine, monkeypatch):
    def boom(*a, **k):
        raise AssertionError("the model ran")

    monkeypatch.setattr(engine, "token_embeddings", boom)

    async def go():
        async with client(engine, max_output_floats=384 * 5) as c:
            r = await c.post("/embed_all", json={"inputs": ["one two three four five six"]})
            assert r.status_code == 413, r.text
            assert "8 tokens x 384 dimensions" in r.json()["error"], r.text

    asyncio.run(go())
