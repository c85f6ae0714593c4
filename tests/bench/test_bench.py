"""The harness end to end with tiny counts: schema, and numbers in every row.

Runs zoi (CPU backend, FP32 and INT8) plus whichever peers are installed; a peer that is
missing must be reported as skipped with a reason, never silently dropped."""

from __future__ import annotations

import math

import numpy as np
import pytest

from zoi.bench import harness
from zoi.bench.providers import BY_NAME, SPECS, missing
from zoi.bench.text import Tok, exact_length_batch, natural_set, pack, padded_batches

from .bench_helpers import quick_config, run_harness

pytest.importorskip("rich")

NUM = (int, float)


def _finite(x) -> bool:
    return isinstance(x, NUM) and not isinstance(x, bool) and math.isfinite(x)


def test_exact_length_real_text(model_dir):
    tok = Tok(model_dir)
    rows = exact_length_batch(tok, 3, 16)
    assert [len(r) for r in rows] == [16, 16, 16]
    assert all(r[0] == tok.cls and r[-1] == tok.sep for r in rows)
    assert not np.array_equal(rows[0], rows[1])  # rows carry different text
    body = np.concatenate([r[1:-1] for r in rows])
    assert (body != 0).all() and len(np.unique(body)) > 10  # real ids, not padding or zeros


def test_packing_and_padding_agree(model_dir):
    tok = Tok(model_dir)
    seqs = natural_set(tok, 10, 256)
    assert len({len(s) for s in seqs}) > 3  # natural lengths
    p = pack(seqs)
    assert p.cu_seqlens[-1] == len(p.ids) == sum(len(s) for s in seqs)
    batches, order = padded_batches(seqs, 4)
    assert sum(b[0].shape[0] for b in batches) == 10
    # every padded row holds exactly its sequence, then zeros under a zero mask
    flat = [row for ids, mask in batches for row in zip(ids, mask, strict=True)]
    for (ids, mask), i in zip(flat, order, strict=True):
        n = len(seqs[i])
        assert np.array_equal(ids[:n], seqs[i]) and mask[:n].all() and not mask[n:].any()


def test_accuracy_metric():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((50, 16)).astype(np.float32)
    same = harness.accuracy(a, a * 3.0)
    assert same["cos_min"] > 0.9999 and same["top10"] == 1.0
    noisy = harness.accuracy(a, a + rng.standard_normal(a.shape).astype(np.float32))
    assert noisy["cos_mean"] < 0.9 and noisy["top10"] < 0.9


def _native_cpu() -> bool:
    try:
        from zoi.backends.cpu import CpuBackend  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.slow
def test_quick_run_schema(tmp_path, model_dir):
    """zoi + installed peers on two small workloads; every row numeric, JSON complete.

    zoi runs on its native CPU core (FP32 and INT8) when it is built, else on the numpy
    reference backend (the harness path is the same)."""
    out = tmp_path / "run.json"
    zoi_names = ["zoi-cpu-fp32", "zoi-cpu-int8"] if _native_cpu() else ["zoi-reference-fp32"]
    peers = [
        s.name for s in SPECS if s.device == "cpu" and s.default and not s.name.startswith("zoi")
    ]
    wl = ["minilm-1x16", "minilm-mixed"]
    cfg = quick_config(out, zoi_names + peers, wl, quick=True, accuracy_n=24, rss=True)
    res = run_harness(cfg)
    assert res["schema"] == harness.SCHEMA
    for key in (
        "created_utc",
        "machine",
        "versions",
        "git",
        "settings",
        "load",
        "workloads",
        "providers",
        "results",
        "memory",
        "accuracy",
    ):
        assert key in res, key
    assert res["machine"]["cpu"]["logical_cores"] >= 1 and res["machine"]["threads"] == 2
    assert res["versions"]["numpy"]

    status = {p["name"]: p for p in res["providers"]}
    for s in SPECS:
        if s.name not in zoi_names + peers:
            continue
        assert s.name in status, f"{s.name} neither run nor reported"
        if missing(s):
            assert status[s.name]["status"] == "skipped" and status[s.name]["reason"]
    ran = [n for n, p in status.items() if p["status"] == "ok"]
    assert set(zoi_names) <= set(ran), status

    wl = {w["name"] for w in res["workloads"]}
    assert wl == {"minilm-1x16", "minilm-mixed"}
    rows = [r for r in res["results"] if r["provider"] in ran]
    assert not [r for r in rows if "error" in r], [r["error"][:300] for r in rows if "error" in r]
    assert {(r["provider"], r["workload"]) for r in rows} == {(n, w) for n in ran for w in wl}
    for r in rows:
        for k in ("p50_ms", "p99_ms", "mean_ms", "throughput_seq_s", "tokens_s"):
            assert _finite(r[k]) and r[k] > 0, (r["provider"], k, r.get(k))
        assert r["p99_ms"] >= r["p50_ms"] and r["calls"] >= min(cfg.calls, cfg.calls_slow)
        if "torch-fp32" in ran:
            assert _finite(r["speedup"])
    mixed = next(r for r in rows if r["workload"] == "minilm-mixed")
    assert mixed["batch"] == 64 and mixed["tokens"] > 64 * 8

    mem = {m["provider"]: m for m in res["memory"]}
    for n in ran:
        assert _finite(mem[n]["weights_bytes"]) and mem[n]["weights_bytes"] > 1e6, n
        assert (
            _finite(mem[n]["peak_rss_bytes"])
            and mem[n]["peak_rss_bytes"] > mem[n]["weights_bytes"] / 4
        ), n
    if "zoi-cpu-int8" in mem:
        assert mem["zoi-cpu-int8"]["weights_bytes"] < mem["zoi-cpu-fp32"]["weights_bytes"]
    assert _finite(mem[zoi_names[0]]["arena_bytes"]) and mem[zoi_names[0]]["arena_bytes"] > 0

    acc = {a["provider"]: a for a in res["accuracy"]["rows"]}
    if "torch-fp32" in ran:  # every provider but the reference has an accuracy row
        assert set(acc) == set(ran) - {"torch-fp32"}, acc
    for n in ran:
        if BY_NAME[n].precision == "int8" and "torch-fp32" in ran:
            a = acc[n]
            assert a["n"] == 24 and _finite(a["cos_mean"]) and _finite(a["top10"])
            assert 0.8 < a["cos_min"] <= a["cos_mean"] <= 1.0 + 1e-6, (n, a)

    plt = pytest.importorskip("matplotlib")
    del plt
    from zoi.bench.plot import plot_result

    pngs = plot_result(out, tmp_path)
    assert pngs and all(p.stat().st_size > 10_000 for p in pngs)
