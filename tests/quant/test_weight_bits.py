"""The quantiser's per-linear weight bit width (QuantConfig.extra["weight_bits"]: 8 / 7 /
"auto"): 7-bit GPTQ integers in [-63, 63] where chosen, the choice recorded in the linear's
quant metadata, the default untouched; the CPU engine runs the result on every ISA."""

from __future__ import annotations

import numpy as np
import pytest
from tests.quant.helpers import WordTokenizer, texts, tiny_spec, tiny_weights

from zoi.graph.compiled import CompiledModel
from zoi.quant import QuantConfig, quantize_model
from zoi.quant.gptq import gptq_quantize, with_weight_bits


@pytest.fixture(scope="module")
def tiny():
    spec = tiny_spec()
    return spec, tiny_weights(spec, seed=3), WordTokenizer(spec.vocab_size), texts(48, seed=1)


def _cfg(**kw):
    base = dict(gptq=True, smooth_alpha=0.5, search_texts=16, sqnr_texts=48, sensitivity_db=0.0)
    base.update(kw)
    return QuantConfig(**base)


def _run(tiny, extra):
    spec, w, tok, tx = tiny
    rep: dict = {}
    w1, q1 = quantize_model(spec, w, tok, tx, _cfg(extra=extra), report=rep)
    return w1, q1, rep


def test_default_is_8_bit_and_unmarked(tiny):
    w8, q8, _ = _run(tiny, {})
    assert all("weight_bits" not in q.info and "sqnr7_db" not in q.info for q in q8.values())
    assert max(int(np.abs(w8[p + ".w_q"].astype(int)).max()) for p in q8) == 127
    assert with_weight_bits(None, 8) is None and with_weight_bits({"x": 1}, "8") == {"x": 1}


def test_all_7_bit(tiny):
    w7, q7, _ = _run(tiny, {"weight_bits": 7})
    for p, q in q7.items():
        assert q.info["weight_bits"] == 7
        assert int(np.abs(w7[p + ".w_q"].astype(int)).max()) == 63
        wq = w7[p + ".w_q"].astype(np.float32) * w7[p + ".w_scale"][:, None]
        assert np.isfinite(wq).all()


def test_auto_chooses_by_the_measured_loss(tiny):
    w_a, q_a, _ = _run(tiny, {"weight_bits": "auto", "weight_bits_loss_db": 1.0})
    w_8, q_8, _ = _run(tiny, {})
    for p, q in q_a.items():
        loss = q.info["sqnr_db"] - q.info["sqnr7_db"]
        assert q.info["sqnr7_db"] < q.info["sqnr_db"] + 3  # 7-bit weights are not better by much
        top = int(np.abs(w_a[p + ".w_q"].astype(int)).max())
        if loss <= 1.0:
            assert q.info["weight_bits"] == 7 and top <= 63
        else:  # 8-bit: the very integers of the default compile
            assert "weight_bits" not in q.info
            np.testing.assert_array_equal(w_a[p + ".w_q"], w_8[p + ".w_q"])
    # a loss limit of -inf takes none, +inf all
    _, q_none, _ = _run(tiny, {"weight_bits": "auto", "weight_bits_loss_db": -1e9})
    assert all("weight_bits" not in q.info for q in q_none.values())
    _, q_all, _ = _run(tiny, {"weight_bits": "auto", "weight_bits_loss_db": 1e9})
    assert all(q.info["weight_bits"] == 7 for q in q_all.values())


def test_bad_option_refused(tiny):
    with pytest.raises(ValueError, match="weight_bits must be 8, 7 or 'auto'"):
        _run(tiny, {"weight_bits": "6"})


def test_gptq_qmax_63_stays_in_range_and_beats_plain_rounding():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((400, 48)).astype(np.float32)
    w = rng.standard_normal((24, 48)).astype(np.float32)
    q, s = gptq_quantize(w, x.T.astype(np.float64) @ x, qmax=63)
    assert int(np.abs(q.astype(int)).max()) == 63
    np.testing.assert_allclose(s, np.abs(w).max(1) / 63, rtol=1e-6)
    plain = np.clip(np.rint(w / s[:, None]), -63, 63)
    err = lambda qq: float(np.sum((x @ (w - qq * s[:, None]).T) ** 2))  # noqa: E731
    assert err(q) < err(plain)


def test_7_bit_model_runs_on_every_isa(tiny):
    from tests.cpu.helpers import batch
    from tests.fixtures import supported_isas

    from zoi.backends.cpu import CpuBackend
    from zoi.backends.reference import ReferenceBackend

    spec, *_ = tiny
    w1, q1, _ = _run(tiny, {"weight_bits": "auto", "weight_bits_loss_db": 1e9})
    m = CompiledModel.build(spec, w1, "int8", 64, 8, q1)
    ids, pos, cu = batch([5, 1, 17], spec.vocab_size, 0, spec.position_offset)
    want = ReferenceBackend(m).run(ids, pos, cu, True)
    outs = [CpuBackend(m, isa=i).run(ids, pos, cu, True) for i in supported_isas()]
    for o in outs:
        assert np.isfinite(o).all() and float(np.abs(o - want).max()) <= 1e-3
        # the same integer sums on every ISA; float epilogues / attention differ by ulps
        assert float(np.abs(o - outs[0]).max()) <= 1e-5


def test_with_weight_bits_and_the_cli_option():
    cfg = QuantConfig.preset("fast")
    got = with_weight_bits(cfg, "auto")
    assert got.extra == {"weight_bits": "auto"} and got.calibration == "fast" and cfg.extra == {}
    assert with_weight_bits({"extra": {"a": 1}}, 7) == {"extra": {"a": 1, "weight_bits": 7}}
    assert with_weight_bits(None, "7") == {"extra": {"weight_bits": 7}}
    with pytest.raises(ValueError, match="weight_bits must be 8, 7 or 'auto'"):
        with_weight_bits(None, "9")
    import argparse

    from zoi import cli

    seen = {}

    def fake_compile(*a, **kw):
        seen.update(kw)
        raise SystemExit(0)

    args = argparse.Namespace(
        model="some-folder", device=None, precision="int8", max_tokens=None, weight_bits="auto"
    )
    import zoi

    orig = zoi.compile
    zoi.compile = fake_compile
    try:
        with pytest.raises(SystemExit):
            cli._open_engine(args)
    finally:
        zoi.compile = orig
    assert seen["weight_bits"] == "auto"


def test_bench_provider_compiles_its_own_artifact(small_bert, tmp_path):
    """`zoi bench --providers zoi-cpu-int8-w7`: weight_bits "auto" in an artifact folder of its
    own beside the 8-bit one (never the 8-bit provider's cache entry)."""
    import zoi
    from zoi.bench.models import ModelRef
    from zoi.bench.providers import BY_NAME
    from zoi.bench.providers.zoi_engine import ZoiProvider

    model = ModelRef("small", small_bert, hidden=32, layers=2, heads=2, max_len=64)
    s = BY_NAME["zoi-cpu-int8-w7"]
    assert not s.default and s.options["weight_bits"] == "auto"
    art = ZoiProvider.convert(s, model, tmp_path)["artifact"]
    assert art.endswith("int8-wauto")
    eng = zoi.load(art, device="cpu")
    assert eng.model.quant and all(
        q.info.get("weight_bits", 8) in (7, 8) and "sqnr7_db" in q.info
        for q in eng.model.quant.values()
        if q.scheme != "fp32"
    )
    y = eng.encode(["a short text", "and another one"])
    assert np.isfinite(y).all()
