"""The whole CudaBackend (fusion, arena plan, call header, buckets) against the float64
reference engine, in either Triton mode (tests/triton_mode.py): run eagerly through the
interpreter on the CPU (CI) with small shapes, or compiled on a GPU (graphs, driver-API call
path; ZOI_TRITON_COMPILED=1, scripts/gpu_check.sh) with the bigger ones (MiniLM-shaped
layers, buckets up to 512 tokens). The same test bodies run in both; only `M` differs."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from tests import triton_mode  # noqa: E402
from tests.cuda_backend.cuda_helpers import (  # noqa: E402
    MIXED,
    batch,
    default_quant_model,
    fp16_storage_emulation,
    linear_same_input_errors,
    min_cosine,
    rel,
    required_quant_features,
    tiny_model,
)

from zoi.backends.reference import ReferenceBackend  # noqa: E402

COMPILED = not triton_mode.interpreted()
pytestmark = pytest.mark.skipif(
    COMPILED and not torch.cuda.is_available(), reason="compiled Triton needs a CUDA GPU"
)
compiled_only = pytest.mark.skipif(not COMPILED, reason="CUDA graphs / persistent kernels")

MINILM = dict(hidden=384, heads=12, layers=2, inter=1536)
NEEDS = {  # the quantiser config -> the INT8 features its artifact uses
    "default": ({}, {"dynamic_asym", "act_mul"}),
    "shift": ({"smooth_shift": True}, {"dynamic_asym", "act_mul", "act_shift"}),
    # static: the pooled GPTQ Gram (the default) like the others. This 24-wide static + shift
    # tiny artifact gives rel 0.070 at [20, 20, 20] in the interpreter, bit-identical to
    # cuda_helpers.fp16_storage_rel's emulation (fp16 storage at every site the backend stores
    # fp16; the embed output's rounding alone flips 6 of 1440 codes of l0.qkv's static copy),
    # where the CPU backend (fp32 activations) gives 0.0000: _check's 2x bound holds.
    "static": (
        {"activations": "static", "smooth_shift": True},
        {"static", "act_mul", "act_shift"},
    ),
    "dynamic": ({"activations": "dynamic"}, {"dynamic", "act_mul"}),
}
if COMPILED:
    M = SimpleNamespace(
        shapes=["tiny", "minilm"],
        size=dict(max_tokens=512, max_batch=64),
        plan=dict(),  # every bucket 16..512
        lens=([1], [16], [17], [5, 1, 9, 40], [40] * 12 + [3], [2] * 64),
        quant_lens=([1], [16], [17], [5, 1, 9, 32], [32] * 12 + [3], [2] * 64),
        # (config, shape): the 24-wide tiny model is sensitive: one requantisation step flipped
        # by the fp16 rounding of an activation moves a 2-token sequence's embedding visibly.
        # The CPU interpreter shows the same (min cosine 0.9926 for static + shift at [2] * 64;
        # the H200 gave 0.9957 for both configs): a property of the model, not of the GPU.
        # The MiniLM-shaped cases keep 0.999. Since main's quantiser changed (2026-12-01) the
        # static + shift tiny artifact gives min cosine 0.96825 at [2] * 64 (rel 0.0253 < 3e-2),
        # bit-identical on the H200 and in the interpreter, and identical with the backend
        # before the split (be0d18b): the model's sensitivity, not a kernel difference.
        # Normalised (norm=True) the same case gives rel 0.0351 > 3e-2 (the H200 failure of
        # gpu_check_merged_20261201T144446Z; the interpreter at these shapes: 0.0351 too, the
        # CPU backend: 0.0000): the fp16 storage of attention's output before l0.o's static
        # quantisation (numpy, only that rounding: 0.0317, cos 0.9727), so _check bounds INT8
        # errors by 2x the naive fp16-storage emulation (fp16_storage_rel) beyond 3e-2. That
        # emulation now stores fp16 at every site the backend does (the default tiny artifact
        # at [5, 1, 9, 32]: H200 0.0682, emulation 0.0682; attention's output alone: 0.0016).
        quant_cases=[("default", "tiny"), ("default", "minilm"), ("shift", "minilm"), ("static", "tiny")],
        tiny_cos=0.96,
        single=dict(model=dict(max_tokens=256, max_batch=32, **MINILM), backend={},
                    lens=[30, 7, 19], big=[40] * 6, seed=3, atol=2e-6),
        weight_only=dict(size=dict(max_tokens=256, max_batch=32), backend={},
                         lens=([1], [30, 7, 19], [32] * 8)),
        mixed_lens=([1], [17], [5, 1, 9, 40], [40] * 12 + [3], [2] * 64),
        linear=dict(size=dict(max_tokens=256, max_batch=32), shape=MINILM, buckets=[32, 256],
                    lens=([3, 20], [32] * 7 + [5])),
    )  # fmt: skip
else:
    M = SimpleNamespace(
        shapes=["tiny"],
        size=dict(max_tokens=64),
        plan=dict(buckets=[16, 64]),
        lens=([1], [5, 1, 9], [40, 3, 17]),
        quant_lens=([1], [5, 1, 9], [32, 3, 17], [20, 20, 20]),
        # default (the product's artifact) and static + shift (the awkward fp16-storage case)
        # here; shift and dynamic in the slow tier: their kernel paths (act_shift on an
        # asymmetric copy, symmetric dynamic with an act_mul) are test_mixed_schemes_...'s
        # l0.qkv and l0.o, in the same model as every other scheme
        quant_cases=[
            ("default", "tiny"),
            pytest.param("shift", "tiny", marks=pytest.mark.slow),
            ("static", "tiny"),
            pytest.param("dynamic", "tiny", marks=pytest.mark.slow),
        ],
        tiny_cos=0.999,
        single=dict(model=dict(pooling="cls", act="gelu_tanh"), backend=dict(buckets=[32, 64]),
                    lens=[7, 2, 13], big=[20, 20, 20], seed=2, atol=1e-6),
        weight_only=dict(size=dict(max_tokens=64), backend=dict(buckets=[64]),
                         lens=([1], [30, 7, 19])),
        mixed_lens=([1], [5, 1, 9], [40, 3, 17], [2] * 20),
        linear=dict(size=dict(max_tokens=64), shape={}, buckets=[64], lens=([30, 5, 20],)),
    )  # fmt: skip


def _backend(model, opts=None, **kw):
    """opts: CudaOptions fields (the switches come in as arguments, not module globals)."""
    from zoi.backends.cuda.backend import CudaBackend
    from zoi.backends.cuda.options import CudaOptions

    options = CudaOptions(**(opts or {}))
    return CudaBackend(model, interpret=None if COMPILED else True, options=options, **kw)


def _shape(shape):
    return MINILM if shape == "minilm" else {}


def _launches(be):
    """Launches per bucket of its plan: what the backend
    reports, where no bucket runs as one persistent launch (compiled, small buckets may)."""
    n = {tb: len(be.plan_for(tb)["launches"]) for tb in be.buckets}
    if not COMPILED:
        assert be.memory()["kernels_per_forward"] == n
    return n


# INT8: the slow tier (~35 s in the interpreter). Its symmetric dynamic linears (o / ffn2 quantising
# on load, qkv / ffn1 reading their LN producer's copy) against the float64 reference are
# test_static_scheme_and_unfused_layernorm's dynamic linears; every INT8 scheme is
# test_mixed_schemes_transforms_and_float_linears'; scripts/gpu_check.sh runs it compiled
@pytest.mark.parametrize("precision", ["fp16", pytest.param("int8", marks=pytest.mark.slow)])
@pytest.mark.parametrize("shape", M.shapes)
def test_forward_matches_reference(precision, shape):
    model = tiny_model(precision, **M.size, **_shape(shape))
    be = _backend(model, **M.plan)
    assert be.buckets[0] == 16 and be.buckets[-1] == M.size["max_tokens"]
    ref = ReferenceBackend(model, dtype=np.float64)
    rng = np.random.default_rng(1)
    L = model.spec.layers
    if precision == "int8":
        # qkv / ffn1 read the int8 copy their LN producer wrote (pure int8 GEMM); o / ffn2
        # (symmetric, no transform) quantise the fp16 output of attention / ffn1 on load
        quants = {
            la.extra["prefix"].split(".")[1]: la.quant
            for la in be.plan["launches"]
            if la.kind == "linear"
        }
        assert quants == {"qkv": 4, "o": 1, "ffn1": 4, "ffn2": 1}
    assert _launches(be) == {tb: 1 + 7 * L + 1 for tb in be.buckets}
    for lens in M.lens:
        ids, pos, cu = batch(lens, seed=rng)
        for norm in (False, True):
            got = be.run(ids, pos, cu, norm)
            want = ref.run(ids, pos, cu, norm)
            assert got.shape == want.shape and got.dtype == np.float32
            tol = 5e-3 if precision == "fp16" else 3e-2
            assert rel(got, want) < tol, (lens, norm, rel(got, want))
            assert min_cosine(got, want) > (0.9999 if precision == "fp16" else 0.999)


def test_later_calls_not_corrupted_and_batched_equals_single():
    c = M.single
    model = tiny_model("int8", **c["model"])
    be = _backend(model, **c["backend"])
    rng = np.random.default_rng(c["seed"])
    ids, pos, cu = batch(c["lens"], seed=rng)
    first = be.run(ids, pos, cu, True)
    big = batch(c["big"], seed=rng)
    be.run(*big, False)  # a bigger call in another bucket, then the same small one again
    again = be.run(ids, pos, cu, True)
    np.testing.assert_array_equal(first, again)
    for b in range(len(c["lens"])):
        a, e = cu[b], cu[b + 1]
        one = be.run(ids[a:e], pos[a:e], np.array([0, e - a], np.int32), True)
        np.testing.assert_allclose(one[0], first[b], rtol=0, atol=c["atol"])


def test_static_scheme_and_unfused_layernorm():
    model = tiny_model("int8", static={"l0.ffn2": 4.0, "l1.qkv": 6.0}, act="relu", pooling="max")
    be = _backend(model, buckets=[32, 64])
    assert _launches(be) == {
        32: 1 + 7 * model.spec.layers + 1,
        64: 1 + 7 * model.spec.layers + 1,
    }
    ref = ReferenceBackend(model, dtype=np.float64)
    ids, pos, cu = batch([30, 11], seed=np.random.default_rng(3))
    got, want = be.run(ids, pos, cu, False), ref.run(ids, pos, cu, False)
    assert rel(got, want) < 3e-2 and min_cosine(got, want) > 0.999


def _check(be, model, cases, tol=3e-2, cos=0.999):
    """INT8: rel below tol and min cosine above cos, or within 2x the error (rel, 1 - min
    cosine) of the naive fp16-storage emulation (fp16_storage_emulation: the tiny artifacts
    lose to fp16 storage what tol / cos do not cover)."""
    ref = ReferenceBackend(model, dtype=np.float64)
    rng = np.random.default_rng(11)
    worst = 0.0
    for lens in cases:
        ids, pos, cu = batch(lens, model.spec.vocab_size, rng)
        for norm in (False, True):
            got, want = be.run(ids, pos, cu, norm), ref.run(ids, pos, cu, norm)
            assert got.shape == want.shape and np.isfinite(got).all()
            e, c = rel(got, want), min_cosine(got, want)
            worst = max(worst, e)
            bound, cbound = tol, cos
            if (e >= tol or c <= cos) and model.precision == "int8":
                naive, gold = fp16_storage_emulation(model, ids, pos, cu, norm)
                bound = max(tol, 2 * rel(naive, gold))
                cbound = min(cos, 1 - 2 * (1 - min_cosine(naive, gold)))
            assert e < bound and c > cbound, (lens, norm, e, bound, c, cbound)
    return worst


def _kinds(be):
    return [
        (la.kind, la.extra.get("prefix", ""), la.quant)
        for la in be.plan["launches"]
        if la.kind in ("linear", "quantize")
    ]


@pytest.mark.parametrize("config,shape", M.quant_cases)
def test_default_quant_config_artifact_matches_reference(config, shape):
    """An artifact of zoi.quant's default config (and variants) runs on the cuda backend
    as the reference backend runs it: per-token asymmetric UINT8 + SmoothQuant act_mul [+
    act_shift], quantize launches before o / ffn2."""
    config, needs = NEEDS[config]
    kw = dict(_shape(shape), layers=2) if shape == "minilm" else None
    model = default_quant_model(**M.size, shape=kw, **config)
    assert required_quant_features(model.weights, model.quant) == needs
    be = _backend(model, **M.plan)
    L = model.spec.layers
    # qkv / ffn1 read the int8 copy their whole-row producer (embed, LN) wrote; o / ffn2
    # (after attention / ffn1, tile producers) read one from a quantize launch when they are
    # asymmetric or have an act_mul / act_shift, else quantise in the GEMM's loop
    want, n_q = [], 0
    for p, q in model.quant.items():
        role, tr = p.split(".")[1], f"{p}.act_mul" in model.weights
        if role in ("qkv", "ffn1") or q.scheme == "dynamic_asym" or tr:
            n_q += role in ("o", "ffn2")
            want.append((p, 4))
        else:
            want.append((p, 1 if q.scheme == "dynamic" else 2))
    k = _kinds(be)
    assert sorted((p, q) for kind, p, q in k if kind == "linear") == sorted(want), k
    assert [kind for kind, *_ in k].count("quantize") == n_q, k
    if config == {}:
        assert n_q == 2 * L  # o is asymmetric, ffn2 has an act_mul
    # a first-row residual (QuantConfig.first_row_residual) adds no launch: the embedding writes
    # the row map, each linear its own second quantisation
    assert _launches(be) == {tb: 1 + 7 * L + n_q + 1 for tb in be.buckets}
    cos = M.tiny_cos if shape == "tiny" else 0.999
    worst = _check(be, model, M.quant_lens, cos=cos)
    print(f"{config}: worst rel {worst:.2e}")


@pytest.mark.parametrize("shape", M.shapes)
def test_mixed_schemes_transforms_and_float_linears(shape):
    """Every scheme and transform in one model: asym / sym / static, act_mul with and without
    act_shift on whole-row and tile producers, a float linear and a weight-only INT8 linear
    with an act_mul (folded into the fp16 weights at pack time)."""
    model = tiny_model("int8", **M.size, **MIXED, **_shape(shape))
    assert required_quant_features(model.weights, model.quant) == set(
        ("dynamic", "static", "dynamic_asym", "act_mul", "act_shift", "weight_only")
    )
    be = _backend(model, **M.plan)
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
    assert _kinds(be) == want
    assert be.w["l1.ffn2.w"].dtype == be.torch.float16 and "l1.ffn2.w_q" not in be.w
    assert be.w["l1.o.colsum"].dtype == be.torch.int32 and "l0.o.colsum" not in be.w
    _check(be, model, M.mixed_lens)


def test_weight_only_artifact():
    """The quantiser's weight-only fallback (scheme fp32 with w_q): fp16 weights
    dequantised at pack time, float compute; matches the reference to fp16 accuracy."""
    c = M.weight_only
    model = default_quant_model(
        **c["size"], sensitivity_db=60.0, fallback_weights="int8", max_weight_ratio=None
    )
    assert required_quant_features(model.weights, model.quant) == {"weight_only"}
    be = _backend(model, **c["backend"])
    assert {q for *_, q in _kinds(be)} == {0}
    assert all(la.quant == 0 for la in be.plan["launches"] if la.kind == "linear")
    assert all(f"{p}.w" not in model.weights for p in model.quant)
    _check(be, model, c["lens"], tol=5e-3, cos=0.9999)


@pytest.mark.parametrize("which", ["default", "mixed"])
def test_every_linear_matches_the_emulation_on_its_own_input(which):
    """Tight: each linear's output against the INT8 emulation (scheme, act_shift, act_mul)
    run on the exact fp16 input the kernel read; only fp16 output rounding may differ."""
    c = M.linear
    if which == "default":
        shape = dict(c["shape"], layers=2) if c["shape"] else None
        model = default_quant_model(**c["size"], shape=shape, smooth_shift=True)
    else:
        model = tiny_model("int8", **c["size"], **MIXED, **c["shape"])
    be = _backend(model, buckets=c["buckets"])
    for lens in c["lens"]:
        errs = linear_same_input_errors(be, model, lens)
        assert len(errs) == 4 * model.spec.layers
        assert max(errs.values()) < 1e-3, (lens, errs)


@pytest.mark.gpu
@compiled_only
@pytest.mark.parametrize("pdl", [False, True])
def test_concurrent_callers(pdl):
    model = tiny_model("fp16", max_tokens=256, max_batch=32)
    be = _backend(model, pdl=pdl)
    rng = np.random.default_rng(4)
    cases = [batch(lens, seed=rng) for lens in ([3], [20, 5], [40, 40, 1], [12] * 10)]
    want = [be.run(*c, True) for c in cases]
    errors = []

    def worker(k):
        for i in range(30):
            c = (k + i) % len(cases)
            got = be.run(*cases[c], True)
            if not np.array_equal(got, want[c]):
                errors.append((k, i))

    ts = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors


@pytest.mark.gpu
@compiled_only
def test_memory_report():
    model = tiny_model("int8", max_tokens=128, max_batch=8, **MINILM)
    mem = _backend(model).memory()
    assert mem["weights_bytes"] > 0 and mem["arena_bytes"] > 0
    assert all(n > 0 for n in mem["graph_nodes"].values())


@pytest.mark.gpu
@compiled_only
@pytest.mark.parametrize("mode", ["force", "off", "time"])
def test_small_bucket_paths(mode):
    """Buckets <= 256 tokens: the persistent one-launch forward (forced), the per-op graph
    (persistent="off", the default), or both timed at compile time and the faster kept. Every
    choice is captured, matches the reference, and repeats bit for bit (the grid barrier
    resets across launches)."""
    model = tiny_model("fp16", max_tokens=512, max_batch=64, **MINILM)
    be = _backend(model, opts=dict(persistent=mode), buckets=[16, 128, 512])
    paths = be.memory()["bucket_paths"]
    assert paths[512]["path"] == "per-op"
    for tb in (16, 128):
        p = paths[tb]
        if mode == "force":
            assert p["path"] == "persistent"
        elif mode == "off":
            assert p["path"] == "per-op"
        else:  # both timed, the faster kept
            assert p["persistent_us"] > 0 and p["per_op_us"] > 0
            faster = "persistent" if p["persistent_us"] <= p["per_op_us"] else "per-op"
            assert p["path"] == faster
    ref = ReferenceBackend(model, dtype=np.float64)
    rng = np.random.default_rng(11)
    for lens in ([1], [7, 9], [5, 1, 9, 40], [30] * 4 + [3], [2] * 64):
        ids, pos, cu = batch(lens, seed=rng)
        for norm in (False, True):
            got, want = be.run(ids, pos, cu, norm), ref.run(ids, pos, cu, norm)
            assert np.isfinite(got).all()
            assert rel(got, want) < 5e-3 and min_cosine(got, want) > 0.9999, (mode, lens, norm)
            np.testing.assert_array_equal(be.run(ids, pos, cu, norm), got)
