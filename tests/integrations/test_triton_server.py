"""zoi behind the real Triton Inference Server (the `tritonserver` binary of nvidia-pytriton).

One server holds three exports of the same artifact: `minilm` (one instance, dynamic batching),
`minilm_2x` (two instances: one is killed during load) and `minilm_q` (a queue of 2: overload).
Embeddings over HTTP and gRPC are compared with `engine.encode`.
"""

from __future__ import annotations

import asyncio
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from zoi.bench.loadtest import run_load
from zoi.integrations.triton import TritonServerProcess, export_repository

from .conftest import cosine_rows, mixed_texts

# starts a Triton server (~80 s before the first request on a 2-core host): the slow tier
# (`make test-all`), as the README's tiers say; tests/integrations/test_triton_runtime.py keeps
# the model's Python side in `make test`
pytestmark = pytest.mark.slow

httpclient = pytest.importorskip("tritonclient.http")
grpcclient = pytest.importorskip("tritonclient.grpc")
from tritonclient.utils import InferenceServerException  # noqa: E402


@pytest.fixture(scope="module")
def triton(artifact, triton_venv, tmp_path_factory):
    repo = tmp_path_factory.mktemp("triton_repo")
    export_repository(artifact, repo, name="minilm", max_queue_delay_us=2000)
    export_repository(artifact, repo, name="minilm_2x", instances=2, max_queue_delay_us=1000)
    export_repository(artifact, repo, name="minilm_q", max_queue_size=2, max_queue_delay_us=50_000)
    log = tmp_path_factory.mktemp("triton_log") / "tritonserver.log"
    srv = TritonServerProcess(repo, venv=triton_venv, log_path=log, env={"ZOI_NUM_THREADS": "1"})
    yield srv
    srv.stop()


def _http_infer(client, model: str, texts: list[str]) -> np.ndarray:
    inp = httpclient.InferInput("TEXT", [len(texts), 1], "BYTES")
    inp.set_data_from_numpy(np.array([[t.encode()] for t in texts], dtype=object))
    return client.infer(model, [inp]).as_numpy("EMBEDDING")


def _grpc_infer(client, model: str, texts: list[str]) -> np.ndarray:
    inp = grpcclient.InferInput("TEXT", [len(texts), 1], "BYTES")
    inp.set_data_from_numpy(np.array([[t.encode()] for t in texts], dtype=object))
    return client.infer(model, [inp]).as_numpy("EMBEDDING")


def _metric(text: str, name: str, model: str) -> float:
    tot = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and f'model="{model}"' in line:
            tot += float(line.rsplit(" ", 1)[1])
    return tot


def _metrics(srv) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{srv.metrics_port}/metrics", timeout=10) as r:
        return r.read().decode()


def test_http_and_grpc_equal_engine_encode(triton, engine):
    texts = mixed_texts(48, seed=3)
    ref = engine.encode(texts)
    h = httpclient.InferenceServerClient(triton.url[len("http://") :])
    g = grpcclient.InferenceServerClient(triton.grpc_url)
    try:
        meta = h.get_model_metadata("minilm")
        assert meta["inputs"][0]["datatype"] == "BYTES"
        assert meta["outputs"][0] == {"name": "EMBEDDING", "datatype": "FP32", "shape": [-1, 384]}
        for infer, client in ((_http_infer, h), (_grpc_infer, g)):
            got, i = [], 0
            for k in (1, 3, 7, 16, 21):  # requests of different sizes
                out = infer(client, "minilm", texts[i : i + k])
                assert out.dtype == np.float32 and out.shape == (k, 384)
                got.append(out)
                i += k
            got = np.concatenate(got)
            assert np.isfinite(got).all()
            assert cosine_rows(got, ref).min() >= 0.99999
            assert np.abs(got - ref).max() <= 1e-5
            assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)  # MiniLM normalises
    finally:
        h.close()
        g.close()


def test_bad_request_gets_its_own_error(triton, engine):
    """An empty text fails its own request (INVALID_ARG, clear message); the batch's others run."""
    texts = mixed_texts(24, seed=4)
    ref = engine.encode(texts)

    def one(i):
        c = httpclient.InferenceServerClient(triton.url[len("http://") :])
        try:
            if i % 4 == 0:
                with pytest.raises(InferenceServerException, match="empty string") as e:
                    _http_infer(c, "minilm", [texts[i], ""])
                return "error", e.value.status()
            return "ok", _http_infer(c, "minilm", [texts[i]])[0]
        finally:
            c.close()

    with ThreadPoolExecutor(8) as ex:
        res = list(ex.map(one, range(len(texts))))
    for i, (kind, val) in enumerate(res):
        if i % 4 == 0:
            assert kind == "error" and str(val) == "400", val
        else:
            assert kind == "ok" and cosine_rows(val[None], ref[i : i + 1]).min() >= 0.99999


