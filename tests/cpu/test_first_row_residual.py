"""The first row of each sequence quantised twice (LinearQuant.first_row, docs/QUANT.md): the CPU
engine against the emulation (zoi.numerics.reference) on every ISA the machine runs, forced, with
every activation scheme, the fused-quantisation and per-thread-scratch paths (>= 256 tokens), AMX's
tile path, sequences of length 1, one sequence, K not a multiple of 4 / 64; a batch equals its
sequences run alone; the residual's codes and step (s2 = a_scale * 2**-8) of every ISA's quantiser
bit for bit against the primitive, and the primitive against a plain transcription of the rule; an
artifact without the key runs as before, one of the earlier rule is refused."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import batch, make_model, small_spec, supported_isas

import zoi
from zoi import _cpu
from zoi.backends.cpu import CpuBackend
from zoi.errors import CheckpointError
from zoi.graph.compiled import FIRST_ROW_RULE, LinearQuant
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
    """first_row_residual: r = x - float32(q - zp) * scale at the fixed step s2 = scale * 2**-8;
    the second term reconstructs x to half that step where nothing clamps."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((9, 37)).astype(np.float32)
    x[0, 3] = 40.0  # a massive channel on a first row
    rows = P.first_rows(np.array([0, 4, 9]), 9)
    q, s = P.quantize_act(x)
    q2, s2 = P.first_row_residual(x, q, s, None, rows)
    np.testing.assert_array_equal(s2, s[rows] / np.float32(256))
    rec = q[rows] * s[rows][:, None] + q2 * s2[:, None]
    assert np.abs(rec - x[rows]).max() <= 0.5 * s2.max() + 1e-6
    assert np.abs(q2).max() >= 64  # the step spends the codes on the half step of q1
    qa, sa, za = P.quantize_act_asym(x)
    q2a, s2a = P.first_row_residual(x, qa, sa, za, rows)
    reca = (qa[rows].astype(np.float32) - za[rows][:, None]) * sa[rows][:, None] + q2a * s2a[
        :, None
    ]
    assert np.abs(reca - x[rows]).max() <= 0.5 * s2a.max() + 1e-6
    with pytest.raises(ValueError, match="cu_seqlens"):
        P.first_rows(np.array([0, 4, 8]), 9)


def _spec_q2(x, q, s1, zp):
    """docs/QUANT.md's rule element by element in numpy float32 scalars (independent of the
    vectorised primitive): s2 = s1 * 2**-8; q2 = 0 unless s2 is finite and > 0, else
    clamp(rint(r / s2), -127, 127) with r = x - float32(float32(q - zp) * s1)."""
    f = np.float32
    s1 = f(s1)
    s2 = f(s1 * f(2.0**-8))
    out = np.zeros(len(x), np.int8)
    if not (s2 > 0 and np.isfinite(s2)):
        return out, s2
    for k in range(len(x)):
        d = f(f(f(int(q[k])) - f(int(zp))) * s1)
        r = f(f(x[k]) - d)
        t = f(r / s2)
        out[k] = int(min(max(np.rint(t), -127.0), 127.0))
    return out, s2


