"""Reproducible INT8 compiles (issue 21): the same model, texts and options give the same
artifact bytes whatever the BLAS thread count / kernel and numpy's SIMD paths.

The subprocess test compiles twice with different OpenBLAS threads and core types (which
change plain float32 / float64 BLAS results here: `teeth`) and compares every file of the
saved artifacts. The unit tests check the order-independence of zoi.quant.detmath directly:
the same numbers summed in another order (what another BLAS or numpy does) give the same bits.
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


@pytest.mark.parametrize("K", [1, 3, 64, 65, 200])
def test_det_cholesky_upper_inverse(K):
    r = np.random.default_rng(K)
    X = r.standard_normal((3 * K + 5, K))
    H = X.T @ X + 0.1 * np.eye(K)
    L = D.det_cholesky_lower(H)
    assert np.allclose(L, np.linalg.cholesky(H), atol=1e-10 * np.abs(L).max())
    U = D.det_cholesky_upper_inv(H)
    assert np.allclose(np.triu(U), U)
    assert np.allclose(U.T @ U, np.linalg.inv(H), atol=1e-9 * np.abs(np.linalg.inv(H)).max())
    with pytest.raises(np.linalg.LinAlgError):
        D.det_cholesky_lower(-np.eye(K))


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
    import hashlib, json, sys, numpy as np
    import zoi
    from zoi.data import calibration_texts
    src, out, variant = sys.argv[1], sys.argv[2], sys.argv[3]
    cfg = {"max_calib_texts": 96, "search_texts": 24, "sqnr_texts": 24}
    if variant == "static":
        cfg.update(activations="static", observer="mse", smooth_shift=True)
    eng = zoi.compile(src, device="reference", precision="int8",
                      calibration=calibration_texts(), quant_config=cfg)
    eng.save(out)
    r = np.random.default_rng(0)
    a = r.standard_normal((300, 1536)).astype(np.float32)
    b = r.standard_normal((384, 1536)).astype(np.float32)
    teeth = hashlib.sha256((a @ b.T).tobytes() + np.linalg.inv(a[:200, :200].astype(float)).tobytes()).hexdigest()
    print(json.dumps({"teeth": teeth}))
    """
)


def _files(folder) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def _compile_in(env_extra: dict, src, out, variant: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENBLAS", "OMP_"))}
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
def test_compile_bytes_identical_across_threads_and_blas_kernels(small_bert, tmp_path, variant):
    env_a = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    env_b = {"OPENBLAS_NUM_THREADS": "2", "OMP_NUM_THREADS": "2", "OPENBLAS_CORETYPE": "Prescott"}
    ta = _compile_in(env_a, small_bert, tmp_path / "a", variant)
    tb = _compile_in(env_b, small_bert, tmp_path / "b", variant)
    fa, fb = _files(tmp_path / "a"), _files(tmp_path / "b")
    assert set(fa) == {"zoi.json", "weights.safetensors", "tokenizer.json"}
    for name in fa:
        assert fa[name] == fb[name], f"{name} differs between the two compiles"
    meta = json.loads(fa["zoi.json"])
    inputs = meta["meta"]["inputs"]
    assert len(inputs["weights_sha256"]) == 64 and inputs["calibration_texts"] == 96
    assert meta["created"] == "2023-11-14T22:13:20Z"
    # the two environments do give other float bits for plain BLAS on this machine
    # (recorded, not required: a BLAS without these knobs still has to give equal artifacts)
    print("plain BLAS results differ between the environments:", ta["teeth"] != tb["teeth"])


# ---- another numpy major version ------------------------------------------------------

_OTHER_NUMPY = "1.26.4" if np.__version__.startswith("2.") else "2.2.6"
_VENV_DEPS = [
    f"numpy=={_OTHER_NUMPY}",
    "tokenizers>=0.19,<1",
    "safetensors>=0.4,<1",
    "tqdm",
    "rich",
]
# run zoi from this checkout's src/, not from the editable install's finder
_SRC_ONLY = (
    "import sys; sys.meta_path = [f for f in sys.meta_path if 'editable' not in "
    "type(f).__module__ and 'skbc' not in type(f).__module__]; sys.path.insert(0, {src!r})\n"
)


def _other_numpy_python() -> str:
    """A cached venv (~/.cache/zoi) with the other numpy major version and zoi's runtime deps."""
    from pathlib import Path

    tag = f"py{sys.version_info.major}{sys.version_info.minor}-numpy{_OTHER_NUMPY}"
    root = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "zoi" / f"venv-{tag}"
    py = root / "bin" / "python"
    stamp = root / ".zoi-ready"
    if not stamp.exists():
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(root)], check=True)
        r = subprocess.run(
            [str(py), "-m", "pip", "install", "-q", *_VENV_DEPS],
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert r.returncode == 0, f"pip could not install {_VENV_DEPS}: {r.stderr[-2000:]}"
        stamp.write_text("ok")
    return str(py)


@pytest.mark.slow  # builds a second virtual environment: the slow tier
def test_compile_bytes_identical_across_numpy_major_versions(small_bert, tmp_path):
    """numpy 2.x (this venv) against 1.26 (a cached venv; or the reverse), with other
    OpenBLAS builds too (each numpy wheel bundles its own)."""
    from pathlib import Path

    src = str(Path(__file__).resolve().parents[2] / "src")
    other = _other_numpy_python()
    code = _SRC_ONLY.format(src=src) + _COMPILE
    outs = []
    for py, name in ((sys.executable, "here"), (other, "other")):
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env["SOURCE_DATE_EPOCH"] = "1700000000"
        r = subprocess.run(
            [
                py,
                "-c",
                code + "\nprint(np.__version__)",
                str(small_bert),
                str(tmp_path / name),
                "default",
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert r.returncode == 0, r.stderr[-3000:]
        outs.append(r.stdout.strip().splitlines()[-1])
    assert outs[0] == np.__version__ and outs[1] == _OTHER_NUMPY, outs
    fa, fb = _files(tmp_path / "here"), _files(tmp_path / "other")
    for name in fa:
        assert fa[name] == fb[name], f"{name} differs between numpy {outs[0]} and {outs[1]}"
