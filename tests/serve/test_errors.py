"""Every bad request gets its status code and body shape, and the server keeps serving."""

from __future__ import annotations

import gzip
import json
import threading
import time

import numpy as np
import pytest

from zoi.bench.loadtest import ServerProcess

from .serve_helpers import FAIL_TOKEN, MODEL_NAME, SlowUpload, cosine_rows, metric

httpx = pytest.importorskip("httpx")

OPENAI = "/v1/embeddings"
INFER = f"/v2/models/{MODEL_NAME}/infer"


def post(server, path, body=None, content=None, headers=None, timeout=60):
    if content is None:
        content = json.dumps(body).encode()
    h = {"content-type": "application/json", **(headers or {})}
    return httpx.post(server.url + path, content=content, headers=h, timeout=timeout)


def assert_openai_error(r, status, param=None):
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["message"] and err["type"]
    if param:
        assert err["param"] == param


def assert_alive(server):
    assert httpx.get(server.url + "/health").status_code == 200
    r = post(server, "/embed", {"inputs": ["still serving"]})
    assert r.status_code == 200 and len(r.json()[0]) == 384


@pytest.mark.parametrize(
    "path,content",
    [
        (OPENAI, b"{not json"),
        ("/embed", b"{not json"),
        (INFER, b"{not json"),
        (OPENAI, b'{"model": "%s"}' % MODEL_NAME.encode()),  # no input
        (OPENAI, b'{"input": 5}'),
        (OPENAI, b'{"input": [1, "a"]}'),
        (OPENAI, b'{"input": [[1, 2], [3.5]]}'),
        (OPENAI, b'{"input": "a", "encoding_format": "hex"}'),
        (OPENAI, b"[1, 2]"),
        ("/embed", b'{"inputs": {"a": 1}}'),
        ("/embed", b'{"inputs": ["a", 3]}'),
        ("/embed", b'{"inputs": "a", "normalize": "yes"}'),
        ("/embed", b"{}"),
        (INFER, b'{"inputs": [{"name": "TEXT", "datatype": "FP32", "shape": [1], "data": [1.0]}]}'),
        (
            INFER,
            b'{"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [3], "data": ["a", "b"]}]}',
        ),
        (
            INFER,
            b'{"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [1], "data": ["a"]}],'
            b' "outputs": [{"name": "NOPE"}]}',
        ),
    ],
)
def test_validation_422(server, path, content):
    r = post(server, path, content=content)
    assert r.status_code == 422, (path, content, r.text)
    assert "error" in r.json()


def test_token_ids_out_of_vocab_422(server):
    assert_openai_error(
        post(server, OPENAI, {"model": MODEL_NAME, "input": [[101, 10**6, 102]]}), 422, "input"
    )
    assert_openai_error(post(server, OPENAI, {"model": MODEL_NAME, "input": [[-1]]}), 422, "input")


def test_binary_tensor_errors_422(server):
    head = json.dumps(
        {
            "inputs": [
                {
                    "name": "TEXT",
                    "datatype": "BYTES",
                    "shape": [1],
                    "parameters": {"binary_data_size": 50},
                }
            ]
        }
    ).encode()
    raw = (5).to_bytes(4, "little") + b"hello"
    r = post(
        server,
        INFER,
        content=head + raw,
        headers={"Inference-Header-Content-Length": str(len(head))},
    )
    assert r.status_code == 422 and "binary" in r.json()["error"]
    head = json.dumps(
        {
            "inputs": [
                {
                    "name": "TEXT",
                    "datatype": "BYTES",
                    "shape": [1],
                    "parameters": {"binary_data_size": 9},
                }
            ]
        }
    ).encode()
    bad = (99).to_bytes(4, "little") + b"hello"
    r = post(
        server,
        INFER,
        content=head + bad,
        headers={"Inference-Header-Content-Length": str(len(head))},
    )
    assert r.status_code == 422
    r = post(
        server, INFER, content=head + raw, headers={"Inference-Header-Content-Length": "99999"}
    )
    assert r.status_code == 422


