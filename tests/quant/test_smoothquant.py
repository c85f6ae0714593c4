"""SmoothQuant rewrites keep the FP32 function; where each migration goes in the graph."""

from __future__ import annotations

import numpy as np
import pytest
from tests.quant.helpers import WordTokenizer, texts, tiny_spec, tiny_weights

from zoi.graph import build_graph
from zoi.graph.ir import Buffer, Graph, Op
from zoi.numerics import primitives as P
from zoi.numerics.reference import linear_apply
from zoi.quant.calibrate import calibrate, token_batches
from zoi.quant.forward import run_graph
from zoi.quant.smoothquant import apply_smoothing, smooth_factors, smoothing_site


@pytest.fixture(scope="module")
def tiny():
    spec = tiny_spec()
    w = tiny_weights(spec)
    g = build_graph(spec)
    tok = WordTokenizer(spec.vocab_size)
    batches = token_batches(tok.encode_ids(texts(40)), 0, 256)
    return spec, g, w, batches


def test_sites_in_a_post_ln_encoder(tiny):
    _, g, _, _ = tiny
    assert smoothing_site(g, "l0.qkv") == "act"  # the LN output is also the residual
    assert smoothing_site(g, "l0.o") == "v_fold"
    assert smoothing_site(g, "l1.ffn1") == "act"
    assert smoothing_site(g, "l1.ffn2") == "act"


@pytest.mark.parametrize("alpha", [0.3, 0.5, 0.8])
def test_folding_keeps_fp32_function(tiny, alpha):
    spec, g, w, batches = tiny
    cal = calibrate(spec, w, batches)
    prefixes = list(cal.stats)
    f = {p: smooth_factors(cal.stats[p].chan_absmax, w[p + ".w"], alpha) for p in prefixes}
    shifts = {
        p: ((cal.stats[p].chan_max + cal.stats[p].chan_min) / 2).astype(np.float32)
        for p in prefixes
        if p.endswith((".qkv", ".ffn1"))
    }
    ws, used = apply_smoothing(g, w, f, shifts, allow_act=True)
    assert set(used) == set(prefixes)
    assert used["l0.o"] == "v_fold" and used["l0.qkv"] == "act"
    assert "l0.qkv.act_shift" in ws and "l0.ffn2.act_mul" in ws and "l0.ffn2.act_shift" not in ws
    assert not np.array_equal(ws["l0.qkv.w"], w["l0.qkv.w"])
    for b in batches:
        ref = run_graph(g, w, *b, normalize=True)
        got = run_graph(g, ws, *b, normalize=True)
        assert np.abs(got - ref).max() < 1e-5
    # without allow_act only the exact folds happen
    ws2, used2 = apply_smoothing(g, w, f, shifts, allow_act=False)
    assert set(used2.values()) == {"v_fold"} and not any(k.endswith(".act_mul") for k in ws2)
    ref = run_graph(g, w, *batches[0], normalize=True)
    assert np.abs(run_graph(g, ws2, *batches[0], normalize=True) - ref).max() < 1e-5


def test_layernorm_fold_when_the_ln_output_feeds_only_linears(tiny):
    spec, _, w, batches = tiny
    H = spec.hidden
    ops = [
        Op(
            "embed",
            ["ids", "positions"],
            "x0",
            {"word": "embed.word", "pos": "embed.pos", "ln_w": "embed.ln.w", "ln_b": "embed.ln.b"},
            {"eps": 1e-12},
        ),
        Op("linear", ["x0"], "h", {"w": "l0.ffn1.w", "b": "l0.ffn1.b"}, {"act": "gelu"}),
        Op("pool", ["h", "cu_seqlens"], "pooled", {}, {"mode": "mean"}),
    ]
    g = Graph(
        ops,
        {
            "x0": Buffer("x0", "T", H),
            "h": Buffer("h", "T", spec.intermediate),
            "pooled": Buffer("pooled", "B", spec.intermediate),
        },
    )
    assert smoothing_site(g, "l0.ffn1") == "ln_fold"
    cal = calibrate(spec, w, batches, graph=g)
    s = smooth_factors(cal.stats["l0.ffn1"].chan_absmax, w["l0.ffn1.w"], 0.5)
    ws, used = apply_smoothing(g, w, {"l0.ffn1": s})
    assert used == {"l0.ffn1": "ln_fold"} and not any(k.endswith(".act_mul") for k in ws)
    np.testing.assert_allclose(ws["embed.ln.w"], w["embed.ln.w"] / s, rtol=1e-6)
    for b in batches:
        np.testing.assert_allclose(run_graph(g, ws, *b), run_graph(g, w, *b), atol=1e-5)

    # and the folded LN output is flatter: INT8 error of that linear goes down
    def err(weights):
        sig = noise = 0.0

        def tap(p, x, y):
            nonlocal sig, noise
            yq = linear_apply(x, weights, p, type("Q", (), {"scheme": "dynamic", "amax": None})())
            sig += float((y.astype(np.float64) ** 2).sum())
            noise += float(((y - yq).astype(np.float64) ** 2).sum())

        for b in batches:
            run_graph(g, weights, *b, tap=tap)
        return 10 * np.log10(sig / noise)

    assert err(ws) > err(w) + 1.0


def test_smoothing_improves_int8_on_outlier_channels(tiny):
    spec, g, w, batches = tiny
    cal = calibrate(spec, w, batches)
    p = "l0.qkv"
    x_all = []
    run_graph(g, w, *batches[0], tap=lambda q, x, y: x_all.append(x) if q == p else None)
    x = x_all[0]
    s = smooth_factors(cal.stats[p].chan_absmax, w[p + ".w"], 0.5)
    y = x @ w[p + ".w"].T
    wq, ws = P.quantize_weight(w[p + ".w"])
    plain = P.linear_int8_emulated(x, wq, ws, None)
    wq2, ws2 = P.quantize_weight(w[p + ".w"] * s[None, :])
    smooth = P.linear_int8_emulated((x / s).astype(np.float32), wq2, ws2, None)
    assert P.sqnr_db(y, smooth) > P.sqnr_db(y, plain) + 2.0


def test_factor_edge_cases():
    a = np.array([0.0, 1.0, 4.0, 1e9], np.float32)
    w = np.array([[0.0, 2.0, 1.0, 1.0]], np.float32)
    s = smooth_factors(a, w, 0.5)
    assert (
        s[0] == 1.0
        and s[1] == pytest.approx(np.sqrt(1.0) / np.sqrt(2.0))
        and s[2] == pytest.approx(2.0)
    )
    assert s[3] <= 1e4
