"""The text workloads of `zoi bench` (texts in, embeddings out) and the e2e overhead tool."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from zoi.bench import workloads as W
from zoi.bench.text import Tok, exact_length_texts, natural_texts

from .bench_helpers import quick_config, run_harness

pytest.importorskip("rich")


def test_texts_of_exact_length(model_dir):
    tok = Tok(model_dir)
    for seq in (16, 128):
        texts = exact_length_texts(tok, 4, seq)
        assert [len(x) for x in tok.encode(texts, 10**9)] == [seq] * 4
        assert len(set(texts)) == 4
    mixed = natural_texts(tok, 300, 256)
    lens = [len(x) for x in tok.encode(mixed, 10**9)]
    assert len(mixed) == 300 and min(lens) >= 16 and max(lens) <= 256 and len(set(lens)) > 30
    assert {w.name for w in W.ALL if w.text} >= {"minilm-text-1x16", "minilm-text-mixed"}


def test_text_providers_in_process(model_dir):
    """Each text path returns [B, H] (the tokenizers: [B, 1] token counts) for the texts."""
    from zoi.bench.providers import BY_NAME, instantiate

    tok = Tok(model_dir)
    texts = natural_texts(tok, 40, 256)
    lens = np.array([len(x) for x in tok.encode(texts, 512)], dtype=np.float32)
    outs = {}
    for name in ("tokenizer-zoi", "tokenizer-hf", "zoi-cpu-fp32"):
        p = instantiate(
            BY_NAME[name], model_dir=str(model_dir), artifacts={}, threads=2, max_tokens=2048
        )
        p.load()
        outs[name] = np.asarray(p.call_texts(p.prepare_texts(texts, 4)))
    assert np.array_equal(outs["tokenizer-zoi"][:, 0], lens)
    assert np.array_equal(outs["tokenizer-hf"][:, 0], lens)
    emb = outs["zoi-cpu-fp32"]
    assert emb.shape == (40, 384) and np.isfinite(emb).all()


@pytest.mark.slow
def test_harness_text_workload(tmp_path, model_dir):
    names = ["zoi-cpu-fp32", "tokenizer-zoi", "tokenizer-hf", "st-fp32"]
    wl = ["minilm-text-1x16", "minilm-1x16"]
    res = run_harness(quick_config(tmp_path / "run.json", names, wl))
    rows = {(r["provider"], r["workload"]): r for r in res["results"]}
    assert not [r for r in rows.values() if "error" in r], [r.get("error") for r in rows.values()]
    for n in names:
        r = rows[(n, "minilm-text-1x16")]
        assert math.isfinite(r["p50_ms"]) and r["p50_ms"] > 0 and r["tokens"] == 16
    # the text-only providers have no token-id row; the baseline of text rows is ST
    assert ("st-fp32", "minilm-1x16") not in rows and ("zoi-cpu-fp32", "minilm-1x16") in rows
    assert rows[("zoi-cpu-fp32", "minilm-text-1x16")]["baseline"] == "st-fp32"


def test_e2e_tool(tmp_path, model_dir):
    from zoi.bench import e2e

    out = tmp_path / "e2e.json"
    assert (
        e2e.main(
            ["--precision", "fp32", "--shapes", "1x16,mixed30", "--reps", "2", "--rounds", "2"]
            + ["--out", str(out)]
        )
        == 0
    )
    res = json.loads(out.read_text())
    assert res["tokenizer"] == "native WordPiece" and len(res["cases"]) == 2
    for c in res["cases"]:
        assert c["encode_over_run_packed"] > 0 and set(c["p50_us"]) >= {"encode", "run_packed"}