@pytest.mark.parametrize(
    "path,body",
    [
        (OPENAI, {"model": MODEL_NAME, "input": ""}),
        (OPENAI, {"model": MODEL_NAME, "input": []}),
        (OPENAI, {"model": MODEL_NAME, "input": ["a", ""]}),
        (OPENAI, {"model": MODEL_NAME, "input": [[]]}),
        ("/embed", {"inputs": ""}),
        ("/embed", {"inputs": []}),
        (INFER, {"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [0], "data": []}]}),
        (INFER, {"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [1], "data": [""]}]}),
    ],
)
def test_empty_400(server, path, body):
    r = post(server, path, body)
    assert r.status_code == 400, r.text


def test_unknown_model_404_and_bad_dimensions_400(server):
    assert_openai_error(post(server, OPENAI, {"model": "gpt-nope", "input": "a"}), 404, "model")
    assert post(server, "/v2/models/nope/infer", {"inputs": []}).status_code == 404
    assert httpx.get(server.url + "/v2/models/nope/ready").status_code == 404
    assert_openai_error(
        post(server, OPENAI, {"model": MODEL_NAME, "input": "a", "dimensions": 385}),
        400,
        "dimensions",
    )


def test_too_large_413(server):
    info = httpx.get(server.url + "/info").json()
    # body over the payload limit (declared length), on each protocol
    big = json.dumps({"inputs": ["x" * 1000] * (info["payload_limit"] // 1000 + 10)}).encode()
    for path in ("/embed", OPENAI, INFER):
        r = post(server, path, content=big)
        assert r.status_code == 413, (path, r.text)
    # chunked upload (no Content-Length) over the limit
    r = httpx.post(
        server.url + "/embed",
        content=iter([big[i : i + 65536] for i in range(0, len(big), 65536)]),
        headers={"content-type": "application/json"},
        timeout=60,
    )
    assert r.status_code == 413
    # a gzip bomb: small on the wire, over the limit once inflated
    bomb = gzip.compress(b'{"inputs": ["' + b"a" * (info["payload_limit"] + 10) + b'"]}')
    assert len(bomb) < info["payload_limit"]
    r = post(server, "/embed", content=bomb, headers={"content-encoding": "gzip"})
    assert r.status_code == 413
    # more inputs than --max-client-batch-size
    r = post(
        server, OPENAI, {"model": MODEL_NAME, "input": ["a"] * (info["max_client_batch_size"] + 1)}
    )
    assert_openai_error(r, 413, "input")
    # an input over the character cap, rejected before tokenising
    r = post(server, "/embed", {"inputs": ["word " * (info["max_input_chars"] // 5 + 1)]})
    assert r.status_code == 413 and "characters" in r.json()["error"]
    # token ids over the model's positions with truncation off
    r = post(server, "/embed", {"inputs": [[101] * 300], "truncate": False})
    assert r.status_code == 413
    assert_alive(server)


def test_gzip_request_accepted(server, engine):
    body = gzip.compress(json.dumps({"inputs": ["compressed request"]}).encode())
    r = post(server, "/embed", content=body, headers={"content-encoding": "gzip"})
    assert r.status_code == 200
    assert cosine_rows(np.array(r.json()[0]), engine.encode("compressed request"))[()] >= 0.9999


def test_engine_failure_500_only_for_that_request(server, engine):
    """The injected fault fails every engine call holding token 1; the batch is retried per request."""
    texts = [f"request number {i} in a batch with a poisoned neighbour" for i in range(24)]
    ref = engine.encode(texts)
    results: dict = {}

    def good(i):
        results[i] = post(server, "/embed", {"inputs": [texts[i]]})

    def bad(i):
        results[("bad", i)] = post(
            server, OPENAI, {"model": MODEL_NAME, "input": [[101, FAIL_TOKEN, 102]]}
        )

    threads = [threading.Thread(target=good, args=(i,)) for i in range(24)]
    threads += [threading.Thread(target=bad, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in range(3):
        assert_openai_error(results[("bad", i)], 500)
        assert "engine" in results[("bad", i)].json()["error"]["message"]
    for i in range(24):
        assert results[i].status_code == 200, results[i].text
        assert cosine_rows(np.array(results[i].json()[0]), ref[i])[()] >= 0.9999
    text = httpx.get(server.url + "/metrics").text
    assert metric(text, "zoi_request_failure_total", 'route="openai",status="500"') >= 3
    assert_alive(server)


def test_client_gone_is_dropped(tight):
    """A request whose client leaves while it waits in the queue is dropped, not computed.

    The tight server's 1.5 s queue delay holds the request in the queue (the batcher slices
    big requests, so a request never waits long behind another one)."""
    url = tight.url
    before = metric(httpx.get(url + "/metrics").text, "zoi_dropped_requests_total")
    inputs0 = metric(httpx.get(url + "/metrics").text, "zoi_request_inputs_total")
    gone = SlowUpload(url, "/embed", {"inputs": ["nobody will read this answer"]}, split=10)
    gone.sock.sendall(gone.data[gone.split :])  # a complete request ...
    deadline = time.time() + 60
    while metric(httpx.get(url + "/metrics").text, "zoi_request_inputs_total") < inputs0 + 1:
        assert time.time() < deadline, "the server never queued the request"
        time.sleep(0.02)  # ... queued, held by the queue delay
    gone.abort()  # ... whose client leaves before the answer
    deadline = time.time() + 10
    while time.time() < deadline:
        now = metric(httpx.get(url + "/metrics").text, "zoi_dropped_requests_total")
        if now >= before + 1:
            break
        time.sleep(0.1)
    assert now == before + 1
    assert_alive(tight)


# ---- a server with tight limits: 429 and graceful shutdown -------------------------------------
@pytest.fixture(scope="module")
def tight(device, tmp_path_factory):
    srv = ServerProcess(
        args=[
            "--max-concurrent-requests",
            "2",
            "--payload-limit",
            "4000",
            "--max-client-batch-size",
            "4",
            "--no-auto-truncate",
            "--max-queue-delay-us",
            "1500000",
        ],
        env={"ZOI_DEVICE": device, "ZOI_LOG_LEVEL": "warning", "ZOI_MAX_INPUT_CHARS": "1000"},
        log_path=tmp_path_factory.mktemp("tight") / "server.log",
    )
    yield srv
    srv.stop()


def test_limits_from_flags_and_env(tight):
    info = httpx.get(tight.url + "/info").json()
    assert info["max_concurrent_requests"] == 2 and info["payload_limit"] == 4000
    assert info["max_client_batch_size"] == 4 and info["max_input_chars"] == 1000
    assert info["auto_truncate"] is False
    assert post(tight, "/embed", {"inputs": ["a"] * 5}).status_code == 413
    assert post(tight, "/embed", {"inputs": ["a " * 600]}).status_code == 413


def test_overloaded_429(tight):
    # two uploads stalled mid-body hold no request slot: the body is read before admission
    slow = [SlowUpload(tight.url, "/embed", {"inputs": [f"held open {i}"]}) for i in range(2)]
    time.sleep(0.3)
    assert post(tight, "/embed", {"inputs": ["a slot is free"]}).status_code == 200
    # two complete requests held in the queue (1.5 s queue delay) take both slots
    held: dict = {}
    threads = [
        threading.Thread(
            target=lambda i=i: held.__setitem__(i, post(tight, "/embed", {"inputs": [f"q {i}"]}))
        )
        for i in range(2)
    ]
    for t in threads:
        t.start()
    deadline = time.time() + 30
    while time.time() < deadline:  # both admitted
        m = httpx.get(tight.url + "/metrics").text
        if metric(m, "zoi_requests_in_flight") >= 2:
            break
        time.sleep(0.02)
    r = post(tight, OPENAI, {"model": MODEL_NAME, "input": "one too many"})
    assert_openai_error(r, 429)
    r = post(tight, "/embed", {"inputs": ["one too many"]})
    assert r.status_code == 429 and r.json()["error_type"] == "Overloaded"
    for t in threads:
        t.join()
    assert [held[i].status_code for i in range(2)] == [200, 200]
    for s in slow:
        status, body = s.finish()
        assert status == 200 and len(json.loads(body)[0]) == 384
    assert post(tight, "/embed", {"inputs": ["room again"]}).status_code == 200
    assert (
        metric(
            httpx.get(tight.url + "/metrics").text,
            "zoi_request_failure_total",
            'route="tei",status="429"',
        )
        == 1
    )


def test_graceful_shutdown_answers_in_flight(tight):
    """SIGTERM while requests are in flight: they are answered, then the server exits 0."""
    slow = SlowUpload(tight.url, "/embed", {"inputs": ["answered during shutdown"]})
    time.sleep(0.3)
    tight.proc.send_signal(15)
    time.sleep(0.5)
    assert tight.proc.poll() is None  # still running: a request is in flight
    status, body = slow.finish()
    assert status == 200 and len(json.loads(body)[0]) == 384
    tight.proc.wait(60)
    assert tight.proc.returncode == 0, tight.log()
    assert "stopped (SIGTERM)" in tight.log()


def test_client_leaving_mid_upload(server):
    before = metric(
        httpx.get(server.url + "/metrics").text,
        "zoi_request_failure_total",
        'route="tei",status="499"',
    )
    s = SlowUpload(server.url, "/embed", {"inputs": ["half a body"]}, split=8)
    time.sleep(0.2)
    s.abort()
    deadline = time.time() + 10
    while time.time() < deadline:
        now = metric(
            httpx.get(server.url + "/metrics").text,
            "zoi_request_failure_total",
            'route="tei",status="499"',
        )
        if now == before + 1:
            break
        time.sleep(0.05)
    assert now == before + 1
    assert "Traceback" not in server.log()
    assert_alive(server)


def test_sigterm_answers_everything_queued(device, tmp_path):
    """SIGTERM with 40 requests queued in the batcher: every one gets its answer, then exit 0.

    A 2 s queue delay holds each batch open (40 sequences fill neither budget), so requests are
    still queued when the signal comes, however fast the engine is.
    """
    srv = ServerProcess(
        env={"ZOI_DEVICE": device, "ZOI_LOG_LEVEL": "warning"},
        log_path=tmp_path / "log",
        args=["--max-queue-delay-us", "2000000", "--max-batch-requests", "256"],
    )
    try:
        texts = [
            f"request {i}: " + "the server drains its queue before it exits. " * (2 + i % 6)
            for i in range(40)
        ]
        results: dict = {}

        def send(i):
            results[i] = post(srv, "/embed", {"inputs": [texts[i]]}, timeout=120)

        threads = [threading.Thread(target=send, args=(i,)) for i in range(40)]
        for t in threads:
            t.start()
        deadline = time.time() + 60
        while time.time() < deadline:  # every request admitted and handed to the batcher
            if metric(httpx.get(srv.url + "/metrics").text, "zoi_request_inputs_total") >= 40:
                break
            time.sleep(0.01)
        queued = metric(httpx.get(srv.url + "/metrics").text, "zoi_queue_size")
        srv.proc.send_signal(15)
        for t in threads:
            t.join()
        assert srv.proc.wait(60) == 0, srv.log()
        assert all(results[i].status_code == 200 for i in range(40)), [
            results[i].status_code for i in range(40)
        ]
        assert all(len(results[i].json()[0]) == 384 for i in range(40))
        assert queued >= 1  # requests were still waiting for the engine when the signal came
    finally:
        srv.stop()


def test_shutdown_log_tells_the_truth(device, tmp_path):
    """A request cut off by the graceful timeout is reported as such, not as answered."""
    srv = ServerProcess(
        env={"ZOI_DEVICE": device, "ZOI_LOG_LEVEL": "warning"},
        log_path=tmp_path / "log",
        args=["--max-queue-delay-us", "8000000", "--graceful-timeout", "1"],
    )
    try:
        out: dict = {}
        t = threading.Thread(
            target=lambda: out.setdefault("r", post(srv, "/embed", {"inputs": ["slow"]}))
        )
        t.start()
        deadline = time.time() + 30
        while time.time() < deadline:
            if metric(httpx.get(srv.url + "/metrics").text, "zoi_request_inputs_total") >= 1:
                break
            time.sleep(0.02)
        srv.proc.send_signal(15)
        t.join(60)
        srv.proc.wait(60)
        log = srv.log()
        assert out["r"].status_code == 500
        line = [ln for ln in log.splitlines() if "zoi serve: stopped" in ln][-1]
        assert "1 cut off unanswered" in line and "graceful timeout 1 s" in line, line
        assert "every admitted request was answered" not in log
    finally:
        srv.stop()
