"""GPTQ's Gram weighted by text length (QuantConfig.gptq_weighting): the Gram is
the weighted sum it claims to be, it is deterministic, and GPTQ on it lowers the error that
matters for the short texts (their mean-pooled output) on a random-init model."""

from __future__ import annotations

import numpy as np
import pytest
from tests.quant.helpers import WordTokenizer, texts, tiny_spec, tiny_weights

from zoi.graph import build_graph
from zoi.graph.build import linear_prefix
from zoi.quant import QuantConfig, quantize_model
from zoi.quant.calibrate import calibrate, token_batches, token_weights
from zoi.quant.forward import run_graph
from zoi.quant.gptq import gptq_quantize
from zoi.quant.pipeline import _transform_gram


def test_token_weights_per_mode():
    cu = np.array([0, 2, 7, 8], np.int32)
    assert token_weights(cu, "token") is None
    t = token_weights(cu, "text")
    np.testing.assert_allclose(t**2 * np.repeat([2, 5, 1], [2, 5, 1]), np.ones(8), rtol=1e-15)
    p = token_weights(cu, "pooled")
    np.testing.assert_array_equal(p, np.repeat([1 / 2, 1 / 5, 1.0], [2, 5, 1]))
    with pytest.raises(ValueError, match="gram weighting"):
        token_weights(cu, "sentence")
    with pytest.raises(ValueError, match="gptq_weighting"):
        QuantConfig(gptq_weighting="sentence").validate()


@pytest.fixture(scope="module")
def tiny():
    spec = tiny_spec()
    tx = texts(40, seed=5) + ["thank you", "well done", "red", "the sky"]
    return spec, tiny_weights(spec, seed=7), WordTokenizer(spec.vocab_size), tx


@pytest.mark.parametrize("mode", ["token", "text", "pooled"])
def test_weighted_gram_is_the_weighted_sum_of_outer_products(tiny, mode):
    spec, w, tok, tx = tiny
    g = build_graph(spec)
    seqs = tok.encode_ids(tx)
    batches = token_batches(seqs, 0, 96)  # several chunks
    assert len(batches) > 2
    cal = calibrate(spec, w, batches, gram=True, gram_weight=mode)
    xs: dict[str, list] = {}
    ws: list = []

    def tap(p, x, y):
        xs.setdefault(p, []).append(x.astype(np.float64))

    for ids, pos, cu in batches:
        run_graph(g, w, ids, pos, cu, tap=tap)  # numpy's FP32 forward: x to float32 rounding
        lens = np.diff(cu)
        per = np.repeat(lens, lens).astype(np.float64)
        ws.append({"token": np.ones_like(per), "text": 1 / per, "pooled": 1 / per**2}[mode])
    wt = np.concatenate(ws)
    for p, st in cal.stats.items():
        x = np.concatenate(xs[p])
        ref = (x * wt[:, None]).T @ x
        np.testing.assert_allclose(st.gram, ref, rtol=1e-4, atol=1e-5 * np.abs(ref).max())
        xw = x * wt[:, None]
        np.testing.assert_allclose(st.gram_sum, xw.sum(0), rtol=0, atol=1e-5 * np.abs(xw).sum())
        assert st.gram_weight == pytest.approx(wt.sum(), rel=1e-12)
        # a channel shift (smooth_shift) applied to the weighted Gram: that of x - z, weighted
        z = x.mean(0).astype(np.float32)
        xz = x - z.astype(np.float64)
        ref_z = (xz * wt[:, None]).T @ xz
        got = _transform_gram(st, z, None)
        np.testing.assert_allclose(got, ref_z, rtol=1e-4, atol=1e-5 * np.abs(ref).max())
    # the same texts calibrated again: the same bits
    again = calibrate(spec, w, batches, gram=True, gram_weight=mode)
    for p in cal.stats:
        assert again.stats[p].gram.tobytes() == cal.stats[p].gram.tobytes()


def _pooled_weight_error(x_by_text: list[np.ndarray], w: np.ndarray, q, s) -> float:
    """sum over texts of sum_t |x_t dW^T|**2 / L**2: the mean-pooled output's error of one
    linear's weight rounding when the tokens' errors are independent."""
    d = (q.astype(np.float64) * s[:, None].astype(np.float64) - w).T
    return float(sum(np.sum((x @ d) ** 2) / len(x) ** 2 for x in x_by_text))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_pooled_gram_lowers_the_short_texts_pooled_error(seed):
    """Calibrate on mostly long texts with a few short ones; on held-out short texts (where
    [CLS] / [SEP] are a third of the tokens) GPTQ on the length-weighted Gram rounds the
    weights so that their mean-pooled error is lower than GPTQ on x^T x gives."""
    spec = tiny_spec(hidden=32, heads=4, inter=64)
    w = tiny_weights(spec, seed=seed)
    tok = WordTokenizer(spec.vocab_size)
    r = np.random.default_rng(seed)
    words = "the a cat dog ran fast slow red blue house river model data text sky".split()
    longs = [" ".join(r.choice(words, int(r.integers(14, 28)))) for _ in range(60)]
    shorts = [" ".join(r.choice(words, int(r.integers(1, 4)))) for _ in range(40)]
    g = build_graph(spec)
    batches = token_batches(tok.encode_ids(longs + shorts[:20]), 0, 512)
    held = token_batches(tok.encode_ids(shorts[20:]), 0, 512)
    cal = {m: calibrate(spec, w, batches, gram=True, gram_weight=m) for m in ("token", "pooled")}
    xs: dict[str, list] = {}

    def tap(p, x, y):
        xs.setdefault(p, []).append(x.astype(np.float64))

    per_text: dict[str, list] = {}
    for ids, pos, cu in held:
        xs.clear()
        run_graph(g, w, ids, pos, cu, tap=tap)
        for p, (x,) in xs.items():
            per_text.setdefault(p, []).extend(x[cu[i] : cu[i + 1]] for i in range(len(cu) - 1))
    err = {m: 0.0 for m in cal}
    for op in g.ops:
        if op.kind != "linear":
            continue
        p = linear_prefix(op)
        for m, c in cal.items():
            q, s = gptq_quantize(w[p + ".w"], c.stats[p].gram)
            err[m] += _pooled_weight_error(per_text[p], w[p + ".w"].astype(np.float64), q, s)
    assert err["pooled"] < 0.97 * err["token"], err


