"""The first row of each sequence quantised twice (LinearQuant.first_row, docs/QUANT.md): the CPU
engine against the emulation (zoi.numerics.reference) on every ISA the machine runs, forced, with
every activation scheme, the fused-quantisation and per-thread-scratch paths (>= 256 tokens), AMX's
tile path, sequences of length 1, one sequence, K not a multiple of 4 / 64; a batch equals its
sequences run alone; an artifact without the key runs as before."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import batch, make_model, small_spec, supported_isas

from zoi.backends.cpu import CpuBackend
from zoi.graph.compiled import LinearQuant
from zoi.numerics import primitives as P

ISAS = supported_isas()
SCHEMES = [
    ("dynamic", {}, {}),
    ("dynamic_asym", {}, {"l0.ffn2": "mul", "l1.ffn2": "shift+mul"}),
    (
        "dynamic",
        {"l0.ffn2": "static", "l1.ffn2": "dynamic_asym", "l1.qkv": "static"},
        {"l1.ffn2": "mul"},
    ),
]


def _model(default_scheme, schemes, tr, on=True, **kw):
    kw.setdefault("intermediate", 97)
    m = make_model(
        small_spec(pooling="cls", **kw),
        "int8",
        max_tokens=400,
        max_batch=40,
        schemes=schemes,
        default_scheme=default_scheme,
        act_transforms=tr,
        seed=3,
    )
    for lq in m.quant.values():
        if lq.scheme.is_int8:
            lq.first_row = on
    return m


def _emulate(m, ids, pos, cu):
    from zoi.quant.forward import run_graph

    return run_graph(m.graph, m.weights, ids, pos, cu, quant=m.quant, normalize=False)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("default_scheme,schemes,tr", SCHEMES)
@pytest.mark.parametrize(
    "lengths",
    [[1], [7], [1, 1, 1], [80, 79, 80, 3, 80, 1], [5, 1, 17, 64, 2]],
    ids=["one-token", "B1", "all-len1", "fused-323", "mixed"],
)
def test_engine_matches_emulation(isa, default_scheme, schemes, tr, lengths, monkeypatch):
    if isa == "amx":
        monkeypatch.setenv("ZOI_AMX_MIN_M", "1")  # every M on the tile kernel
    m = _model(default_scheme, schemes, tr)
    ids, pos, cu = batch(lengths, m.spec.vocab_size, 11)
    be = CpuBackend(m, isa=isa, nthreads=2)
    got = be.run(ids, pos, cu, False)
    assert np.isfinite(got).all()
    want = _emulate(m, ids, pos, cu)
    tol = 1e-3 * max(1.0, float(np.abs(want).max()))
    assert np.abs(got - want).max() <= tol
    # the switch changes the [CLS] rows by far more than the engine's distance to the emulation:
    # the test sees whether the second row was added
    off = _model(default_scheme, schemes, tr, on=False)
    want_off = _emulate(off, ids, pos, cu)
    assert np.abs(want_off - want).max() > 20 * np.abs(got - want).max()
    # a batch is its sequences run alone, bit for bit (the side rows are per sequence)
    if len(lengths) > 1:
        for b in range(len(lengths)):
            a, e = cu[b], cu[b + 1]
            one = be.run(ids[a:e], pos[a:e], np.array([0, e - a], np.int32), False)
            np.testing.assert_array_equal(one[0], got[b])


@pytest.mark.parametrize("isa", ISAS)
def test_closer_to_fp32_on_the_first_rows(isa):
    """The point of it: the [CLS] outputs move towards FP32."""
    lengths = [30, 12, 50, 7]
    m_on = _model("dynamic", {}, {})
    m_off = _model("dynamic", {}, {}, on=False)
    ids, pos, cu = batch(lengths, m_on.spec.vocab_size, 5)
    fp = make_model(small_spec(intermediate=97, pooling="cls"), "fp32", 400, 40, seed=3)
    ref = CpuBackend(fp, isa=isa).run(ids, pos, cu, False)
    e_on = np.abs(CpuBackend(m_on, isa=isa).run(ids, pos, cu, False) - ref).mean()
    e_off = np.abs(CpuBackend(m_off, isa=isa).run(ids, pos, cu, False) - ref).mean()
    assert e_on < 0.95 * e_off


def test_emulation_residual_numerics():
    """first_row_residual: r = x - float32(q - zp) * scale, then per-token symmetric; the second
    term reconstructs x to the second quantisation's step."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((9, 37)).astype(np.float32)
    x[0, 3] = 40.0  # a massive channel on a first row
    rows = P.first_rows(np.array([0, 4, 9]), 9)
    q, s = P.quantize_act(x)
    q2, s2 = P.first_row_residual(x, q, s, None, rows)
    rec = q[rows] * s[rows][:, None] + q2 * s2[:, None]
    assert np.abs(rec - x[rows]).max() <= 0.5 * s2.max() + 1e-6
    assert (s2 < s[rows] / 100).all()
    qa, sa, za = P.quantize_act_asym(x)
    q2a, s2a = P.first_row_residual(x, qa, sa, za, rows)
    reca = (qa[rows].astype(np.float32) - za[rows][:, None]) * sa[rows][:, None] + q2a * s2a[
        :, None
    ]
    assert np.abs(reca - x[rows]).max() <= 0.5 * s2a.max() + 1e-6
    with pytest.raises(ValueError, match="cu_seqlens"):
        P.first_rows(np.array([0, 4, 8]), 9)


