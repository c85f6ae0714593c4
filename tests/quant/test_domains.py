"""The per-domain held-out sets, the default calibration mix, and the fidelity report."""

from __future__ import annotations

import json

import numpy as np
import pytest

from zoi import data
from zoi.quant import fidelity as F


def test_domain_sets_exist_are_disjoint_from_calibration_and_big_enough():
    cal = set()
    for d in data.DOMAINS:
        cal |= set(data.domain_calibration(d))
    seen: set[str] = set()
    for d in data.DOMAINS:
        held = data.domain_texts(d)
        assert len(held) >= 140, (d, len(held))
        assert len(set(held)) == len(held), f"{d}: duplicate lines"
        assert not set(held) & cal, f"{d}: held-out texts also in a calibration file"
        assert not set(held) & seen, f"{d}: texts shared with another domain"
        seen |= set(held)
    with pytest.raises(ValueError, match="unknown domain"):
        data.domain_texts("poetry")


def test_default_calibration_interleaves_every_domain():
    pairs = data.calibration_set()
    first = [d for _, d in pairs[:512]]
    for d in data.ENGLISH_DOMAINS:
        assert first.count(d) >= 60, (d, first.count(d))
    assert "multilingual" not in first
    assert "multilingual" in {d for _, d in data.calibration_set(multilingual=True)[:512]}
    assert data.calibration_texts() == [t for t, _ in pairs]

    class S:
        vocab_size = 250002

    assert data.is_multilingual(S()) and data.default_domains(True)[-1] == "multilingual"


def test_domain_report_and_markdown():
    r = np.random.default_rng(0)
    ref = r.standard_normal((30, 16))
    test = ref + 0.01 * r.standard_normal((30, 16))
    test[7] = -ref[7]  # one broken text
    texts = [f"text {i}" for i in range(30)]
    d = F.domain_report(ref, test, texts, worst=3)
    assert d["texts"] == 30 and d["worst"][0]["text"] == "text 7"
    assert d["cos_min"] == pytest.approx(-1.0) and d["meets"]["cos_min"] is False
    ok = F.domain_report(ref, ref.copy(), texts)
    assert ok["cos_min"] == pytest.approx(1.0) and ok["top10"] == 1.0 and all(ok["meets"].values())
    rep = {"model": "m", "domains": {"prose": ok, "code": d}}
    s = F.summarise(rep["domains"])
    assert s["cos_min"]["domain"] == "code" and s["all_targets_met"] is False
    md = F.markdown_table(rep)
    assert md.count("\n") == 5 and "| code | 30 |" in md and "**-1.00000** (< 0.997)" in md
    json.dumps(rep)  # JSON-able
    with pytest.raises(FloatingPointError):
        F.domain_report(ref, np.full_like(ref, np.nan), texts)
    with pytest.raises(ValueError, match="no per-domain"):
        F.markdown_table({"model": "m"})


def test_fidelity_cli_prints_the_table(tmp_path, capsys):
    r = np.random.default_rng(1)
    e = r.standard_normal((12, 8))
    rep = {"model": "m", "domains": {"queries": F.domain_report(e, e, [str(i) for i in range(12)])}}
    p = tmp_path / "rep.json"
    p.write_text(json.dumps(rep))
    assert F.main([str(p)]) == 0
    assert "| queries | 12 | 1.00000 |" in capsys.readouterr().out


def test_zoi_eval_per_domain_json_and_markdown(tmp_path, capsys):
    from tests.conftest import build_hf_model, save_checkpoint

    from zoi.cli import main

    folder = save_checkpoint(build_hf_model("bert", seed=2), tmp_path / "tiny")
    out = tmp_path / "report.json"
    cfg = json.dumps({"gptq": False, "max_calib_texts": 48, "search_texts": 10, "sqnr_texts": 10})
    args = ["eval", str(folder), "--domains", "queries,code", "--device", "emulated"]
    args += ["--quant-config", cfg, "--json", str(out), "--markdown", "-q"]
    assert main(args) == 0
    md = capsys.readouterr().out
    rep = json.loads(out.read_text())
    assert list(rep["domains"]) == ["queries", "code"]
    for name, d in rep["domains"].items():
        assert d["texts"] == len(data.domain_texts(name))
        assert 0.9 < d["cos_mean"] <= 1.0 + 1e-9 and d["cos_min"] <= d["cos_mean"]
        assert 0.0 <= d["top10"] <= 1.0 and len(d["worst"]) == 5
        assert d["worst"][0]["cos"] == pytest.approx(d["cos_min"], abs=1e-6)
        assert d["worst"][0]["text"] in data.domain_texts(name)
    assert rep["worst_domain"]["cos_min"]["domain"] in ("queries", "code")
    assert len(rep["inputs"]["weights_sha256"]) == 64
    assert md.startswith("| domain (") and "| queries |" in md and "| code |" in md


def test_readme_quality_table_is_generated_from_the_committed_report():
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    rep = root / "bench" / "results" / "eval_minilm_int8_domains.json"
    r = subprocess.run(
        [sys.executable, str(root / "scripts" / "readme_quality.py"), str(rep), "--check"],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    doms = json.loads(rep.read_text())["domains"]
    assert set(data.ENGLISH_DOMAINS) <= set(doms)
