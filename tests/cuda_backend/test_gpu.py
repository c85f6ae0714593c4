"""The whole CudaBackend on a real GPU (graphs, driver-API call path): run by scripts/gpu_check.sh.

Skips only when there is no CUDA GPU (CI). Compares with the float64 reference engine.
"""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from tests.cuda_backend.cuda_helpers import (  # noqa: E402
    MIXED,
    batch,
    default_quant_model,
    linear_same_input_errors,
    min_cosine,
    rel,
    tiny_model,
)

from zoi.backends.reference import ReferenceBackend  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1",
        reason="needs a CUDA GPU",
    ),
]

MINILM = dict(hidden=384, heads=12, layers=2, inter=1536)


def _be(model, **kw):
    from zoi.backends.cuda.backend import CudaBackend

    return CudaBackend(model, **kw)


@pytest.mark.parametrize("ln_fused", [False, True])
@pytest.mark.parametrize("precision", ["fp16", "int8"])
@pytest.mark.parametrize("shape", ["tiny", "minilm"])
def test_forward_matches_reference(precision, shape, ln_fused, monkeypatch):
    from zoi.backends.cuda import backend as bmod

    monkeypatch.setattr(bmod, "FUSE_LN", ln_fused)  # LN in the o / ffn2 epilogue: off by default
    monkeypatch.setattr(bmod, "ROWQ", precision == "int8")  # ROWQ too (off by default)
    kw = MINILM if shape == "minilm" else {}
    model = tiny_model(precision, max_tokens=512, max_batch=64, **kw)
    be = _be(model, fuse_min_tokens=128)  # buckets 16..64 unfused, 128..512 fused (ROWQ)
    assert be.buckets[0] == 16 and be.buckets[-1] == 512
    ref = ReferenceBackend(model, dtype=np.float64)
    rng = np.random.default_rng(7)
    for lens in ([1], [16], [17], [5, 1, 9, 40], [40] * 12 + [3], [2] * 64):
        ids, pos, cu = batch(lens, seed=rng)
        for norm in (False, True):
            got, want = be.run(ids, pos, cu, norm), ref.run(ids, pos, cu, norm)
            assert got.shape == want.shape
            tol = 5e-3 if precision == "fp16" else 3e-2
            assert rel(got, want) < tol, (lens, norm, rel(got, want))
            assert min_cosine(got, want) > (0.9999 if precision == "fp16" else 0.999)


def test_later_calls_not_corrupted_and_batched_equals_single():
    model = tiny_model("int8", max_tokens=256, max_batch=32, **MINILM)
    be = _be(model)
    rng = np.random.default_rng(3)
    ids, pos, cu = batch([30, 7, 19], seed=rng)
    first = be.run(ids, pos, cu, True)
    big = batch([40] * 6, seed=rng)
    be.run(*big, False)  # a bigger call in another bucket, then the same small one again
    again = be.run(ids, pos, cu, True)
    np.testing.assert_array_equal(first, again)
    for b in range(3):
        a, e = cu[b], cu[b + 1]
        one = be.run(ids[a:e], pos[a:e], np.array([0, e - a], np.int32), True)
        np.testing.assert_allclose(one[0], first[b], rtol=0, atol=2e-6)


@pytest.mark.parametrize("pdl", [False, True])
def test_concurrent_callers(pdl):
    model = tiny_model("fp16", max_tokens=256, max_batch=32)
    be = _be(model, pdl=pdl)
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


def test_memory_report():
    model = tiny_model("int8", max_tokens=128, max_batch=8, **MINILM)
    mem = _be(model).memory()
    assert mem["weights_bytes"] > 0 and mem["arena_bytes"] > 0
    assert all(n > 0 for n in mem["graph_nodes"].values())


def _check_int8(be, model, cases, tol=3e-2, cos=0.999):
    ref = ReferenceBackend(model, dtype=np.float64)
    rng = np.random.default_rng(9)
    for lens in cases:
        ids, pos, cu = batch(lens, model.spec.vocab_size, rng)
        for norm in (False, True):
            got, want = be.run(ids, pos, cu, norm), ref.run(ids, pos, cu, norm)
            assert got.shape == want.shape and np.isfinite(got).all()
            assert rel(got, want) < tol, (lens, norm, rel(got, want))
            assert min_cosine(got, want) > cos, (lens, norm)


