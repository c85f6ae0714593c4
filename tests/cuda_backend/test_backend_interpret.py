"""The whole CudaBackend (fusion, arena plan, call header, buckets) run eagerly through the
Triton interpreter on the CPU, against the float64 reference engine."""

from __future__ import annotations

import os

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("triton")

from tests.cuda_backend.cuda_helpers import (  # noqa: E402
    MIXED,
    batch,
    default_quant_model,
    linear_same_input_errors,
    min_cosine,
    rel,
    required_quant_features,
    tiny_model,
)

from zoi.backends.reference import ReferenceBackend  # noqa: E402

pytestmark = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1", reason="interpreter run (the GPU runs test_gpu.py)"
)


def _backend(model, **kw):
    from zoi.backends.cuda.backend import CudaBackend

    return CudaBackend(model, interpret=True, **kw)


@pytest.fixture
def rowq(monkeypatch):
    """ROWQ (ffn1 writes ffn2's int8 copy) on: off by default (slower on the H200), tested."""
    from zoi.backends.cuda import backend as bmod

    monkeypatch.setattr(bmod, "ROWQ", True)


@pytest.mark.parametrize("ln_fused", [False, True])
@pytest.mark.parametrize("precision", ["fp16", "int8"])
def test_forward_matches_reference(precision, ln_fused, monkeypatch, rowq):
    from zoi.backends.cuda import backend as bmod

    monkeypatch.setattr(bmod, "FUSE_LN", ln_fused)  # off by default (slower on the H200)
    model = tiny_model(precision)
    be = _backend(model, buckets=[16, 64], fuse_min_tokens=64)  # bucket 16 unfused, 64 fused
    ref = ReferenceBackend(model, dtype=np.float64)
    rng = np.random.default_rng(1)
    L = model.spec.layers
    if precision == "int8":
        # qkv / ffn1 read the int8 copy their LN producer wrote (pure int8 GEMM); in the fused
        # plan ffn2 reads the one ffn1 wrote (ROWQ), o quantises attention's output on load
        for fused, want in ((False, 1), (True, 4)):
            quants = {
                la.extra["prefix"].split(".")[1]: la.quant
                for la in be.plans[fused]["launches"]
                if la.kind == "linear"
            }
            assert quants == {"qkv": 4, "o": 1, "ffn1": 4, "ffn2": want}
        rowq = [
            la.extra["prefix"]
            for la in be.plans[True]["launches"]
            if la.kind == "linear" and la.extra.get("q") and la.ln is None
        ]
        assert all(p.endswith("ffn1") for p in rowq) and len(rowq) == L
    assert be.memory()["kernels_per_forward"] == {
        16: 1 + 7 * L + 1,
        64: 1 + (5 if ln_fused else 7) * L + 1,
    }  # LN fused into o / ffn2
    for lens in ([1], [5, 1, 9], [40, 3, 17]):
        ids, pos, cu = batch(lens, seed=rng)
        for norm in (False, True):
            got = be.run(ids, pos, cu, norm)
            want = ref.run(ids, pos, cu, norm)
            assert got.shape == want.shape and got.dtype == np.float32
            tol = 5e-3 if precision == "fp16" else 3e-2
            assert rel(got, want) < tol, (lens, norm)
            assert min_cosine(got, want) > (0.9999 if precision == "fp16" else 0.999)


def test_default_plans_have_no_ln_fusion_and_no_rowq():
    """Defaults measured on the H200: LN unfused, no ROWQ, so both plans are the same list."""
    model = tiny_model("int8")
    be = _backend(model, buckets=[16, 64], fuse_min_tokens=64)
    kinds = [[(la.kind, la.quant) for la in be.plans[f]["launches"]] for f in (False, True)]
    assert kinds[0] == kinds[1]
    assert not any(la.ln is not None for la in be.plans[True]["launches"] if la.kind == "linear")


