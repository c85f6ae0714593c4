"""Per-layer SQNR, FP32 fallback within a byte budget, the pipeline on a tiny model, GPTQ."""

from __future__ import annotations

import json

import numpy as np
import pytest
from tests.quant.helpers import WordTokenizer, texts, tiny_spec, tiny_weights

from zoi.graph import build_graph
from zoi.numerics import primitives as P
from zoi.quant import QuantConfig, quant_from_json, quant_to_json, quantize_model
from zoi.quant.calibrate import token_batches
from zoi.quant.forward import run_graph
from zoi.quant.gptq import gptq_quantize
from zoi.quant.sensitivity import choose_fallback, fallback_cost


def test_choose_fallback_order_threshold_budget():
    sq = {"a": 30.0, "b": 20.0, "c": 25.0, "d": 50.0}
    costs = {"a": 10, "b": 100, "c": 10, "d": 10}
    assert choose_fallback(sq, 40.0, costs, None) == ["b", "c", "a"]
    assert choose_fallback(sq, 40.0, costs, 105) == ["b"]
    assert choose_fallback(sq, 40.0, costs, 50) == ["c", "a"]  # b does not fit: skipped
    assert choose_fallback(sq, 22.0, costs, None) == ["b"]
    assert choose_fallback(sq, 0.0, costs, None) == []
    assert fallback_cost(4, 8) == 4 * 8 * 4 - (4 * 8 + 16)


@pytest.fixture(scope="module")
def tiny():
    spec = tiny_spec()
    return spec, tiny_weights(spec, seed=3), WordTokenizer(spec.vocab_size), texts(48, seed=1)


def _cfg(**kw):
    base = dict(gptq=False, smooth_alpha=0.5, search_texts=16, sqnr_texts=48, sensitivity_db=0.0)
    base.update(kw)
    return QuantConfig(**base)


def test_fallback_picks_the_worst_layer_when_threshold_is_high(tiny):
    spec, w, tok, tx = tiny
    rep0: dict = {}
    w0, q0 = quantize_model(spec, w, tok, tx, _cfg(max_weight_ratio=None), report=rep0)
    assert rep0["fallback_fp32"] == [] and all(q.scheme == "dynamic_asym" for q in q0.values())
    sq = rep0["sqnr_db"]
    worst = min(sq, key=sq.get)
    shapes = {p: w[p + ".w"].shape for p in sq}
    cheapest = min(fallback_cost(*s) for s in shapes.values())
    ratio = (rep0["weights_bytes"] + fallback_cost(*shapes[worst]) + cheapest // 2) / rep0[
        "fp32_weights_bytes"
    ]
    rep: dict = {}
    w1, q1 = quantize_model(
        spec,
        w,
        tok,
        tx,
        _cfg(sensitivity_db=1000.0, max_weight_ratio=ratio, fallback_weights="fp32"),
        report=rep,
    )
    assert rep["fallback_fp32"] == [worst]
    assert q1[worst].scheme == "fp32" and q1[worst].info["weights"] == "fp32"
    assert worst + ".w" in w1 and worst + ".w_q" not in w1 and worst + ".act_mul" not in w1
    for p, q in q1.items():
        if p != worst:
            assert q.scheme == "dynamic_asym" and p + ".w_q" in w1 and p + ".w" not in w1
    assert rep["weights_ratio"] <= ratio + 1e-9
    # the FP32 layer is the original linear when its migration needed the kernel ("act")
    if rep["smoothquant"]["sites"].get(worst) == "act":
        np.testing.assert_array_equal(w1[worst + ".w"], w[worst + ".w"])


def test_weight_only_fallback_past_the_budget(tiny):
    spec, w, tok, tx = tiny
    rep: dict = {}
    w1, q1 = quantize_model(
        spec, w, tok, tx, _cfg(sensitivity_db=1000.0, max_weight_ratio=0.0), report=rep
    )
    assert rep["fallback_fp32"] == [] and len(rep["fallback_weight_only"]) == len(q1)
    for p, q in q1.items():
        assert (
            q.scheme == "fp32"
            and q.info["weights"] == "int8"
            and p + ".w_q" in w1
            and p + ".act_mul" not in w1
        )


