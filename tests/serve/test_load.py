"""A bounded load test: 64 concurrent clients, thousands of mixed-length requests over three protocols.

Nothing may be lost, every batched answer must equal the answer the same text gets alone, and
/metrics must show that requests were batched together.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from zoi.bench.loadtest import run_load

from .serve_helpers import MODEL_NAME, cosine_rows, metric, real_sentences

httpx = pytest.importorskip("httpx")


def load_texts(n: int, seed: int = 11) -> list[str]:
    """Distinct texts of mixed lengths: fragments, sentences, a few paragraphs."""
    base = real_sentences()
    rng = np.random.default_rng(seed)
    out, seen = [], set()
    i = 0
    while len(out) < n:
        r = rng.random()
        s = base[i % len(base)]
        if r < 0.3:
            words = s.split()
            a = int(rng.integers(0, max(1, len(words) - 1)))
            t = " ".join(words[a : a + int(rng.integers(1, 5))])
        elif r < 0.92:
            t = s
        else:
            t = " ".join(base[(i + j) % len(base)] for j in range(int(rng.integers(2, 8))))
        i += 1
        if t and t not in seen:
            seen.add(t)
            out.append(t)
    return out


def test_load_64_clients_nothing_lost_batched_equals_alone(server, device):
    n_texts, n_requests = (240, 2000) if device != "reference" else (60, 300)
    texts = load_texts(n_texts)
    # one at a time: each text alone on an idle server -> a batch of one
    alone, answers = asyncio.run(
        run_load(server.url, texts, 1, len(texts), "embed", MODEL_NAME, collect=True)
    )
    assert alone.errors == 0 and alone.ok == len(texts)
    ref = np.concatenate(answers)
    m0 = httpx.get(server.url + "/metrics").text

    res, got = asyncio.run(
        run_load(
            server.url,
            texts,
            64,
            n_requests,
            ("embed", "openai", "kserve"),
            MODEL_NAME,
            collect=True,
            timeout_s=300,
        )
    )
    assert res.errors == 0, res.error_samples
    assert res.ok == n_requests and all(a is not None and a.shape == (1, 384) for a in got)
    idx = np.arange(n_requests) % len(texts)
    got = np.concatenate(got)
    assert cosine_rows(got, ref[idx]).min() >= 0.99999
    assert np.abs(got - ref[idx]).max() <= 1e-5

    # batches formed: far fewer engine calls than requests, many with more than one sequence
    m1 = httpx.get(server.url + "/metrics").text
    calls = metric(m1, "zoi_batch_size_count") - metric(m0, "zoi_batch_size_count")
    seqs = metric(m1, "zoi_batch_size_sum") - metric(m0, "zoi_batch_size_sum")
    singles = metric(m1, "zoi_batch_size_bucket", 'le="1.0"') - metric(
        m0, "zoi_batch_size_bucket", 'le="1.0"'
    )
    assert seqs == n_requests
    assert calls <= n_requests / 4, (calls, n_requests)
    assert singles < calls / 2
    assert res.mean_batch is not None and res.mean_batch >= 4
    for route in ("tei", "openai", "kserve"):
        ok = metric(m1, "zoi_request_success_total", f'route="{route}"') - metric(
            m0, "zoi_request_success_total", f'route="{route}"'
        )
        assert ok == len(range(("tei", "openai", "kserve").index(route), n_requests, 3))
    assert metric(m1, "zoi_queue_size") == 0 and metric(m1, "zoi_requests_in_flight") == 0


def test_client_batches_split_over_engine_calls(server, engine):
    """Requests of many inputs, bigger than one engine call, come back whole and in order."""
    texts = load_texts(200, seed=5)
    long = [
        " ".join(texts[i : i + 16]) for i in range(0, 160, 4)
    ]  # 256 tokens each after truncation
    body = long + long[:16]  # 56 inputs of up to 256 tokens: several engine calls
    info = httpx.get(server.url + "/info").json()
    total = sum(len(s) for s in engine.tokenize(body))
    assert total > 2 * info["max_batch_tokens"]
    before = metric(httpx.get(server.url + "/metrics").text, "zoi_batch_size_count")
    r = httpx.post(server.url + "/embed", json={"inputs": body}, timeout=300)
    assert r.status_code == 200
    got = np.array(r.json(), np.float32)
    assert got.shape == (len(body), 384)
    ref = engine.encode(long)
    assert cosine_rows(got, ref[list(range(len(long))) + list(range(16))]).min() >= 0.99999
    after = metric(httpx.get(server.url + "/metrics").text, "zoi_batch_size_count")
    assert after - before >= 3


def test_bench_serve_command(server, tmp_path, capsys):
    import argparse
    import json

    from zoi.bench.loadtest import register_bench

    ap = argparse.ArgumentParser()
    register_bench(ap.add_subparsers())
    out = tmp_path / "serve.jsonl"
    args = ap.parse_args(
        [
            "serve",
            "--url",
            server.url,
            "-c",
            "1",
            "8",
            "-n",
            "40",
            "--warmup",
            "4",
            "--route",
            "openai",
            "-k",
            "2",
            "--rounds",
            "2",
            "-o",
            str(out),
            "--json",
        ]
    )
    assert args.func(args) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["concurrency"] for r in rows] == [1, 8]
    for r in rows:
        assert (
            r["ok"] == r["requests"] == 40
            and r["rounds"] == 2
            and r["errors"] == 0
            and r["req_per_s"] > 0
            and r["texts_per_s"] == 2 * r["req_per_s"]
        )
        assert 0 < r["p50_ms"] <= r["p99_ms"] <= r["max_ms"]
        assert r["model"] == MODEL_NAME and r["route"] == "openai" and r["engine_calls"] >= 1
    assert rows[0]["mean_batch"] == 2.0  # one client, two texts per request
    assert json.loads(capsys.readouterr().out) == rows