def test_old_artifacts_unchanged():
    """No key: off, and the record of an artifact without the switch is byte for byte the same."""
    lq = LinearQuant.from_dict({"scheme": "dynamic", "amax": None, "info": {}})
    assert lq.first_row is False
    assert lq.to_dict() == {"scheme": "dynamic", "amax": None, "info": {}}
    on = LinearQuant("dynamic", first_row=True)
    assert LinearQuant.from_dict(on.to_dict()).first_row is True


@pytest.mark.parametrize("isa", ISAS)
def test_switch_off_is_the_previous_engine(isa):
    """first_row off: the engine builds no side buffers and matches the plain emulation as before
    (NaN-poisoned output buffers are compared, not assumed)."""
    m = _model("dynamic", {}, {}, on=False)
    ids, pos, cu = batch([9, 1, 33], m.spec.vocab_size, 2)
    be = CpuBackend(m, isa=isa, nthreads=2)
    got = be.run(ids, pos, cu, False)
    want = _emulate(m, ids, pos, cu)
    assert np.abs(got - want).max() <= 1e-3 * max(1.0, float(np.abs(want).max()))
    be_on = CpuBackend(_model("dynamic", {}, {}), isa=isa, nthreads=2)
    assert be_on.engine.scratch_bytes > be.engine.scratch_bytes  # the side rows: only when on


def test_quantiser_records_and_runs_it():
    """QuantConfig(first_row_residual=True): every INT8 linear of the artifact carries it (the
    record's key), a float fallback does not, and the CPU engine runs what the emulation runs."""
    from tests.fixtures import tiny_weights
    from tests.quant.helpers import WordTokenizer, texts, tiny_spec

    from zoi.graph.compiled import CompiledModel
    from zoi.quant import QuantConfig, quantize_model

    spec = tiny_spec()
    w = tiny_weights(spec, seed=3)
    cfgs = {on: QuantConfig(first_row_residual=on) for on in (True, False)}
    out = {}
    for on, cfg in cfgs.items():
        w1, q1 = quantize_model(spec, w, WordTokenizer(spec.vocab_size), texts(48, seed=1), cfg)
        out[on] = CompiledModel.build(spec, w1, "int8", 128, 16, q1)
    on = out[True]
    assert any(lq.scheme.is_int8 for lq in on.quant.values())
    for lq in on.quant.values():
        assert lq.first_row or not lq.scheme.is_int8
        assert ("first_row_residual" in lq.to_dict()) == lq.scheme.is_int8
    assert not any(lq.first_row for lq in out[False].quant.values())
    ids, pos, cu = batch([1, 9, 30, 4], spec.vocab_size, 7)
    got = CpuBackend(on, isa=ISAS[-1]).run(ids, pos, cu, False)
    want = _emulate(on, ids, pos, cu)
    assert np.abs(got - want).max() <= 1e-3 * max(1.0, float(np.abs(want).max()))