def test_batched_equals_one_at_a_time():
    model = tiny_model("int8", pooling="cls", act="gelu_tanh")
    be = _backend(model, buckets=[64])
    rng = np.random.default_rng(2)
    lens = [7, 2, 13]
    ids, pos, cu = batch(lens, seed=rng)
    full = be.run(ids, pos, cu, True)
    for b in range(3):
        a, e = cu[b], cu[b + 1]
        one = be.run(ids[a:e], pos[a:e], np.array([0, e - a], np.int32), True)
        np.testing.assert_allclose(one[0], full[b], rtol=0, atol=1e-6)


def test_static_scheme_and_unfused_layernorm(monkeypatch):
    from zoi.backends.cuda import backend as bmod

    monkeypatch.setattr(bmod, "MAX_FUSED_N", 16)  # force the standalone add_layernorm kernel
    model = tiny_model("int8", static={"l0.ffn2": 4.0, "l1.qkv": 6.0}, act="relu", pooling="max")
    be = _backend(model, buckets=[32, 64], fuse_min_tokens=0)
    assert be.memory()["kernels_per_forward"] == {
        32: 1 + 7 * model.spec.layers + 1,
        64: 1 + 7 * model.spec.layers + 1,
    }
    ref = ReferenceBackend(model, dtype=np.float64)
    ids, pos, cu = batch([30, 11], seed=np.random.default_rng(3))
    got, want = be.run(ids, pos, cu, False), ref.run(ids, pos, cu, False)
    assert rel(got, want) < 3e-2 and min_cosine(got, want) > 0.999


def _check(be, model, cases, tol=3e-2, cos=0.999):
    ref = ReferenceBackend(model, dtype=np.float64)
    rng = np.random.default_rng(11)
    worst = 0.0
    for lens in cases:
        ids, pos, cu = batch(lens, model.spec.vocab_size, rng)
        for norm in (False, True):
            got, want = be.run(ids, pos, cu, norm), ref.run(ids, pos, cu, norm)
            assert got.shape == want.shape and np.isfinite(got).all()
            e = rel(got, want)
            worst = max(worst, e)
            assert e < tol and min_cosine(got, want) > cos, (lens, norm, e)
    return worst


def _kinds(be, fused):
    return [
        (la.kind, la.extra.get("prefix", ""), la.quant)
        for la in be.plans[fused]["launches"]
        if la.kind in ("linear", "quantize")
    ]


@pytest.mark.parametrize(
    "config,needs",
    [
        ({}, {"dynamic_asym", "act_mul"}),  # the quantiser's default
        ({"smooth_shift": True}, {"dynamic_asym", "act_mul", "act_shift"}),
        ({"activations": "static", "smooth_shift": True}, {"static", "act_mul", "act_shift"}),
        ({"activations": "dynamic"}, {"dynamic", "act_mul"}),
    ],
)
def test_default_quant_config_artifact_matches_reference(config, needs, rowq):
    """An artifact of zoi.quant's default config (and variants) runs on the cuda backend
    as the reference backend runs it: per-token asymmetric UINT8 + SmoothQuant act_mul."""
    model = default_quant_model(max_tokens=64, **config)
    assert required_quant_features(model.weights, model.quant) == needs
    be = _backend(model, buckets=[16, 64], fuse_min_tokens=64)  # 16 unfused, 64 fused
    L = model.spec.layers
    # qkv / ffn1 read the int8 copy their whole-row producer (embed, LN, linear + LN) wrote;
    # o / ffn2 (after attention / ffn1, tile producers) read one from a quantize launch when
    # they are asymmetric or have an act_mul / act_shift, else quantise in the GEMM's loop
    # In the fused plan (bucket 64) ffn1 writes ffn2's copy itself (ROWQ): ffn2 is QUANT 4
    # whatever its scheme, and only o keeps a quantize launch
    want, n_q, n_q_o = {False: [], True: []}, 0, 0
    for p, q in model.quant.items():
        role, tr = p.split(".")[1], f"{p}.act_mul" in model.weights
        if role in ("qkv", "ffn1") or q.scheme == "dynamic_asym" or tr:
            n_q += role in ("o", "ffn2")
            n_q_o += role == "o"
            want[False].append((p, 4))
        else:
            want[False].append((p, 1 if q.scheme == "dynamic" else 2))
        want[True].append((p, 4 if role == "ffn2" else want[False][-1][1]))
    for fused in (False, True):
        k = _kinds(be, fused)
        assert sorted((p, q) for kind, p, q in k if kind == "linear") == sorted(want[fused]), k
        assert [kind for kind, *_ in k].count("quantize") == (n_q_o if fused else n_q), k
    if config == {}:
        assert n_q == 2 * L  # o is asymmetric, ffn2 has an act_mul
    assert be.memory()["kernels_per_forward"] == {
        16: 1 + 7 * L + n_q + 1,
        64: 1 + 7 * L + n_q_o + 1,
    }
    worst = _check(be, model, ([1], [5, 1, 9], [32, 3, 17], [20, 20, 20]))
    print(f"{config}: worst rel {worst:.2e}")


