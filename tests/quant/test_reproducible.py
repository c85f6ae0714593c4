"""Reproducible INT8 compiles: on one machine the same model, texts and options give the same
artifact bytes whatever the thread counts (the engine's, BLAS's); across the CPU core's ISAs
(ZOI_CPU_ISA), whose FP32 kernels round differently, the bytes may differ and the fidelity
stays within 1e-4 (docs/QUANT.md, "Reproducible compiles").

The subprocess tests compile in fresh processes and compare every file of the saved
artifacts, or their fidelity. The unit tests check zoi.quant.detmath's order-independence
(the quantiser's small reductions) and that GPTQ's integers depend on the Gram only.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from zoi.quant import detmath as D

# ---- detmath: order independence and accuracy -----------------------------------------


def test_fixed_sum_is_order_independent_and_close_to_exact():
    r = np.random.default_rng(1)
    for n in (1, 2, 7, 384, 1536, 10_000):
        x = (r.standard_normal(n) * np.exp(r.uniform(-8, 8, n))).astype(np.float32)
        s = D.fixed_sum(x)
        for _ in range(3):
            assert D.fixed_sum(x[r.permutation(n)]).tobytes() == s.tobytes()
        exact = math.fsum(float(v) for v in x)
        assert abs(float(s) - exact) <= n * 2.0 ** -(52 - D._bits(n)) * float(np.abs(x).max())
    # a float32 pairwise sum and a float64 sum of the same numbers differ; fixed_sum does not care
    x = r.standard_normal(4099).astype(np.float32)
    assert float(x.sum()) != float(x.astype(np.float64).sum())
    assert D.fixed_sum(x).tobytes() == D.fixed_sum(x.astype(np.float64)[::-1]).tobytes()
    assert D.fixed_sum(np.zeros((3, 0)), 1).shape == (3,)
    assert not np.isfinite(D.fixed_sum(np.array([1.0, np.nan])))


def test_det_matmul_order_independent_and_accurate():
    r = np.random.default_rng(2)
    for K in (1, 5, 64, 384, 1536):
        a = r.standard_normal((9, K)).astype(np.float32)
        b = r.standard_normal((7, K)).astype(np.float32)
        y = D.det_matmul(a, b)
        p = r.permutation(K)
        assert D.det_matmul(a[:, p], b[:, p]).tobytes() == y.tobytes()  # another summation order
        ref = a.astype(np.float64) @ b.astype(np.float64).T
        tol = 2.0**-20 * np.abs(a).max(1)[:, None] * np.abs(b).max(1)[None, :] * K
        assert np.all(np.abs(y - ref) <= tol)
        y2 = D.det_matmul(a, b, limbs=2)
        assert D.det_matmul(a[:, p], b[:, p], limbs=2).tobytes() == y2.tobytes()
        assert np.allclose(y2, ref, rtol=0, atol=1e-10 * float(np.abs(ref).max() + 1))
    s = D.det_matmul(a)  # symmetric product
    assert np.array_equal(s, s.T) and np.allclose(s, a.astype(np.float64) @ a.T, atol=1e-3)
    batched = D.det_matmul(a[None].repeat(3, 0), b[None].repeat(3, 0))
    assert batched.shape == (3, 9, 7) and np.array_equal(batched[1], y)
    with pytest.raises(FloatingPointError, match="non-finite"):
        D.det_matmul(np.array([[np.inf]]), np.array([[1.0]]))


def test_det_exp_log_pow_accuracy():
    r = np.random.default_rng(3)
    x = r.uniform(-700, 700, 20000)
    assert np.max(np.abs(D.det_exp(x) / np.exp(x) - 1)) < 1e-14
    assert D.det_exp(np.array([-800.0]))[0] == 0 and np.isinf(D.det_exp(np.array([800.0]))[0])
    y = np.exp(r.uniform(-300, 300, 20000))
    assert np.max(np.abs(D.det_log(y) - np.log(y))) < 1e-12
    assert np.max(np.abs(D.det_pow(y, 0.37) / y**0.37 - 1)) < 1e-12
    assert D.det_pow(np.array([0.0, 4.0]), 0.5).tolist() == [0.0, 2.0]


def test_gptq_integers_independent_of_gram_summation_order():
    """GPTQ from one Gram summed in two orders (float64 BLAS vs det): same Gram -> same ints;
    and the deterministic Gram itself is the same for tokens in any order."""
    from zoi.quant.gptq import gptq_quantize

    r = np.random.default_rng(4)
    x = r.standard_normal((700, 96)).astype(np.float32)
    w = r.standard_normal((40, 96)).astype(np.float32)
    g1 = D.det_matmul(np.ascontiguousarray(x.T))
    g2 = D.det_matmul(np.ascontiguousarray(x[r.permutation(700)].T))
    assert g1.tobytes() == g2.tobytes()
    q1, s1 = gptq_quantize(w, g1)
    q2, s2 = gptq_quantize(w, g2)
    assert q1.tobytes() == q2.tobytes() and s1.tobytes() == s2.tobytes()
    # and GPTQ still lowers the output error against plain rounding
    from zoi.numerics.primitives import quantize_weight

    def err(q, s):
        d = (q.astype(np.float64) * s[:, None] - w).T
        return float(np.sum((x.astype(np.float64) @ d) ** 2))

    assert err(q1, s1) < err(*quantize_weight(w))


# ---- the whole compile, twice, in other environments -----------------------------------

_COMPILE = textwrap.dedent(
    """
    import json, sys, numpy as np
    import zoi
    from zoi.data import calibration_texts
    src, out, variant = sys.argv[1], sys.argv[2], sys.argv[3]
    cfg = {"max_calib_texts": 96, "search_texts": 24, "sqnr_texts": 24}
    if variant == "static":
        cfg.update(activations="static", observer="mse", smooth_shift=True)
    eng = zoi.compile(src, device="reference", precision="int8",
                      calibration=calibration_texts(), quant_config=cfg)
    eng.save(out)
    from zoi import _cpu
    print(json.dumps({"isa": _cpu.active_isa()}))
    """
)


def _files(folder) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def _compile_in(env_extra: dict, src, out, variant: str) -> dict:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("OPENBLAS", "OMP_", "ZOI_NUM_THREADS", "ZOI_CPU_ISA"))
    }
    env.update(env_extra)
    env["SOURCE_DATE_EPOCH"] = "1700000000"
    r = subprocess.run(
        [sys.executable, "-c", _COMPILE, str(src), str(out), variant],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("variant", ["default", "static"])
def test_compile_bytes_identical_across_thread_counts(small_bert, tmp_path, variant):
    """One machine, one ISA: one thread everywhere against two (the engine's pool, BLAS)."""
    one = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "ZOI_NUM_THREADS": "1"}
    two = {"OPENBLAS_NUM_THREADS": "2", "OMP_NUM_THREADS": "2", "ZOI_NUM_THREADS": "2"}
    _compile_in(one, small_bert, tmp_path / "a", variant)
    _compile_in(two, small_bert, tmp_path / "b", variant)
    fa, fb = _files(tmp_path / "a"), _files(tmp_path / "b")
    assert set(fa) == {"zoi.json", "weights.safetensors", "tokenizer.json"}
    for name in fa:
        assert fa[name] == fb[name], f"{name} differs between the two compiles"
    meta = json.loads(fa["zoi.json"])
    inputs = meta["meta"]["inputs"]
    assert len(inputs["weights_sha256"]) == 64 and inputs["calibration_texts"] == 96
    assert meta["created"] == "2023-11-14T22:13:20Z"