def _awkward_rows(rng, K, big=40.0):
    x = rng.standard_normal((8, K)).astype(np.float32)
    x[0, 0] = big  # a massive channel
    x[1] = 0  # zero row
    x[2, K // 2] = np.nan  # NaN row
    x[3] *= 1e-34  # a tiny scale: s2 subnormal
    x[4] = np.abs(x[4]) + 0.5  # all positive: asym's zero point at 0
    x[5] = -np.abs(x[5]) * 3  # all negative
    x[6, 1 % K] = np.inf  # an infinity
    return x


def _eq_nan(a, b):
    np.testing.assert_array_equal(np.isnan(a), np.isnan(b))
    np.testing.assert_array_equal(np.nan_to_num(a), np.nan_to_num(b))


@pytest.mark.parametrize("K", [1, 7, 16, 37, 133])
def test_primitive_is_the_written_rule(K):
    """primitives.first_row_residual against the rule transcribed element by element, bit for bit,
    on every scheme: a zero row, a NaN row, an infinity, a massive channel, static rows whose x the
    first clamp cut (their residual saturates at +-127), asymmetric rows of one sign."""
    rng = np.random.default_rng(K)
    x = _awkward_rows(rng, K)
    rows = np.arange(x.shape[0])
    with np.errstate(invalid="ignore", over="ignore"):
        cases = [("dynamic", *P.quantize_act(x), None), ("static", *P.quantize_act(x, 0.7), None)]
        cases.append(("asym", *P.quantize_act_asym(x)))
    for name, q, s, zp in cases:
        q2, s2 = P.first_row_residual(x, q, s, zp, rows)
        assert q2.dtype == np.int8 and s2.dtype == np.float32
        for i in rows:
            want, ws = _spec_q2(x[i], q[i], s[i], 0 if zp is None else zp[i])
            np.testing.assert_array_equal(q2[i], want, err_msg=f"{name} row {i}")
            _eq_nan(np.float32(s2[i]), ws)
        assert np.isnan(s2[2]) and not q2[2].any()  # NaN row: NaN step, codes 0
        assert (s2[1] == 0) == (name != "static") and not q2[1].any()  # zero row
        assert not q2[6].any() or name == "static"  # an infinity: infinite scale, codes 0
        if name == "static" and K > 1:  # x[0, 0] = 40 clipped at 0.7: the residual saturates
            assert q2[0, 0] == 127 and q2[6, 1] == 127  # K > 1: the infinity not in column 0
            assert np.isfinite(s2[6])
        if name == "dynamic":
            assert np.abs(q2[[0, 4, 5, 7]]).max() >= 100 or K < 16


def _quantize_first_rows(x, cu, isa, static=-1.0, asym=False, shift=None, mul=None, nt=2):
    M, K = x.shape
    B = len(cu) - 1
    q = np.full((M, K), 999, np.int16)
    s = np.full(M, np.nan, np.float32)
    zp = np.full(M, -999, np.int32)
    W = K + 70  # the padding of the stored rows read back: must be the zero code
    q2 = np.full((B, W), 999, np.int16)
    s2 = np.full(B, -5.0, np.float32)
    _cpu.k_quantize_first_rows(
        x, np.asarray(cu, np.int32), q, s, zp, q2, s2, static, asym, shift, mul, isa, nt
    )
    return q, s, zp, q2, s2


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("scheme", ["dynamic", "static", "asym", "dynamic+tr", "asym+tr"])
@pytest.mark.parametrize("K", [1, 5, 8, 16, 31, 33, 64, 129, 384, 1000])
def test_quantiser_q2_is_the_primitive(isa, scheme, K):
    """Every ISA's row quantiser (forced), rows spread over 2 threads: each first row's q2 codes
    (and the stored padding) and s2 bit for bit as primitives.first_row_residual, the other rows'
    q / a_scale unchanged, on awkward first rows (zero, NaN, infinity, tiny, one sign, clamped)."""
    rng = np.random.default_rng(K * 7 + len(scheme))
    a = _awkward_rows(rng, K)
    rest = rng.standard_normal((21, K)).astype(np.float32)
    x = np.concatenate([a[:4], rest[:5], a[4:], rest[5:]])  # first rows: 0 1 2 3 9 10 11 12 ...
    cu = [0, 1, 2, 3, 4, 9, 10, 11, 12, 20, x.shape[0]]
    rows = np.asarray(cu[:-1])
    static = 0.7 if scheme == "static" else -1.0
    asym = scheme.startswith("asym")
    shift = mul = None
    if scheme.endswith("+tr"):
        shift = rng.standard_normal(K).astype(np.float32) * 0.1
        mul = (rng.random(K) + 0.5).astype(np.float32)
    q, s, zp, q2, s2 = _quantize_first_rows(x, cu, isa, static, asym, shift, mul)
    xt = P.act_transform(x, shift, mul)
    with np.errstate(invalid="ignore", over="ignore"):
        if asym:
            wq, ws, wz = P.quantize_act_asym(xt)
        else:
            wq, ws = P.quantize_act(xt, None if static < 0 else static)
            wz = None
    rq2, rs2 = P.first_row_residual(xt, wq, ws, wz, rows)
    ok = np.isfinite(xt).all(axis=1)  # a NaN / infinite row's own q: undefined (NaN / inf scale)
    np.testing.assert_array_equal(q[ok], wq[ok].astype(np.int16))
    _eq_nan(s, ws)
    np.testing.assert_array_equal(q2[:, :K], rq2.astype(np.int16))
    assert not q2[:, K:].any()  # padding: the zero code
    _eq_nan(s2, rs2)
    assert np.isnan(s2[2]) and not q2[2].any()  # the NaN row
    if scheme in ("dynamic", "asym"):  # the zero row (a shift moves it; a static step stays)
        assert s2[1] == 0 and not q2[1].any()


def _tie_rows(rng, K, amax):
    """Rows whose residuals sit on or next to the half codes of s2 = amax / 127 / 256 (max |x| =
    amax): where a multiply by 1 / s2 and the division round differently."""
    f = np.float32
    s1 = f(f(amax) / f(127))
    s2 = f(s1 * f(2.0**-8))
    x = np.empty((4, K), f)
    for i in range(4):
        qk = rng.integers(-120, 120, K).astype(f)
        nk = rng.integers(-127, 127, K).astype(f)
        x[i] = (qk * s1).astype(f) + ((nk + f(0.5)) * s2).astype(f)
        x[i, 0] = f(amax)
    return x, s2


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("static", [False, True])
def test_quantiser_q2_divides(isa, static):
    """q2 = rint(r / s2) with the division correctly rounded (not r * (1 / s2)), ties to even: rows
    built on the half codes, where the two differ (checked), bit for bit as the primitive."""
    rng = np.random.default_rng(11)
    K = 1000
    x, s2 = _tie_rows(rng, K, 38.1)
    cu = [0, 1, 2, 3, 4]
    q, s, zp, q2, got_s2 = _quantize_first_rows(x, cu, isa, 38.1 if static else -1.0)
    wq, ws = P.quantize_act(x, 38.1 if static else None)
    rq2, rs2 = P.first_row_residual(x, wq, ws, None, np.arange(4))
    np.testing.assert_array_equal(q2[:, :K], rq2.astype(np.int16))
    np.testing.assert_array_equal(got_s2, rs2)
    assert (rs2 == s2).all()
    d = (wq.astype(np.float32) * ws[:, None]).astype(np.float32)
    r = (x - d).astype(np.float32)
    by_recip = np.clip(np.rint(r * (np.float32(1) / s2)), -127, 127)
    assert (by_recip != rq2).sum() >= 5  # the rows tell the two apart


def test_quantiser_q2_refuses_bad_sequences():
    x = np.zeros((4, 8), np.float32)
    with pytest.raises(ValueError, match="cu_seqlens"):
        _quantize_first_rows(x, [0, 2, 5], ISAS[-1])


def test_old_artifacts_unchanged():
    """No key: off, and the record of an artifact without the switch is byte for byte the same."""
    lq = LinearQuant.from_dict({"scheme": "dynamic", "amax": None, "info": {}})
    assert lq.first_row is False
    assert lq.to_dict() == {"scheme": "dynamic", "amax": None, "info": {}}
    on = LinearQuant("dynamic", first_row=True)
    assert on.to_dict()["first_row_residual"] == FIRST_ROW_RULE == 2
    assert LinearQuant.from_dict(on.to_dict()).first_row is True
    assert (
        LinearQuant.from_dict({"scheme": "dynamic", "first_row_residual": False}).first_row is False
    )


@pytest.mark.parametrize("old", [True, 1])
def test_earlier_rule_refused(old):
    """A record of the earlier per-token amax step ("first_row_residual": true) would run other
    numerics than it was compiled and searched with: refused, naming the fix."""
    with pytest.raises(CheckpointError, match=r"earlier zoi version.*recompile the model"):
        LinearQuant.from_dict({"scheme": "dynamic", "first_row_residual": old})
    for bad in (3, "yes", 2.0, [2]):
        with pytest.raises(CheckpointError, match="unknown first-row residual rule"):
            LinearQuant.from_dict({"scheme": "dynamic", "first_row_residual": bad})


@pytest.fixture(scope="module")
def frr_artifact(request, tmp_path_factory):
    # the checkpoint builder needs torch: the sanitized run of the C++ core hides it (this test
    # runs in the main run); the other tests here need none
    pytest.importorskip("torch", reason="the random checkpoint is built with transformers")
    eng = zoi.compile(
        request.getfixturevalue("small_bert"),
        device="cpu",
        max_tokens=64,
        precision="int8",
        calibration=["a short text", "another text with a few more words in it"],
        quant_config={"first_row_residual": True, "calibration": "fast"},
    )
    return eng, eng.save(tmp_path_factory.mktemp("frr") / "art")


def test_artifact_of_the_earlier_rule_refused_on_load(frr_artifact, tmp_path):
    """Saved: rule 2 recorded on every INT8 linear and loaded back bit for bit; the same artifact
    edited to say `true` (as earlier versions wrote it) is refused by zoi.load; without the key it
    loads as an artifact without the residual."""
    import json
    import shutil

    eng, art = frr_artifact
    meta = json.loads((art / "zoi.json").read_text())
    recs = [v for v in meta["quant"].values() if "first_row_residual" in v]
    assert recs and all(v["first_row_residual"] == 2 for v in recs)
    texts = ["a short text", "one more line"]
    np.testing.assert_array_equal(zoi.load(art, device="cpu").encode(texts), eng.encode(texts))
    for value, match in ((True, "recompile the model"), (7, "unknown first-row residual rule")):
        dst = tmp_path / f"v{value}"
        shutil.copytree(art, dst)
        m = json.loads((dst / "zoi.json").read_text())
        for v in m["quant"].values():
            if "first_row_residual" in v:
                v["first_row_residual"] = value
        (dst / "zoi.json").write_text(json.dumps(m))
        with pytest.raises(CheckpointError, match=match):
            zoi.load(dst, device="cpu")
    dst = tmp_path / "none"
    shutil.copytree(art, dst)
    m = json.loads((dst / "zoi.json").read_text())
    for v in m["quant"].values():
        v.pop("first_row_residual", None)
    (dst / "zoi.json").write_text(json.dumps(m))
    back = zoi.load(dst, device="cpu")
    assert not any(q.first_row for q in back.model.quant.values())
    assert np.isfinite(back.encode(texts)).all()


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
