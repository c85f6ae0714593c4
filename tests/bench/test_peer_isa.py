"""`zoi bench --peer-isa`: the ISA caps reach each provider's worker process and the result
JSON / the printed table record them (no timing here)."""

from __future__ import annotations

import io
import json

import pytest

from zoi.bench import harness
from zoi.bench.cli import add_arguments
from zoi.bench.providers import BY_NAME, SPECS, isa_env
from zoi.bench.runner import WorkerProc, worker_env

pytest.importorskip("rich")

CAPS = {
    "torch-fp32": {
        "ATEN_CPU_CAPABILITY": "avx2",
        "ONEDNN_MAX_CPU_ISA": "AVX2",
        "MKL_ENABLE_INSTRUCTIONS": "AVX2",
    },
    "ctranslate2-int8": {"CT2_FORCE_CPU_ISA": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
    "openvino-int8": {"ONEDNN_MAX_CPU_ISA": "AVX2"},
}


def test_isa_env_per_family(monkeypatch):
    monkeypatch.delenv("ZOI_CPU_ISA", raising=False)
    for name, want in CAPS.items():
        env, what = isa_env(BY_NAME[name], "avx2")
        assert {k: env.get(k) for k in want} == want, (name, env)
        assert what and not what.startswith("native"), (name, what)
    env, what = isa_env(BY_NAME["onnxruntime-int8"], "avx2")
    assert env == {} and what.startswith("native ISA")  # MLAS: no switch, marked
    # zoi: explicit ZOI_CPU_ISA=avx2 unless the caller chose one
    assert isa_env(BY_NAME["zoi-cpu-int8"], "avx2") == ({"ZOI_CPU_ISA": "avx2"}, "ZOI_CPU_ISA=avx2")
    monkeypatch.setenv("ZOI_CPU_ISA", "scalar")
    env, what = isa_env(BY_NAME["zoi-cpu-int8"], "avx2")
    assert env == {} and "scalar" in what
    # native restricts nobody; GPU providers are never touched
    for s in SPECS:
        assert isa_env(s, "native") == ({}, None), s.name
        if s.device == "cuda":
            assert isa_env(s, "avx2") == ({}, None), s.name
    with pytest.raises(ValueError, match="peer-isa"):
        isa_env(BY_NAME["torch-fp32"], "avx1024")


def test_cli_option():
    import argparse

    p = argparse.ArgumentParser()
    add_arguments(p)
    assert p.parse_args([]).peer_isa == "native"
    assert p.parse_args(["--peer-isa", "avx2"]).peer_isa == "avx2"
    with pytest.raises(SystemExit):
        p.parse_args(["--peer-isa", "sse2"])


def test_env_reaches_worker_process(tmp_path, monkeypatch):
    monkeypatch.setenv("CT2_FORCE_CPU_ISA", "AVX512")  # the cap wins over the caller's value
    env, _ = isa_env(BY_NAME["ctranslate2-int8"], "avx2")
    assert worker_env(2, env)["CT2_FORCE_CPU_ISA"] == "AVX2"
    assert worker_env(2, env)["OMP_NUM_THREADS"] == "2"
    wp = WorkerProc(1, tmp_path / "w.log", env)
    try:
        got = wp.request(op="env", keys=[*env, "ZOI_THREADS", "ZOI_NOT_SET"])["env"]
    finally:
        wp.close()
    assert got == {**env, "ZOI_THREADS": "1", "ZOI_NOT_SET": None}


def test_harness_passes_caps_and_records_them(tmp_path, monkeypatch):
    """Bench.start gives each provider's worker its caps; the result JSON records them."""
    monkeypatch.delenv("ZOI_CPU_ISA", raising=False)
    seen = {}

    class FakeWorker:
        def __init__(self, threads, log_path, env=None):
            self.pid = 0
            self.env = env

        def request(self, **cmd):
            seen[cmd["provider"]] = self.env
            return {"load_s": 0.0}

    class Meter:
        def add(self, pid):
            pass

    monkeypatch.setattr(harness, "WorkerProc", FakeWorker)
    b = harness.Bench(harness.Config(peer_isa="avx2", cache_dir=tmp_path))
    model = type("M", (), {"path": tmp_path, "name": "minilm"})()
    names = ["torch-fp32", "onnxruntime-int8", "ctranslate2-int8", "openvino-int8", "zoi-cpu-int8"]
    for n in names:
        b.start(BY_NAME[n], model, {}, (128, 32), Meter())
        b.status[n] = {"status": "ok", "reason": None}
    for n, want in CAPS.items():
        assert {k: seen[n].get(k) for k in want} == want, (n, seen[n])
    assert seen["onnxruntime-int8"] == {} and seen["zoi-cpu-int8"] == {"ZOI_CPU_ISA": "avx2"}
    res = b.result([], [BY_NAME[n] for n in names], {}, None, 0.0)
    assert res["settings"]["peer_isa"] == "avx2"
    assert res["machine"]["cpu"]["zoi_isa"] == "avx2"  # what zoi's workers ran, not the best ISA
    prov = {p["name"]: p for p in res["providers"]}
    assert prov["onnxruntime-int8"]["isa_restriction"].startswith("native ISA")
    assert prov["torch-fp32"]["isa_env"]["ATEN_CPU_CAPABILITY"] == "avx2"
    json.dumps(res)  # serialisable
    # the default run records "native" and no restriction
    b2 = harness.Bench(harness.Config(cache_dir=tmp_path))
    b2.status["torch-fp32"] = {"status": "ok", "reason": None}
    r2 = b2.result([], [BY_NAME["torch-fp32"]], {}, None, 0.0)
    assert r2["settings"]["peer_isa"] == "native" and "isa_restriction" not in r2["providers"][0]


def test_report_marks_native_isa_rows():
    from rich.console import Console

    from zoi.bench.report import print_report

    res = {
        "settings": {"peer_isa": "avx2"},
        "workloads": [{"name": "minilm-1x16"}],
        "providers": [
            {
                "name": "onnxruntime-int8",
                "label": "ORT INT8",
                "status": "ok",
                "isa_restriction": "native ISA (MLAS dispatches by cpuid; no switch)",
            },
            {
                "name": "torch-fp32",
                "label": "PyTorch",
                "status": "ok",
                "isa_restriction": "ATen avx2 + oneDNN AVX2 + MKL AVX2",
            },
        ],
        "results": [
            {
                "provider": "onnxruntime-int8",
                "workload": "minilm-1x16",
                "p50_ms": 1.0,
                "p99_ms": 2.0,
                "tokens_s": 1.0,
            },
            {
                "provider": "torch-fp32",
                "workload": "minilm-1x16",
                "p50_ms": 3.0,
                "p99_ms": 4.0,
                "tokens_s": 1.0,
            },
        ],
        "memory": [{"provider": "torch-fp32", "model": "minilm", "isa": "aten AVX2"}],
    }
    buf = io.StringIO()
    print_report(res, Console(file=buf, width=200))
    out = buf.getvalue()
    assert "ORT INT8 (native ISA)" in out and "PyTorch (native ISA)" not in out
    assert "--peer-isa" in out and "ran: aten AVX2" in out