def _small_cfg(mode: str) -> QuantConfig:
    return QuantConfig(gptq_weighting=mode, smooth_alpha=0.5, search_texts=16, sqnr_texts=16)


def test_quantize_model_records_the_weighting_and_tracks_fp32(tiny):
    spec, w, tok, tx = tiny
    assert QuantConfig().gptq_weighting == "pooled"  # the default
    rep: dict = {}
    w1, q1 = quantize_model(spec, w, tok, tx, _small_cfg("pooled"), report=rep)
    assert rep["config"]["gptq_weighting"] == "pooled"
    w0, _ = quantize_model(spec, w, tok, tx, _small_cfg("token"))
    assert any(not np.array_equal(w1[k], w0[k]) for k in w1 if k.endswith(".w_q"))
    g = build_graph(spec)
    b = token_batches(tok.encode_ids(texts(20, seed=11)), 0, 512)[0]
    ref = run_graph(g, w, *b, normalize=True)
    out = run_graph(g, w1, *b, quant=q1, normalize=True)
    assert np.sum(ref * out, axis=1).min() > 0.99


def test_gptq_act_order_is_a_column_permutation_of_the_same_rounding():
    """act_order rounds the columns by decreasing Gram diagonal and returns the integers in
    the original order: on a Gram already in that order it is the plain GPTQ; on a shuffled
    copy it gives the same integers shuffled back."""
    r = np.random.default_rng(3)
    K, N = 80, 24
    x = r.standard_normal((600, K)) * np.linspace(4.0, 0.5, K)  # diagonal decreasing
    w = r.standard_normal((N, K)).astype(np.float32)
    gram = x.T @ x
    o = np.argsort(-np.diag(gram), kind="stable")  # strictly in act-order from here on
    gram, w = gram[np.ix_(o, o)], np.ascontiguousarray(w[:, o])
    q0, s0 = gptq_quantize(w, gram)
    q1, s1 = gptq_quantize(w, gram, act_order=True)
    assert q1.tobytes() == q0.tobytes() and s1.tobytes() == s0.tobytes()
    p = r.permutation(K)
    q2, s2 = gptq_quantize(w[:, p], gram[np.ix_(p, p)], act_order=True)
    assert q2.tobytes() == q0[:, p].tobytes() and s2.tobytes() == s0.tobytes()
    q3, _ = gptq_quantize(w[:, p], gram[np.ix_(p, p)])  # without it the order matters
    assert q3.tobytes() != q0[:, p].tobytes()


def test_spread_batches_keeps_the_token_budget_spread_over_the_set():
    from zoi.quant.calibrate import spread_batches

    b = [(np.zeros(n, np.int32), None, None) for n in (2000, 2040, 1900, 2048, 2000, 1500)]
    assert spread_batches(b, 0) is None and spread_batches(b, 11488) is None
    for cap in (1500, 4000, 6000, 9000):
        idx = spread_batches(b, cap)
        assert sum(len(b[i][0]) for i in idx) <= cap
        assert 0 < len(idx) < len(b)
    assert {0, 5} <= spread_batches(b, 6000)  # both ends of the set


def test_gram_batches_sum_only_the_chosen_batches(tiny):
    """The Grams of a wide model's budget (QuantConfig.gram_tokens_wide) are those of the
    chosen batches alone; every other statistic still sees every token."""
    spec, w, tok, tx = tiny
    batches = token_batches(tok.encode_ids(tx), 0, 96)
    assert len(batches) > 3
    part = calibrate(spec, w, batches, gram=True, gram_batches={0, 2})
    only = calibrate(spec, w, [batches[0], batches[2]], gram=True)
    full = calibrate(spec, w, batches, gram=True)
    for p, st in part.stats.items():
        np.testing.assert_array_equal(st.gram, only.stats[p].gram)
        assert st.gram_weight == only.stats[p].gram_weight
        np.testing.assert_array_equal(st.chan_absmax, full.stats[p].chan_absmax)
        assert st.tokens == full.stats[p].tokens
        assert not np.array_equal(st.gram, full.stats[p].gram)
