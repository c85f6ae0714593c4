"""`zoi eval`: the figures (cosine, neighbour agreement) and the command on a tiny checkpoint."""

from __future__ import annotations

import json

import numpy as np
from tests.conftest import build_hf_model, real_sentences, save_checkpoint

from zoi.quant.fidelity import agreement, cosine_rows, neighbours
from zoi.tools.eval import embedding_report


def test_figures_on_synthetic_embeddings():
    r = np.random.default_rng(0)
    e = r.standard_normal((60, 16))
    rep = embedding_report(e, e.copy())
    assert rep["cos_min"] > 0.999999 and rep["top10"] == 1.0 and rep["top1"] == 1.0
    nb = neighbours(e, 10)
    assert nb.shape == (60, 10) and not np.any(nb == np.arange(60)[:, None])
    s = (e / np.linalg.norm(e, axis=1, keepdims=True)) @ (
        e / np.linalg.norm(e, axis=1, keepdims=True)
    ).T
    np.fill_diagonal(s, -np.inf)
    assert np.array_equal(nb[:, 0], s.argmax(axis=1))
    noisy = e + 0.5 * r.standard_normal(e.shape)
    a = agreement(e, noisy, 10)
    assert 0.0 < a["top10"] < 1.0
    np.testing.assert_allclose(cosine_rows(e, 3 * e), 1.0)


def test_zoi_eval_command_on_a_tiny_checkpoint(tmp_path):
    from zoi.tools.cli import main

    folder = save_checkpoint(build_hf_model("bert", seed=1), tmp_path / "tiny")
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(real_sentences(40)), encoding="utf-8")
    out = tmp_path / "report.json"
    cfg = json.dumps(
        {
            "gptq": False,
            "smooth_alpha": 0.5,
            "max_calib_texts": 64,
            "search_texts": 16,
            "sqnr_texts": 16,
        }
    )
    assert (
        main(
            [
                "eval",
                str(folder),
                "--texts",
                str(texts),
                "--json",
                str(out),
                "--device",
                "emulated",
                "--quant-config",
                cfg,
                "-q",
            ]
        )
        == 0
    )
    rep = json.loads(out.read_text())
    assert rep["texts"] == 40 and rep["device"] == "emulated"
    e = rep["embedding"]
    assert 0.9 < e["cos_mean"] <= 1.0 + 1e-6 and 0.0 <= e["top10"] <= 1.0
    assert len(rep["layers"]) == 2 * 4 and all(r["sqnr_eval_db"] > 15 for r in rep["layers"])
    assert rep["weights_ratio"] < 0.5


def test_zoi_eval_on_a_saved_artifact(tmp_path):
    import zoi
    from zoi.tools.cli import main

    folder = save_checkpoint(build_hf_model("bert", seed=2), tmp_path / "tiny")
    cfg = {
        "gptq": False,
        "smooth_alpha": 0.5,
        "max_calib_texts": 64,
        "search_texts": 16,
        "sqnr_texts": 16,
    }
    eng = zoi.compile(
        folder, device="reference", precision="int8", quant_config=cfg, max_tokens=512
    )
    art = eng.save(tmp_path / "art")
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(real_sentences(30)), encoding="utf-8")
    out = tmp_path / "r.json"
    assert (
        main(
            [
                "eval",
                str(art),
                "--texts",
                str(texts),
                "--json",
                str(out),
                "--device",
                "emulated",
                "-q",
            ]
        )
        == 0
    )
    rep = json.loads(out.read_text())
    assert rep["texts"] == 30 and rep["embedding"]["cos_mean"] > 0.9
    assert {r["scheme"] for r in rep["layers"]} <= {"dynamic_asym", "fp32"}
    # the artifact keeps what the quantiser chose: smoothing factors and SQNR per layer
    assert all(r["sqnr_calib_db"] is not None for r in rep["layers"])
