"""The INT8 compile budget (`calibration="fast" | "default" | "thorough"`): presets, refusal
of unknown names, and the plumbing from `zoi compile` / `zoi serve` / `zoi eval` /
`zoi.compile` down to the QuantConfig recorded in the report. Tiny models only: seconds."""

from __future__ import annotations

import numpy as np
import pytest
from tests.quant.helpers import WordTokenizer, texts, tiny_spec, tiny_weights

from zoi.quant import quantize_model
from zoi.quant.config import (
    CALIBRATION_BUDGETS,
    QuantConfig,
    budget_in_effect,
    check_calibration,
    config_for,
)


def test_presets():
    assert CALIBRATION_BUDGETS == ("fast", "default", "thorough")
    d = QuantConfig.preset("default")
    assert d == QuantConfig() and d.calibration == "default"
    fast, thorough = QuantConfig.preset("fast"), QuantConfig.preset("thorough")
    assert fast.calibration == "fast" and fast.search_texts < d.search_texts
    assert thorough.search_rounding == "gptq" and thorough.search_texts > d.search_texts
    # a dict's fields go on top of the preset; the budget stays recorded
    c = config_for("thorough", {"search_texts": 100})
    assert (c.calibration, c.search_rounding, c.search_texts) == ("thorough", "gptq", 100)
    assert config_for(None, {"calibration": "fast"}).calibration == "fast"


@pytest.mark.parametrize("bad", ["fastest", "Default", "thorough "])
def test_unknown_budget_refused_clearly(bad, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no file of that name here
    with pytest.raises(ValueError, match="not a budget .*fast, default, thorough"):
        check_calibration(bad)
    with pytest.raises(ValueError, match="calibration budget must be one of"):
        QuantConfig.preset(bad)
    with pytest.raises(ValueError, match="calibration budget must be one of"):
        QuantConfig(calibration=bad).validate()


def test_budget_and_config_conflicts_refused():
    with pytest.raises(ValueError, match="QuantConfig made for 'default'"):
        config_for("thorough", QuantConfig())
    with pytest.raises(ValueError, match="disagree"):
        config_for("fast", {"calibration": "thorough"})
    with pytest.raises(ValueError, match="unknown QuantConfig fields"):
        config_for("fast", {"search_txts": 3})


def test_no_budget_is_the_default_and_nothing_reads_the_environment(monkeypatch):
    monkeypatch.setenv("ZOI_CALIBRATION", "thorough")  # the server's option, not the quantiser's
    assert budget_in_effect(None) == "default" == config_for(None).calibration
    assert budget_in_effect("fast") == "fast"


def test_a_file_of_texts_is_still_calibration(tmp_path):
    f = tmp_path / "fast"  # a file named like a budget: a Path is a file
    f.write_text("one text\nanother\n")
    check_calibration(str(f))
    check_calibration(f)
    check_calibration(["a", "b"])


def test_quantize_model_records_the_budget():
    spec = tiny_spec()
    w = tiny_weights(spec, seed=3)
    tok = WordTokenizer(spec.vocab_size)
    cal = texts(24, seed=4)
    got = {}
    for budget in ("fast", "thorough"):
        rep: dict = {}
        cfg = QuantConfig.preset(budget, search_texts=8, sqnr_texts=8)
        wq, q = quantize_model(spec, w, tok, calibration=cal, config=cfg, report=rep)
        assert rep["config"]["calibration"] == budget
        got[budget] = (wq, rep)
    assert got["thorough"][1]["config"]["search_rounding"] == "gptq"
    # thorough's artifact holds the integers its search rounded (GPTQ): the same as GPTQ
    # recomputed for the chosen alphas
    rep_t = got["thorough"][1]
    alphas = rep_t["smoothquant"]["alphas"]
    rep2: dict = {}
    wq2, _ = quantize_model(
        spec,
        w,
        tok,
        calibration=cal,
        config=QuantConfig.preset(
            "thorough", search_texts=8, sqnr_texts=8, extra={"alphas": alphas}
        ),
        report=rep2,
    )
    for k, a in got["thorough"][0].items():
        np.testing.assert_array_equal(a, wq2[k], err_msg=k)
    # a budget name as `calibration`: zoi's own set, the preset
    rep3: dict = {}
    quantize_model(spec, w, tok, calibration="fast", config={"sqnr_texts": 8}, report=rep3)
    assert rep3["config"]["calibration"] == "fast" and rep3["calibration"]["texts"] >= 512


def test_compile_refuses_unknown_budget_before_loading(tmp_path, monkeypatch):
    import zoi

    monkeypatch.chdir(tmp_path)
    missing = tmp_path / "no-such-model"  # refused before the folder is even looked at
    with pytest.raises(ValueError, match="not a budget"):
        zoi.compile(missing, precision="int8", calibration="fastest")


def test_cli_plumbing(monkeypatch):
    from zoi.cli import _calibration_kwargs, build_parser

    ap = build_parser()
    a = ap.parse_args(["compile", "M", "-o", "OUT", "--precision", "int8", "--calibration", "fast"])
    assert _calibration_kwargs(a) == {"calibration": "fast"}
    a = ap.parse_args(
        ["compile", "M", "-o", "OUT", "--calibrate", "t.txt", "--calibration", "thorough"]
    )
    kw = _calibration_kwargs(a)
    assert kw["calibration"] == "t.txt" and kw["quant_config"] == QuantConfig.preset("thorough")
    a = ap.parse_args(["compile", "M", "-o", "OUT"])
    assert _calibration_kwargs(a) == {"calibration": None}
    with pytest.raises(SystemExit):
        ap.parse_args(["compile", "M", "-o", "OUT", "--calibration", "quick"])
    a = ap.parse_args(["eval", "--calibration", "thorough"])
    assert a.calibration == "thorough"

    # zoi serve: an option of the server (flag or ZOI_CALIBRATION), passed to its compiles
    from zoi.serve.cli import open_engine
    from zoi.serve.config import ServeConfig

    calls = []
    monkeypatch.setattr(
        "zoi.cache.cached_compile", lambda path, **kw: calls.append(kw) or ("E", "cached", "/e")
    )
    assert open_engine("m", ServeConfig(precision="int8", calibration="fast")) == "E"
    assert calls[-1]["calibration"] == "fast"
    assert ServeConfig.from_env({"ZOI_CALIBRATION": "thorough"}).calibration == "thorough"
    with pytest.raises(ValueError, match="ZOI_CALIBRATION"):
        ServeConfig.from_env({"ZOI_CALIBRATION": "slow"})
    ap = build_parser()
    assert ap.parse_args(["serve", "--calibration", "fast"]).calibration == "fast"
    with pytest.raises(SystemExit):
        ap.parse_args(["serve", "--calibration", "slow"])


def test_cache_key_follows_the_budget(tmp_path):
    from zoi import cache

    assert cache._texts_digest("fast") is None  # a budget is not a file to hash
    assert cache._texts_digest(None) is None
    f = tmp_path / "t.txt"
    f.write_text("x\n")
    assert cache._texts_digest(str(f)).startswith("file:")