def _fidelity(folder, texts) -> float:
    """Mean cosine of the artifact's emulated INT8 embeddings (numpy, the kernels' numerics)
    to the FP32 model's, on held-out texts."""
    import zoi

    eng = zoi.load(folder, device="reference")
    ref = zoi.compile(eng.model.meta["source"], device="reference", precision="fp32")
    a = eng.encode(texts, normalize_embeddings=True)
    b = ref.encode(texts, normalize_embeddings=True)
    return float(np.mean(np.sum(a.astype(np.float64) * b, axis=1)))


def test_fidelity_within_1e4_across_isas(small_bert, tmp_path):
    """Another ISA's FP32 kernels round the calibration activations differently in the last
    bits, so the artifact may differ; what it does stays within 1e-4 in mean cosine."""
    from tests.fixtures import supported_isas

    from zoi.data import eval_texts

    isas = [i for i in supported_isas() if i != "scalar"]
    isas = [isas[0], isas[-1]] if len(isas) > 1 else isas + ["scalar"]
    held = eval_texts()[:120]
    figs = {}
    for isa in isas:
        got = _compile_in({"ZOI_CPU_ISA": isa}, small_bert, tmp_path / isa, "default")
        assert got["isa"] == isa
        figs[isa] = _fidelity(tmp_path / isa, held)
    a, b = figs.values()
    assert a > 0.99 and b > 0.99, figs
    assert abs(a - b) <= 1e-4, figs
    same = _files(tmp_path / isas[0]) == _files(tmp_path / isas[1])
    print(f"fidelity per ISA {figs}; artifacts identical: {same}")