@pytest.mark.parametrize(
    "config,shape",
    [
        ({}, "tiny"),
        ({}, "minilm"),
        ({"smooth_shift": True}, "minilm"),
        ({"activations": "static", "smooth_shift": True}, "tiny"),
    ],
)
def test_default_quant_artifact_matches_reference(config, shape):
    """zoi.quant's DEFAULT INT8 artifact (dynamic_asym + SmoothQuant act_mul [+ act_shift])
    compiled: unfused buckets (quantize launches before o / ffn2) and fused ones."""
    kw = dict(hidden=384, heads=12, inter=1536, layers=2) if shape == "minilm" else None
    model = default_quant_model(max_tokens=512, max_batch=64, shape=kw, **config)
    be = _be(model, fuse_min_tokens=128)  # buckets 16..64 unfused, 128..512 fused
    assert any(la.kind == "quantize" for la in be.plans[True]["launches"])
    # the 24-wide tiny model is sensitive: one requantisation step flipped by the fp16 rounding
    # of an activation moves a 2-token sequence's embedding visibly. The CPU interpreter shows
    # the same (min cosine 0.9926 for static + shift at [2] * 64; the H200 gave 0.9957 for both
    # configs): a property of the model, not of the GPU. The MiniLM-shaped cases keep 0.999.
    cos = 0.98 if shape == "tiny" else 0.999
    cases = ([1], [16], [17], [5, 1, 9, 32], [32] * 12 + [3], [2] * 64)
    _check_int8(be, model, cases, cos=cos)


@pytest.mark.parametrize("shape", ["tiny", "minilm"])
def test_mixed_int8_schemes_and_transforms(shape):
    model = tiny_model(
        "int8", max_tokens=512, max_batch=64, **MIXED, **(MINILM if shape == "minilm" else {})
    )
    be = _be(model, fuse_min_tokens=128)
    _check_int8(be, model, ([1], [17], [5, 1, 9, 40], [40] * 12 + [3], [2] * 64))


def test_weight_only_artifact():
    model = default_quant_model(
        max_tokens=256,
        max_batch=32,
        sensitivity_db=60.0,
        fallback_weights="int8",
        max_weight_ratio=None,
    )
    be = _be(model)
    assert all(la.quant == 0 for la in be.plans[True]["launches"] if la.kind == "linear")
    _check_int8(be, model, ([1], [30, 7, 19], [32] * 8), tol=5e-3, cos=0.9999)


@pytest.mark.parametrize("rowq", [False, True])
@pytest.mark.parametrize("which", ["default", "mixed"])
def test_every_linear_matches_the_emulation_on_its_own_input(which, rowq, monkeypatch):
    """rowq: every bucket runs the fused plan, where ffn1 writes ffn2's int8 copy itself."""
    from zoi.backends.cuda import backend as bmod

    monkeypatch.setattr(bmod, "ROWQ", rowq)
    if which == "default":
        kw = dict(hidden=384, heads=12, inter=1536, layers=2)
        model = default_quant_model(max_tokens=256, max_batch=32, shape=kw, smooth_shift=True)
    else:
        model = tiny_model("int8", max_tokens=256, max_batch=32, **MIXED, **MINILM)
    be = _be(model, buckets=[32, 256], fuse_min_tokens=0 if rowq else 10**9)
    if rowq:
        assert any(la.extra.get("q") for la in be.plans[True]["launches"] if la.kind == "linear")
    for lens in ([3, 20], [32] * 7 + [5]):
        errs = linear_same_input_errors(be, model, lens)
        assert len(errs) == 4 * model.spec.layers
        assert max(errs.values()) < 1e-3, (lens, errs)


@pytest.mark.parametrize("mode", ["force", "off", "time"])
def test_small_bucket_paths(mode, monkeypatch):
    """Buckets <= 256 tokens: the persistent one-launch forward (forced), the per-op graph
    (ZOI_PERSISTENT=0), or both timed at compile time and the faster kept (default). Every
    choice is captured, matches the reference, and repeats bit for bit (the grid barrier
    resets across launches)."""
    env = {"force": "1", "off": "0"}
    if mode in env:
        monkeypatch.setenv("ZOI_PERSISTENT", env[mode])
    else:
        monkeypatch.delenv("ZOI_PERSISTENT", raising=False)
    model = tiny_model("fp16", max_tokens=512, max_batch=64, **MINILM)
    be = _be(model, buckets=[16, 128, 512])
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
