"""The rerank-1x32 bench workload runs and reports (timings are never asserted)."""

from __future__ import annotations

import json

from zoi.bench.rerank import run


def test_rerank_workload_runs(tmp_path):
    rep = run(tmp_path / "cache", tmp_path / "out.json", threads=1, rounds=1, calls=1,
              providers=["zoi-cpu-fp32"])  # fmt: skip
    assert set(rep["results"]) == {"zoi-cpu-fp32"}, rep["errors"]
    assert rep["results"]["zoi-cpu-fp32"]["spearman_vs_zoi_fp32"] == 1.0
    assert rep["results"]["zoi-cpu-fp32"]["median_ms"] > 0
    assert json.loads((tmp_path / "out.json").read_text())["workload"] == "rerank-1x32"
    cfg = json.loads(
        (tmp_path / "cache" / "models" / "minilm-ce-random-s0" / "config.json").read_text()
    )
    assert cfg["architectures"] == ["BertForSequenceClassification"] and cfg["hidden_size"] == 384