def test_load_nothing_lost_every_answer_equal_alone(triton):
    """2000 requests from 32 clients, mixed lengths: none lost, each equal to its answer alone."""
    texts = mixed_texts(200, seed=11)
    alone, answers = asyncio.run(
        run_load(triton.url, texts, 1, len(texts), "kserve", "minilm", collect=True)
    )
    assert alone.errors == 0, alone.error_samples
    ref = np.concatenate(answers)
    m0 = _metrics(triton)
    n = 2000
    res, got = asyncio.run(
        run_load(triton.url, texts, 32, n, "kserve", "minilm", collect=True, timeout_s=600)
    )
    assert res.errors == 0, (res.error_samples, triton.diagnose())
    assert res.ok == n and all(a is not None and a.shape == (1, 384) for a in got)
    got = np.concatenate(got)
    idx = np.arange(n) % len(texts)
    assert cosine_rows(got, ref[idx]).min() >= 0.99999
    assert np.abs(got - ref[idx]).max() <= 1e-5
    m1 = _metrics(triton)
    execs = _metric(m1, "nv_inference_exec_count", "minilm") - _metric(
        m0, "nv_inference_exec_count", "minilm"
    )
    ok = _metric(m1, "nv_inference_request_success", "minilm") - _metric(
        m0, "nv_inference_request_success", "minilm"
    )
    assert ok == n
    assert 1 <= execs <= n / 3, (execs, n)  # Triton batched the requests; each batch one call


def test_overload_is_rejected_with_a_clear_error(triton):
    """A full queue (max_queue_size 2) answers at once with an error naming it; no hang."""
    texts = mixed_texts(64, seed=5)
    t0 = time.monotonic()
    res, _ = asyncio.run(run_load(triton.url, texts, 64, 192, "kserve", "minilm_q", timeout_s=120))
    assert time.monotonic() - t0 < 120
    assert res.ok + res.errors == 192 and res.ok >= 1 and res.errors >= 1, triton.diagnose()
    assert all("HTTP 503" in e and "Exceeds maximum queue size" in e for e in res.error_samples)
    # and it serves again once the burst is over
    c = httpclient.InferenceServerClient(triton.url[len("http://") :])
    try:
        assert _http_infer(c, "minilm_q", texts[:2]).shape == (2, 384)
    finally:
        c.close()


def test_instance_killed_during_load_errors_never_hangs(triton, engine):
    """SIGKILL one of two instances' stub mid-load: every request ends (answer or error), answers
    stay right, and the model serves again afterwards."""
    import os
    import signal

    texts = mixed_texts(100, seed=6)
    ref = engine.encode(texts)
    victims = triton.stub_pids("minilm_2x")
    assert len(victims) == 2, (victims, triton.diagnose())
    assert len(triton.stub_pids()) == 4  # minilm, minilm_2x (two), minilm_q
    out: dict = {}

    def load():
        out["res"] = asyncio.run(
            run_load(triton.url, texts, 16, 800, "kserve", "minilm_2x", collect=True, timeout_s=300)
        )

    th = threading.Thread(target=load)
    th.start()
    time.sleep(1.5)
    os.kill(victims[0], signal.SIGKILL)
    th.join(320)
    assert not th.is_alive(), "load did not finish: a request hung"
    res, got = out["res"]
    # the dead instance fails its share at once until the model is reloaded: many fast errors
    assert res.ok + res.errors == 800 and res.ok >= 100
    assert all("HTTP 500" in e and "not healthy" in e for e in res.error_samples), res.error_samples
    idx = np.arange(800) % len(texts)
    good = [i for i in range(800) if got[i] is not None]
    assert cosine_rows(np.concatenate([got[i] for i in good]), ref[idx[good]]).min() >= 0.99999
    # the launcher's supervisor reloads the model: fresh instances, and every answer right again
    deadline = time.monotonic() + 120
    while "minilm_2x" not in triton.reloads:
        assert time.monotonic() < deadline, "minilm_2x was not reloaded:\n" + triton.log()[-3000:]
        time.sleep(0.5)
    fresh = triton.stub_pids("minilm_2x")
    assert len(set(fresh) - set(victims)) == 2, (fresh, victims)
    res2, got2 = asyncio.run(
        run_load(triton.url, texts, 8, 200, "kserve", "minilm_2x", collect=True, timeout_s=120)
    )
    assert res2.errors == 0, res2.error_samples
    assert cosine_rows(np.concatenate(got2), ref[np.arange(200) % 100]).min() >= 0.99999
