"""The README's serving snippets, run as written against `zoi serve ART`.

ART is compiled from the bundled model's folder given by path (`zoi compile MODEL_DIR -o
ART`, as a user does): the model keeps its name, all-MiniLM-L6-v2, whatever the artifact's
folder is called. Only the address changes (the server listens on a free port), and curl
gets `-f` so that an HTTP error fails the block. Also: the served name printed at start-up,
--served-model-name used by every route, /openapi.json and /docs describing every route.
"""

from __future__ import annotations

import re
import shutil
import subprocess

import httpx
import numpy as np
import pytest

from zoi.bench.loadtest import ServerProcess

from .serve_helpers import REPO

README = (REPO / "README.md").read_text(encoding="utf-8")
SERVING = README[README.index("## Serving") :]


def blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", SERVING, flags=re.S)


@pytest.fixture(scope="module")
def art(tmp_path_factory, device):
    from zoi.cli import main
    from zoi.engine import default_model_path

    out = tmp_path_factory.mktemp("readme") / "my-artifact"
    assert main(["compile", str(default_model_path()), "-o", str(out), "--device", device]) == 0
    return out


@pytest.fixture(scope="module")
def art_server(art, device, tmp_path_factory):
    srv = ServerProcess(
        str(art),
        env={"ZOI_DEVICE": device, "ZOI_LOG_LEVEL": "warning"},
        log_path=tmp_path_factory.mktemp("readme-log") / "server.log",
    )
    yield srv
    assert srv.stop() == 0, srv.log()[-3000:]


def test_served_name_is_the_models_and_printed(art_server):
    log = "".join(art_server.lines)
    assert "model name 'all-MiniLM-L6-v2'" in log and "/v2/models/all-MiniLM-L6-v2/infer" in log
    j = httpx.get(f"{art_server.url}/info", timeout=30).json()
    assert j["model_id"] == "all-MiniLM-L6-v2"
    assert httpx.get(f"{art_server.url}/v1/models", timeout=30).json()["data"][0]["id"] == (
        "all-MiniLM-L6-v2"
    )


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_readme_curl_block(art_server):
    (block,) = [b for b in blocks("bash") if "curl" in b]
    hostport = art_server.url.split("://", 1)[1]
    script = block.replace("localhost:8080", hostport).replace("curl -s ", "curl -sf ")
    p = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script], capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    out = p.stdout
    assert '"embedding"' in out and '"EMBEDDING"' in out and "zoi_batch_size" in out
    assert '"model_id"' in out


def test_readme_openai_snippet(art_server):
    pytest.importorskip("openai")
    (code,) = [b for b in blocks("python") if "from openai import OpenAI" in b]
    code = code.replace("http://127.0.0.1:8080", art_server.url)
    ns: dict = {}
    exec(compile(code, "README.md[openai]", "exec"), ns)
    vectors = np.array(ns["vectors"], np.float32)
    assert vectors.shape == (2, 384)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert ns["r"].usage.prompt_tokens > 0


def test_readme_tritonclient_snippet(art_server, art):
    pytest.importorskip("tritonclient.http")
    import zoi

    (code,) = [b for b in blocks("python") if "tritonclient" in b]
    code = code.replace("127.0.0.1:8080", art_server.url.split("://", 1)[1])
    ns: dict = {}
    exec(compile(code, "README.md[tritonclient]", "exec"), ns)
    emb = ns["emb"]
    assert emb.dtype == np.float32 and emb.shape == (2, 384)
    ref = zoi.load(art, device="reference").encode(["A man is eating food.", "hello"])
    assert (np.sum(emb * ref, axis=1) > 0.9999).all()


def test_served_model_name_overrides_every_route(art, device):
    srv = ServerProcess(
        str(art),
        env={"ZOI_DEVICE": device, "ZOI_LOG_LEVEL": "warning"},
        args=["--served-model-name", "minilm"],
    )
    try:
        u = srv.url
        assert "model name 'minilm'" in "".join(srv.lines)
        r = httpx.post(f"{u}/v1/embeddings", json={"model": "minilm", "input": "hi"}, timeout=30)
        assert r.status_code == 200 and r.json()["model"] == "minilm"
        r = httpx.post(
            f"{u}/v1/embeddings", json={"model": "all-MiniLM-L6-v2", "input": "hi"}, timeout=30
        )
        assert r.status_code == 404
        body = {"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [1], "data": ["hi"]}]}
        assert httpx.post(f"{u}/v2/models/minilm/infer", json=body, timeout=30).status_code == 200
        assert (
            httpx.post(f"{u}/v2/models/all-MiniLM-L6-v2/infer", json=body, timeout=30).status_code
            == 404
        )
        assert httpx.get(f"{u}/info", timeout=30).json()["model_id"] == "minilm"
        assert httpx.get(f"{u}/", timeout=30).json()["model"] == "minilm"
        doc = httpx.get(f"{u}/openapi.json", timeout=30).json()
        assert doc["info"]["title"].endswith("minilm")
    finally:
        assert srv.stop() == 0


def test_openapi_and_docs_describe_every_route(art_server):
    from zoi.serve.openapi import openapi_path, operations

    u = art_server.url
    r = httpx.get(f"{u}/openapi.json", timeout=30)
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/json")
    doc = r.json()
    assert doc["openapi"].startswith("3.") and "all-MiniLM-L6-v2" in doc["info"]["title"]
    root = httpx.get(f"{u}/", timeout=30).json()
    documented = set(operations("m", 384))
    for path in root["routes"]:
        p = path.replace("all-MiniLM-L6-v2", "{model}")
        assert p in doc["paths"], p
    assert set(doc["paths"]) <= documented
    for p, item in doc["paths"].items():
        for method, op in item.items():
            assert op["summary"] != "(undocumented route)", p
            assert op["responses"]["200"], (p, method)
    emb = doc["paths"]["/v1/embeddings"]["post"]
    assert "input" in emb["requestBody"]["content"]["application/json"]["schema"]["required"]
    assert openapi_path("/v1/models/{name:path}") == "/v1/models/{name}"
    h = httpx.get(f"{u}/docs", timeout=30)
    assert h.status_code == 200 and h.headers["content-type"].startswith("text/html")
    for p in ("/v1/embeddings", "/embed", "/v2/models/{model}/infer", "/openapi.json"):
        assert p in h.text
    assert "<script" not in h.text  # nothing fetched from a CDN


def test_every_app_route_has_an_openapi_entry(engine):
    """A route added to create_app without an entry in zoi.serve.openapi fails here."""
    from zoi.serve.app import create_app
    from zoi.serve.config import ServeConfig
    from zoi.serve.openapi import openapi_path, operations
    from zoi.serve.service import Service

    svc = Service(engine, ServeConfig())
    try:
        app = create_app(svc)
        paths = {openapi_path(r.path) for r in app.routes}
    finally:
        svc.close()
    missing = paths - set(operations("m", 384))
    assert not missing, f"routes without an OpenAPI entry: {sorted(missing)}"
