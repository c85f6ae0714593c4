"""Calibration on the native CPU engine (zoi.quant.native, zoi.quant.calibrate): every statistic
the quantiser reads from the engine's arena is checked against the numpy reference forward
(zoi.numerics.reference) on fresh random models and texts, awkward sizes included; and the
SmoothQuant candidates' cached weights are the plain smoothing + rounding of each candidate."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from tests.quant.helpers import WordTokenizer, texts, tiny_spec, tiny_weights

from zoi.graph import build_graph
from zoi.graph.build import linear_prefix
from zoi.numerics import primitives as P
from zoi.numerics.reference import linear_apply
from zoi.quant.calibrate import calibrate, token_batches, token_weights
from zoi.quant.forward import run_graph
from zoi.quant.native import LinearInputs, batch_tokens, l2_normalize


def _model(seed: int):
    # hidden 40 over 5 heads (head_dim 8), intermediate 37: not powers of two
    spec = tiny_spec(hidden=40, layers=2, heads=5, inter=37, vocab=89)
    w = tiny_weights(spec, seed=seed)
    tok = WordTokenizer(spec.vocab_size)
    tx = texts(37, seed=seed + 100) + ["a"]  # a one-word text: [CLS] a [SEP]
    batches = token_batches(tok.encode_ids(tx), 0, 97)  # several uneven batches
    return spec, w, batches


def _reference_inputs(spec, w, batches) -> tuple[dict[str, list[np.ndarray]], np.ndarray]:
    g = build_graph(spec)
    xs: dict[str, list[np.ndarray]] = {}
    outs = []
    for b in batches:
        outs.append(
            run_graph(g, w, *b, normalize=True, tap=lambda p, x, y: xs.setdefault(p, []).append(x))
        )
    return xs, np.concatenate(outs)


@pytest.mark.parametrize("seed", [0, 1])
def test_linear_inputs_read_from_the_arena_match_the_reference(seed):
    spec, w, batches = _model(seed)
    assert len(batches) > 2
    ref_x, ref_out = _reference_inputs(spec, w, batches)
    runner = LinearInputs(spec, w, batch_tokens(batches))
    assert not runner.arena.flags.writeable
    got: dict[str, list[np.ndarray]] = {}
    outs = [
        l2_normalize(runner.run(*b, lambda p, x: got.setdefault(p, []).append(x.copy())))
        for b in batches
    ]
    assert list(got) == [linear_prefix(o) for o in build_graph(spec).ops if o.kind == "linear"]
    for p, xs in ref_x.items():
        for a, b in zip(got[p], xs, strict=True):
            assert a.shape == b.shape and a.dtype == np.float32
            np.testing.assert_allclose(a, b, rtol=0, atol=2e-5 * float(np.abs(b).max()))
    np.testing.assert_allclose(np.concatenate(outs), ref_out, rtol=0, atol=2e-5)
    # without a visitor: the same output, one call
    np.testing.assert_array_equal(l2_normalize(runner.run(*batches[0])), outs[0])
    with pytest.raises(ValueError, match="run_steps"):
        runner.engine.run_steps(*batches[0], 3, 1)


@pytest.mark.parametrize("mode", ["token", "text", "pooled"])
def test_statistics_match_numpy_on_random_inputs(mode):
    spec, w, batches = _model(seed=3)
    ref_x, ref_out = _reference_inputs(spec, w, batches)
    cal = calibrate(spec, w, batches, gram=True, gram_weight=mode)
    np.testing.assert_allclose(cal.reference, ref_out, rtol=0, atol=2e-5)
    assert cal.tokens == sum(len(b[0]) for b in batches) and cal.texts == len(ref_out)
    wt = np.concatenate(
        [np.ones(len(b[0])) if mode == "token" else token_weights(b[2], mode) ** 2 for b in batches]
    )
    for p, st in cal.stats.items():
        x = np.concatenate(ref_x[p]).astype(np.float64)
        tol = 2e-5 * np.abs(x).max()
        np.testing.assert_allclose(st.chan_absmax, np.abs(x).max(0), rtol=0, atol=tol)
        np.testing.assert_allclose(st.chan_min, x.min(0), rtol=0, atol=tol)
        np.testing.assert_allclose(st.chan_max, x.max(0), rtol=0, atol=tol)
        np.testing.assert_allclose(st.chan_sum, x.sum(0), rtol=0, atol=tol * len(x))
        ta = np.abs(x).max(1)
        assert st.tokens == len(x)
        assert st.tok_absmax_mean == pytest.approx(ta.mean(), rel=1e-5)
        assert st.tok_absmax_max == pytest.approx(ta.max(), rel=1e-5)
        g = (x * wt[:, None]).T @ x
        assert st.gram.shape == g.shape
        np.testing.assert_allclose(st.gram, g, rtol=0, atol=1e-4 * np.abs(g).max())
        np.testing.assert_allclose(
            st.gram_sum, (x * wt[:, None]).sum(0), rtol=0, atol=1e-4 * np.abs(x).max() * wt.sum()
        )
        assert st.gram_weight == pytest.approx(wt.sum(), rel=1e-12)


def test_observer_sees_the_transformed_inputs():
    from zoi.quant.calibrate import observe
    from zoi.quant.observers import MinMaxObserver

    spec, w, batches = _model(seed=4)
    ref_x, _ = _reference_inputs(spec, w, batches)
    obs = observe(spec, w, batches, MinMaxObserver, transform=lambda p, x: 2.0 * x)
    for p, xs in ref_x.items():
        m = 2.0 * max(float(np.abs(x).max()) for x in xs)
        assert obs[p].amax() == pytest.approx(m, rel=1e-5)


def test_same_bits_for_any_engine_thread_count():
    from zoi import _cpu

    spec, w, batches = _model(seed=5)
    digests = []
    for nt in sorted({1, _cpu.pool_size()}):
        runner = LinearInputs(spec, w, batch_tokens(batches), nthreads=nt)
        h = hashlib.sha256()
        for b in batches:
            h.update(runner.run(*b, lambda p, x, h=h: h.update(x.tobytes())).tobytes())
        digests.append(h.hexdigest())
    assert len(set(digests)) == 1


def test_layer_sqnr_matches_the_reference_taps():
    from zoi.graph.compiled import LinearQuant
    from zoi.quant.sensitivity import layer_sqnr

    spec, w, batches = _model(seed=6)
    g = build_graph(spec)
    prefixes = [linear_prefix(o) for o in g.ops if o.kind == "linear"]
    qw = dict(w)
    for p in prefixes:
        qw[p + ".w_q"], qw[p + ".w_scale"] = P.quantize_weight(qw.pop(p + ".w"))
    quant = {p: LinearQuant("dynamic_asym") for p in prefixes}
    runner = LinearInputs(spec, w, batch_tokens(batches))
    got = layer_sqnr(runner, {"all": batches}, w, qw, quant)["all"]
    sig = dict.fromkeys(prefixes, 0.0)
    noise = dict.fromkeys(prefixes, 0.0)

    def tap(p, x, y):
        yq = linear_apply(x, qw, p, quant[p])
        sig[p] += float(np.sum(y.astype(np.float64) ** 2))
        noise[p] += float(np.sum((y.astype(np.float64) - yq) ** 2))

    for b in batches:
        run_graph(g, w, *b, tap=tap)
    for p in prefixes:
        assert got[p] == pytest.approx(10 * np.log10(sig[p] / noise[p]), abs=0.02), p


@pytest.mark.parametrize("shift", [False, True])
def test_candidate_weights_are_the_plain_smoothing_of_each_candidate(shift):
    """The search's per-linear cache (a qkv's V rows carry the o's factors) gives, for every
    candidate, exactly apply_smoothing + plain rounding of the whole model."""
    from zoi.quant.pipeline import _Candidates
    from zoi.quant.smoothquant import apply_smoothing, smooth_factors, smoothing_site

    spec, w, batches = _model(seed=7)
    g = build_graph(spec)
    cal = calibrate(spec, w, batches)
    prefixes = list(cal.stats)
    sites = {p: smoothing_site(g, p) for p in prefixes}
    absmax = {p: cal.stats[p].chan_absmax for p in prefixes}
    shifts = (
        {p: (cal.stats[p].chan_max * 0.5).astype(np.float32) for p in prefixes if "qkv" in p}
        if shift
        else {}
    )
    cands = _Candidates(g, w, prefixes, sites, set(prefixes), absmax, shifts, True)
    trials = [
        {"qkv": 0.5, "o": 0.5, "ffn1": 0.5, "ffn2": 0.5},
        {"qkv": 0.5, "o": 0.6, "ffn1": 0.5, "ffn2": 0.5},  # only o: the qkv's V rows change
        {"qkv": None, "o": 0.6, "ffn1": 0.4, "ffn2": None},
        {"qkv": 0.5, "o": 0.5, "ffn1": 0.5, "ffn2": 0.5},  # from the cache
    ]
    for t in trials:
        got = cands.weights_for(t)
        f = {
            p: smooth_factors(absmax[p], w[p + ".w"], t[p.split(".")[1]])
            for p in prefixes
            if t[p.split(".")[1]] is not None
        }
        ws, _ = apply_smoothing(g, w, f, {p: shifts[p] for p in f if p in shifts}, True)
        want = dict(ws)
        for p in prefixes:
            want[p + ".w_q"], want[p + ".w_scale"] = P.quantize_weight(want.pop(p + ".w"))
        assert set(got) == set(want)
        for k in want:
            assert got[k].tobytes() == want[k].tobytes(), (t, k)
        cands.keep_only(t)


def test_grams_spilled_to_disk_give_the_same_artifact(monkeypatch):
    """Past SPILL_GRAM_BYTES the Grams wait on disk from calibration to GPTQ: same bytes."""
    import zoi.quant.pipeline as pl
    from zoi.quant import QuantConfig, quantize_model

    spec = tiny_spec(hidden=40, layers=2, heads=5, inter=37, vocab=89)
    w = tiny_weights(spec, seed=8)
    tok = WordTokenizer(spec.vocab_size)
    tx = texts(40, seed=9)
    cfg = QuantConfig(search_texts=16, sqnr_texts=16)
    a, qa = quantize_model(spec, w, tok, tx, cfg)
    monkeypatch.setattr(pl, "SPILL_GRAM_BYTES", 0)
    b, qb = quantize_model(spec, w, tok, tx, cfg)
    assert set(a) == set(b)
    for k in a:
        assert a[k].tobytes() == b[k].tobytes(), k
    assert {p: q.to_dict() for p, q in qa.items()} == {p: q.to_dict() for p, q in qb.items()}
