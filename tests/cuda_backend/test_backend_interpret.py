"""The whole CudaBackend (fusion, arena plan, call header, buckets) run eagerly through the
Triton interpreter on the CPU, against the float64 reference engine."""

from __future__ import annotations

import os

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("triton")

from tests.cuda_backend.cuda_helpers import batch, min_cosine, rel, tiny_model  # noqa: E402

from zoi.backends.reference import ReferenceBackend  # noqa: E402

pytestmark = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1", reason="interpreter run (the GPU runs test_gpu.py)"
)


def _backend(model, **kw):
    from zoi.backends.cuda.backend import CudaBackend

    return CudaBackend(model, interpret=True, **kw)


@pytest.mark.parametrize("precision", ["fp16", "int8"])
def test_forward_matches_reference(precision):
    model = tiny_model(precision)
    be = _backend(model, buckets=[16, 64], fuse_min_tokens=64)  # bucket 16 unfused, 64 fused
    ref = ReferenceBackend(model, dtype=np.float64)
    rng = np.random.default_rng(1)
    L = model.spec.layers
    if (
        precision == "int8"
    ):  # qkv / ffn1 read the int8 copy their LN producer wrote (pure int8 GEMM)
        quants = {
            la.extra["prefix"].split(".")[1]: la.quant
            for la in be.plans[True]["launches"]
            if la.kind == "linear"
        }
        assert quants == {"qkv": 4, "o": 1, "ffn1": 4, "ffn2": 1}
    assert be.memory()["kernels_per_forward"] == {
        16: 1 + 7 * L + 1,
        64: 1 + 5 * L + 1,
    }  # LN fused into o / ffn2
    for lens in ([1], [5, 1, 9], [40, 3, 17]):
        ids, pos, cu = batch(rng, lens)
        for norm in (False, True):
            got = be.run(ids, pos, cu, norm)
            want = ref.run(ids, pos, cu, norm)
            assert got.shape == want.shape and got.dtype == np.float32
            tol = 5e-3 if precision == "fp16" else 3e-2
            assert rel(got, want) < tol, (lens, norm)
            assert min_cosine(got, want) > (0.9999 if precision == "fp16" else 0.999)


def test_batched_equals_one_at_a_time():
    model = tiny_model("int8", pooling="cls", act="gelu_tanh")
    be = _backend(model, buckets=[64])
    rng = np.random.default_rng(2)
    lens = [7, 2, 13]
    ids, pos, cu = batch(rng, lens)
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
    ids, pos, cu = batch(np.random.default_rng(3), [30, 11])
    got, want = be.run(ids, pos, cu, False), ref.run(ids, pos, cu, False)
    assert rel(got, want) < 3e-2 and min_cosine(got, want) > 0.999
