"""Several models behind one `zoi serve` (zoi.serve.multi): routed by "model" or the KServe path,
each answer equal to its own engine's, unknown names refused with the served list, metrics per
model, and the memory check before any compile."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import urllib.error
import urllib.request

import numpy as np
import pytest

from zoi.bench.loadtest import ServerProcess

from .serve_helpers import serve_device


def _post(url: str, body, headers: dict | None = None, raw: bytes | None = None):
    data = raw if raw is not None else json.dumps(body).encode()
    req = urllib.request.Request(
        url, data=data, headers={"content-type": "application/json", **(headers or {})}
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def _get(url: str):
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    """The bundled MiniLM as `emb` and a random-init BERT cross-encoder (hidden 40) as `ce`."""
    pytest.importorskip("transformers")
    from tests.heads.builders import head_checkpoint

    from zoi.engine import default_model_path

    folder, _ = head_checkpoint(tmp_path_factory.mktemp("ce"), "bert", "seq", num_labels=1)
    emb = str(default_model_path())
    log = tmp_path_factory.mktemp("multi") / "server.log"
    srv = ServerProcess(
        env={"ZOI_DEVICE": serve_device(), "ZOI_LOG_LEVEL": "warning"},
        args=[f"emb={emb}", f"ce={folder}"],
        log_path=log,
    )
    yield srv, emb, str(folder)
    rc = srv.stop()
    assert rc == 0, srv.log()[-3000:]


def test_routes_by_model_and_each_answer_is_its_engines(two):
    import zoi

    srv, emb, ce = two
    texts = ["a first sentence", "and a second, longer one about something else entirely"]
    st, out = _post(srv.url + "/v1/embeddings", {"model": "emb", "input": texts})
    assert st == 200, out
    got = np.array([d["embedding"] for d in out["data"]], np.float32)
    want = zoi.compile(emb, device=serve_device()).encode(texts)
    assert got.shape == (2, 384) and out["model"] == "emb"
    assert np.abs(got - want).max() <= 1e-5
    # TEI /embed names no model: the first one answers
    st, out = _post(srv.url + "/embed", {"inputs": texts})
    assert st == 200 and np.abs(np.array(out, np.float32) - want).max() <= 1e-5
    # the cross-encoder, by name, on the rerank route; equal to its engine in-process
    eng = zoi.compile(ce, device=serve_device())
    q, docs = "what is the capital of france?", ["Paris is in France.", "bananas", "Paris"]
    st, out = _post(srv.url + "/rerank", {"model": "ce", "query": q, "texts": docs})
    assert st == 200, out
    scores = {r["index"]: r["score"] for r in out}
    want_s = np.asarray(eng.predict([(q, d) for d in docs]), np.float64).reshape(-1)
    np.testing.assert_allclose([scores[i] for i in range(3)], want_s, rtol=1e-4, atol=1e-5)
    # a gzip body is read once by the dispatcher and still reaches the route intact
    raw = gzip.compress(json.dumps({"model": "emb", "input": texts}).encode())
    st, out = _post(srv.url + "/v1/embeddings", None, {"content-encoding": "gzip"}, raw)
    assert st == 200 and len(out["data"]) == 2


def test_unknown_model_is_refused_with_the_served_names(two):
    srv, _, _ = two
    st, out = _post(srv.url + "/v1/embeddings", {"model": "nope", "input": ["x"]})
    assert st == 404
    msg = out["error"]["message"]
    assert "'nope'" in msg and "'emb'" in msg and "'ce'" in msg
    st, out = _post(srv.url + "/rerank", {"model": "nope", "query": "q", "texts": ["a"]})
    assert st == 404 and "'emb', 'ce'" in out["error"]
    st, body = _get(srv.url + "/v2/models/nope/ready")
    assert st == 404 and b"'ce'" in body
    # malformed JSON still gets the route's own answer (the first model's route)
    st, out = _post(srv.url + "/v1/embeddings", None, raw=b"{not json")
    assert st == 422


def test_lists_health_and_metrics_name_every_model(two):
    srv, _, _ = two
    st, body = _get(srv.url + "/v1/models")
    assert st == 200 and [m["id"] for m in json.loads(body)["data"]] == ["emb", "ce"]
    st, body = _get(srv.url + "/")
    assert st == 200 and json.loads(body)["models"] == ["emb", "ce"]
    assert _get(srv.url + "/health")[0] == 200
    assert _get(srv.url + "/v2/models/ce/ready")[0] == 200
    _post(srv.url + "/v1/embeddings", {"model": "emb", "input": ["count me"]})
    st, body = _get(srv.url + "/metrics")
    text = body.decode()
    assert st == 200 and 'model="emb"' in text and 'model="ce"' in text
    # one HELP / TYPE per metric, not one per model (a valid exposition)
    helps = [ln for ln in text.splitlines() if ln.startswith("# HELP ")]
    assert len(helps) == len(set(helps))


def test_cli_refuses_bad_lists_before_compiling(tmp_path):
    def run(*args):
        return subprocess.run(
            [sys.executable, "-m", "zoi.serve", "--port", "0", *args],
            capture_output=True,
            text=True,
            timeout=120,
        )

    r = run(f"a={tmp_path}", f"a={tmp_path}")
    assert r.returncode != 0 and "named 'a'" in r.stderr
    r = run("--served-model-name", "x", str(tmp_path), str(tmp_path))
    assert r.returncode != 0 and "NAME=PATH" in r.stderr


def test_memory_check_adds_every_model_before_the_first_compile(tmp_path, monkeypatch):
    from safetensors.numpy import save_file

    import zoi.decoder.memory as mem
    from zoi.serve import multi

    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        save_file({"w": np.zeros((1000, 250), np.float32)}, str(tmp_path / name / "m.safetensors"))
    models = multi.parse_models([f"a={tmp_path / 'a'}", str(tmp_path / "b")])
    assert models == [("a", str(tmp_path / "a")), (None, str(tmp_path / "b"))]
    assert multi.check_memory(models, "fp32") == 2 * 1_000_000
    assert multi.check_memory(models, "int8") == 2 * 300_000
    monkeypatch.setattr(mem, "available_host_bytes", lambda: (1_500_000, "available"))
    with pytest.raises(MemoryError, match=r"2 models need about 1\.9 MiB.*fewer models"):
        multi.check_memory(models, "fp32")
    assert multi.check_memory(models, "int8") == 600_000