def test_pipeline_outputs_and_json(tiny):
    spec, w, tok, tx = tiny
    rep: dict = {}
    w1, q1 = quantize_model(spec, w, tok, tx, _cfg(smooth_alpha=None, gptq=True), report=rep)
    g = build_graph(spec)
    assert set(q1) == {o.weights["w"][:-2] for o in g.ops if o.kind == "linear"}
    assert (
        "embed.word" not in w1
        and w1["embed.word_q"].dtype == np.int8
        and w1["embed.word_scale"].shape == (spec.vocab_size,)
    )
    for p, q in q1.items():
        assert w1[p + ".w_q"].dtype == np.int8 and w1[p + ".w_scale"].dtype == np.float32
        assert np.isfinite(q.info["sqnr_db"]) and q.info["sqnr_db"] > 20
    json.dumps(rep)  # the report is JSON-able
    back = quant_from_json(quant_to_json(q1))
    assert {p: v.to_dict() for p, v in back.items()} == json.loads(quant_to_json(q1))
    # and the quantised model tracks FP32
    b = token_batches(tok.encode_ids(texts(30, seed=9)), 0, 512)[0]
    ref = run_graph(g, w, *b, normalize=True)
    out = run_graph(g, w1, *b, quant=q1, normalize=True)
    assert np.sum(ref * out, axis=1).min() > 0.99


def test_static_scheme_gets_an_amax(tiny):
    spec, w, tok, tx = tiny
    for obs in ("minmax", "percentile", "mse"):
        w1, q1 = quantize_model(
            spec, w, tok, tx, _cfg(activations="static", observer=obs, smoothquant="off")
        )
        assert all(q.scheme == "static" and q.amax is not None and q.amax > 0 for q in q1.values())


def test_bad_config_is_refused(tiny):
    spec, w, tok, tx = tiny
    with pytest.raises(ValueError):
        quantize_model(spec, w, tok, tx, {"activations": "int4"})
    with pytest.raises(ValueError):
        quantize_model(spec, w, tok, tx, {"no_such_field": 1})
    from zoi.errors import InputError

    with pytest.raises(InputError):
        quantize_model(spec, w, tok, ["", "  "], None)


def test_gptq_lowers_output_error_in_the_same_format():
    r = np.random.default_rng(0)
    K, N = 96, 40
    base = r.standard_normal((2000, 8))
    x = (base @ r.standard_normal((8, K)) + 0.05 * r.standard_normal((2000, K))).astype(
        np.float32
    )  # correlated
    w = r.standard_normal((N, K)).astype(np.float32)
    q0, s0 = P.quantize_weight(w)
    q1, s1 = gptq_quantize(w, x.astype(np.float64).T @ x)
    np.testing.assert_array_equal(s0, s1)
    assert q1.dtype == np.int8 and np.abs(q1.astype(int)).max() <= 127
    y = x @ w.T
    assert (
        P.sqnr_db(y, x @ P.dequantize_weight(q1, s1).T)
        > P.sqnr_db(y, x @ P.dequantize_weight(q0, s0).T) + 3
    )


def test_calibration_from_a_file(tiny, tmp_path):
    spec, w, tok, tx = tiny
    f = tmp_path / "cal.txt"
    f.write_text("\n".join(tx) + "\n\n", encoding="utf-8")
    rep: dict = {}
    quantize_model(spec, w, tok, str(f), _cfg(), report=rep)
    assert rep["calibration"]["texts"] == len(tx)


def test_config_restricted_to_backend_features(tiny):
    from zoi.quant.config import QuantConfig as QC

    c = QC().restricted_to({"dynamic", "static"})
    assert (
        c.activations == "dynamic"
        and c.smooth_targets == "fold"
        and not c.smooth_shift
        and c.fallback_weights == "fp32"
    )
    assert QC().restricted_to({"dynamic", "dynamic_asym", "act_mul", "weight_only"}) == QC()
    with pytest.raises(ValueError):
        QC().restricted_to({"int4"})
    spec, w, tok, tx = tiny
    w1, q1 = quantize_model(spec, w, tok, tx, _cfg(), features={"dynamic", "static"})
    assert all(q.scheme == "dynamic" for q in q1.values()) and not any(
        k.endswith((".act_mul", ".act_shift")) for k in w1
    )