def test_mixed_schemes_transforms_and_float_linears(rowq):
    """Every scheme and transform in one model: asym / sym / static, act_mul with and without
    act_shift on whole-row and tile producers, a float linear and a weight-only INT8 linear
    with an act_mul (folded into the fp16 weights at pack time)."""
    model = tiny_model("int8", **MIXED)
    assert required_quant_features(model.weights, model.quant) == set(
        ("dynamic", "static", "dynamic_asym", "act_mul", "act_shift", "weight_only")
    )
    be = _backend(model, buckets=[16, 64], fuse_min_tokens=64)
    want = [
        ("linear", "l0.qkv", 4),  # asym copy written by embed, after shift + mul
        ("quantize", "", 0),  # attention -> l0.o (sym + mul)
        ("linear", "l0.o", 4),
        ("linear", "l0.ffn1", 4),  # asym copy written by o + LN
        ("quantize", "", 0),  # ffn1 -> l0.ffn2 (static + mul)
        ("linear", "l0.ffn2", 4),
        ("linear", "l1.qkv", 4),  # sym copy written by ffn2 + LN
        ("quantize", "", 0),  # attention -> l1.o (asym, no transform)
        ("linear", "l1.o", 4),
        ("linear", "l1.ffn1", 0),  # float, act_shift / act_mul folded
        ("linear", "l1.ffn2", 0),  # weight-only INT8: dequantised to fp16, act_mul folded
    ]
    assert _kinds(be, False) == want
    # fused plan: l0.ffn1 writes l0.ffn2's static copy itself (ROWQ), no quantize launch
    assert _kinds(be, True) == want[:4] + want[5:]
    assert be.w["l1.ffn2.w"].dtype == be.torch.float16 and "l1.ffn2.w_q" not in be.w
    assert be.w["l1.o.colsum"].dtype == be.torch.int32 and "l0.o.colsum" not in be.w
    _check(be, model, ([1], [5, 1, 9], [40, 3, 17], [2] * 20))


def test_weight_only_artifact():
    """The quantiser's weight-only fallback (scheme fp32 with w_q): fp16 weights
    dequantised at pack time, float compute; matches the reference to fp16 accuracy."""
    model = default_quant_model(
        max_tokens=64, sensitivity_db=60.0, fallback_weights="int8", max_weight_ratio=None
    )
    assert required_quant_features(model.weights, model.quant) == {"weight_only"}
    be = _backend(model, buckets=[64])
    assert {q for *_, q in _kinds(be, True)} == {0}
    assert all(f"{p}.w" not in model.weights for p in model.quant)
    _check(be, model, ([1], [30, 7, 19]), tol=5e-3, cos=0.9999)


@pytest.mark.parametrize("which", ["default", "mixed"])
def test_every_linear_matches_the_emulation_on_its_own_input(which):
    """Tight: each linear's output against the INT8 emulation (scheme, act_shift, act_mul)
    run on the exact fp16 input the kernel read; only fp16 output rounding may differ."""
    if which == "default":
        model = default_quant_model(max_tokens=64, smooth_shift=True)
    else:
        model = tiny_model("int8", **MIXED)
    be = _backend(model, buckets=[64], fuse_min_tokens=10**9)
    errs = linear_same_input_errors(be, model, [30, 5, 20])
    assert len(errs) == 4 * model.spec.layers
    assert max(errs.values()) < 1e-3, errs
