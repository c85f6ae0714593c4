"""zoi on a local Ray Serve with 2 replicas: zoi serve's routes, load, a replica killed, overload."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

from zoi.bench.loadtest import run_load

from .conftest import cosine_rows, mixed_texts

# starts a local Ray cluster with two replicas (~1-2 minutes of a 2-core host's CI): the slow
# tier (`make test-all`), as the README's tiers say; the deployment's options and its replica
# body stay in `make test` (tests/integrations/test_placement.py)
pytestmark = pytest.mark.slow

pytest.importorskip("ray.serve")

from zoi.integrations.ray import RayServeProcess  # noqa: E402

MODEL = "all-MiniLM-L6-v2"  # the model's own name, kept in the artifact (as zoi serve)


@pytest.fixture(scope="module")
def ray_server(artifact, tmp_path_factory):
    log = tmp_path_factory.mktemp("ray") / "deploy.log"
    srv = RayServeProcess(
        artifact,
        replicas=2,
        args=["--max-queue-delay-us", "2000", "--log-level", "warning"],
        log_path=log,
    )
    yield srv
    srv.stop()


def _post(url: str, path: str, body: dict, timeout: float = 60) -> tuple[int, dict]:
    req = urllib.request.Request(
        url + path, json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _cpu_ticks(pid: int) -> int:
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return int(f[11]) + int(f[12])


def test_same_routes_as_zoi_serve(ray_server, engine):
    texts = mixed_texts(12, seed=2)
    ref = engine.encode(texts)
    with urllib.request.urlopen(ray_server.url + "/info", timeout=30) as r:
        info = json.loads(r.read())
    assert info["model_id"] == MODEL and info["hidden_size"] == 384
    st, tei = _post(ray_server.url, "/embed", {"inputs": texts})
    assert st == 200 and cosine_rows(np.array(tei, np.float32), ref).min() >= 0.99999
    st, oa = _post(ray_server.url, "/v1/embeddings", {"input": texts, "model": MODEL})
    assert st == 200 and oa["object"] == "list" and oa["model"] == MODEL
    got = np.array([d["embedding"] for d in oa["data"]], np.float32)
    assert np.abs(got - ref).max() <= 1e-5
    res, ans = asyncio.run(
        run_load(ray_server.url, texts, 2, len(texts), "kserve", MODEL, collect=True)
    )
    assert res.errors == 0 and cosine_rows(np.concatenate(ans), ref).min() >= 0.99999
    # zoi serve's validation and error bodies, through Ray's proxy
    st, err = _post(ray_server.url, "/v1/embeddings", {"input": "", "model": MODEL})
    assert st == 400 and err["error"]["code"] == "empty_input"
    st, err = _post(ray_server.url, "/embed", {"inputs": ["a"] * 600})
    assert st == 413 and "--max-client-batch-size" in err["error"]


def test_load_two_replicas_nothing_lost_every_answer_equal_alone(ray_server):
    texts = mixed_texts(200, seed=12)
    alone, answers = asyncio.run(
        run_load(ray_server.url, texts, 1, len(texts), "embed", MODEL, collect=True)
    )
    assert alone.errors == 0, alone.error_samples
    ref = np.concatenate(answers)
    pids = ray_server.replica_pids()
    assert len(pids) == 2, pids
    t0 = {p: _cpu_ticks(p) for p in pids}
    n = 2000
    res, got = asyncio.run(
        run_load(
            ray_server.url,
            texts,
            32,
            n,
            ("embed", "openai", "kserve"),
            MODEL,
            collect=True,
            timeout_s=600,
        )
    )
    assert res.errors == 0, res.error_samples
    assert res.ok == n and all(a is not None and a.shape == (1, 384) for a in got)
    got = np.concatenate(got)
    idx = np.arange(n) % len(texts)
    assert cosine_rows(got, ref[idx]).min() >= 0.99999
    assert np.abs(got - ref[idx]).max() <= 1e-5
    used = {p: _cpu_ticks(p) - t0[p] for p in pids}
    assert min(used.values()) >= 0.2 * max(used.values()), used  # both replicas did work


def test_replica_killed_during_load_errors_never_hangs(ray_server, engine):
    texts = mixed_texts(100, seed=7)
    ref = engine.encode(texts)
    victims = ray_server.replica_pids()
    assert len(victims) == 2
    out: dict = {}

    def load():
        out["res"] = asyncio.run(
            run_load(ray_server.url, texts, 16, 600, "embed", MODEL, collect=True, timeout_s=300)
        )

    th = threading.Thread(target=load)
    th.start()
    time.sleep(2.0)
    os.kill(victims[0], signal.SIGKILL)
    th.join(320)
    assert not th.is_alive(), "load did not finish: a request hung"
    res, got = out["res"]
    assert res.ok + res.errors == 600 and res.ok >= 200
    assert all(e.startswith("HTTP 5") or "connection" in e for e in res.error_samples)
    good = [i for i in range(600) if got[i] is not None]
    assert (
        cosine_rows(np.concatenate([got[i] for i in good]), ref[np.array(good) % 100]).min()
        >= 0.99999
    )
    # Ray's controller replaces the replica: two again, and every answer right
    deadline = time.monotonic() + 180
    while True:
        pids = ray_server.replica_pids()
        if len(pids) == 2 and victims[0] not in pids:
            break
        assert time.monotonic() < deadline, f"no replacement replica: {pids}"
        time.sleep(1)
    deadline = time.monotonic() + 120
    while True:
        res2, got2 = asyncio.run(
            run_load(ray_server.url, texts, 4, 100, "embed", MODEL, collect=True, timeout_s=120)
        )
        if res2.errors == 0:
            break
        assert time.monotonic() < deadline, res2.error_samples
        time.sleep(2)
    assert cosine_rows(np.concatenate(got2), ref).min() >= 0.99999


def test_overload_answers_503_with_a_clear_message(artifact, tmp_path):
    """One replica taking 1 request, 1 queued: a burst of 48 gets 503s at once, never a hang."""
    with RayServeProcess(
        artifact,
        replicas=1,
        args=[
            "--max-ongoing-requests",
            "1",
            "--max-queued-requests",
            "1",
            "--log-level",
            "warning",
        ],
        log_path=tmp_path / "deploy.log",
    ) as srv:
        texts = mixed_texts(48, seed=8)
        t0 = time.monotonic()
        res, _ = asyncio.run(run_load(srv.url, texts, 48, 144, "embed", MODEL, timeout_s=120))
        assert time.monotonic() - t0 < 120
        assert res.ok + res.errors == 144 and res.ok >= 1 and res.errors >= 1
        assert all("HTTP 503" in e for e in res.error_samples), res.error_samples
        assert any("backpressure" in e.lower() or "queue" in e.lower() for e in res.error_samples)
        st, _ = _post(srv.url, "/embed", {"inputs": texts[:2]})
        assert st == 200


@pytest.mark.slow  # starts haproxy in front of a Ray cluster (~1 minute): the slow tier
def test_haproxy_ingress_serves_the_same_answers(artifact, engine, tmp_path):
    """--proxy haproxy (Ray's HAProxy mode, private paths and ports) while another deployment
    runs: the same routes, every answer equal to engine.encode."""
    texts = mixed_texts(60, seed=9)
    ref = engine.encode(texts)
    with RayServeProcess(
        artifact,
        replicas=2,
        args=["--proxy", "haproxy", "--log-level", "warning"],
        log_path=tmp_path / "deploy.log",
    ) as srv:
        res, got = asyncio.run(
            run_load(srv.url, texts, 8, 240, ("embed", "openai", "kserve"), MODEL, collect=True)
        )
        assert res.errors == 0, res.error_samples
        idx = np.arange(240) % len(texts)
        assert cosine_rows(np.concatenate(got), ref[idx]).min() >= 0.99999
        st, err = _post(srv.url, "/v1/embeddings", {"input": "", "model": MODEL})
        assert st == 400 and err["error"]["code"] == "empty_input"
