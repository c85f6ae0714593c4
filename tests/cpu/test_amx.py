"""The AMX-INT8 tile GEMM (csrc/kernels/gemm_amx.cc, ISA "amx"): exact integer sums on adversarial
integers at awkward M / N / K (the 16-row and 64-k tile tails, the 48-column panels), and
bit-identical fused outputs (dequant, bias, GELU, residual) with the vnni kernel, 1-3 threads.
CpuOptions(amx_min_m=1) (ZOI_AMX_MIN_M=1) sends every M to the tile kernel (by default small M goes to vnni's).

On a machine without AMX (or where Linux refuses the tile-data permission) "amx" is not in
supported_isas(): the exactness tests run on no ISA there, and the refusal test checks that
ZOI_CPU_ISA=amx is refused with a clear error instead."""

from __future__ import annotations

import os
import subprocess
import sys
import zlib

import numpy as np
import pytest
from helpers import batch, make_model, small_spec, supported_isas

from zoi import _cpu
from zoi.backends.cpu import CpuBackend
from zoi.backends.cpu.options import CpuOptions

HAS_AMX = "amx" in supported_isas()
needs_amx = pytest.mark.skipif(not HAS_AMX, reason="no AMX-INT8 on this CPU (refusal tested below)")

# every size of the brief on each axis: M 1, 3, 17, 129, 4096; N 384, 1536, 7, 33; K 384, 1536, 37
SHAPES = [
    (1, 384, 384),
    (3, 7, 1536),
    (17, 1536, 37),
    (129, 33, 1536),
    (129, 1536, 384),
    (4096, 33, 37),
    (4096, 384, 384),
    (17, 7, 384),
    (3, 33, 37),
    (16, 48, 64),  # exactly one tile step, no tails
    (33, 97, 100),  # K tail of 36, two row tails
    # the 2 x 2 blocks (32 rows x 2 column groups of 16): a lone last row tile (48), a lone last
    # group (N 80: 5 groups; N 17: a 1-column group), pairs straddling the 48-column panels, K tail
    # on every block kind, the row tail inside a row pair (31, 47)
    (32, 64, 128),
    (48, 80, 192),
    (31, 49, 260),
    (47, 17, 64),
    (64, 144, 1536),
    (1024, 1152, 384),
]


def _rng(*key):
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def _w(N, K, rng):
    w = rng.integers(-127, 128, (N, K)).astype(np.int8)
    k = np.arange(K)
    pats = [np.full(K, 127), np.full(K, -127), np.where(k % 2 == 0, 127, -127)]
    for r, pat in zip(sorted({0, N // 2, N - 1}), pats, strict=False):
        w[r] = pat
    return w


def _exact(q, w, zp=None):
    acc = q.astype(np.float64) @ w.astype(np.float64).T  # exact: |sum| < 2**53
    if zp is not None:
        acc -= zp.astype(np.float64)[:, None] * w.astype(np.float64).sum(1)[None, :]
    return acc.astype(np.int64)


@pytest.fixture
def all_m_to_amx():
    CpuOptions(amx_min_m=1).apply()
    yield
    CpuOptions().apply()


@needs_amx
@pytest.mark.parametrize("M,N,K", SHAPES)
def test_amx_gemm_exact_adversarial(M, N, K, all_m_to_amx):
    rng = _rng("amx", M, N, K)
    w = _w(N, K, rng)
    k = np.arange(K)
    q = rng.integers(-127, 128, (M, K)).astype(np.int16)
    for i, r in enumerate([np.full(K, 127), np.full(K, -127), np.where(k % 2 == 0, 127, -127)]):
        if i < M:
            q[M - 1 - i if i else 0] = r
    want = _exact(q, w)
    for nt in (1, 3):
        out = np.full((M, N), -(2**31), np.int32)  # poisoned
        _cpu.k_gemm_s32(q, None, w, out, "amx", nt)
        np.testing.assert_array_equal(out, want, err_msg=f"amx sym nt={nt}")
    qa = rng.integers(0, 256, (M, K)).astype(np.int16)
    zp = rng.integers(0, 256, M).astype(np.int32)
    for i, (v, z) in enumerate([(0, 255), (255, 0), (0, 0), (255, 255), (128, 128)]):
        if i < M:
            qa[i], zp[i] = v, z
    want = _exact(qa, w, zp)
    for nt in (1, 2):
        out = np.full((M, N), -(2**31), np.int32)
        _cpu.k_gemm_s32(qa, zp, w, out, "amx", nt)
        np.testing.assert_array_equal(out, want, err_msg=f"amx asym nt={nt}")
    assert np.abs(want).max() >= 127 * 127 * K  # the extremes were reached


@needs_amx
@pytest.mark.parametrize("M,N,K", [(1, 33, 37), (17, 384, 1536), (129, 1536, 384), (300, 7, 100)])
@pytest.mark.parametrize("act", ["none", "gelu"])
@pytest.mark.parametrize("asym", [False, True])
def test_amx_fused_epilogue_bit_identical_to_vnni(M, N, K, act, asym, all_m_to_amx):
    rng = _rng("amx-epi", M, N, K, act, asym)
    x = (rng.standard_normal((M, K)) * 3).astype(np.float32)
    w = _w(N, K, rng)
    ws = (rng.random(N) * 0.02 + 1e-3).astype(np.float32)
    b = rng.standard_normal(N).astype(np.float32)
    res = rng.standard_normal((M, N)).astype(np.float32)
    outs = {}
    for isa in ("vnni", "amx"):
        for nt in (1, 3):
            for r in (None, res):
                y = np.full((M, N), np.nan, np.float32)  # poisoned
                _cpu.k_linear_i8(x, w, ws, b, act, r, -1.0, y, isa, nt, asym)
                assert np.isfinite(y).all(), (isa, nt)
                outs[isa, nt, r is None] = y
    for key, y in outs.items():
        ref = outs["vnni", 1, key[2]]
        np.testing.assert_array_equal(y, ref, err_msg=str(key))
    assert not np.array_equal(outs["amx", 1, True], outs["amx", 1, False])  # the residual is added


@needs_amx
def test_amx_small_m_goes_to_vnni_and_matches():
    """The default M threshold: both sides of it give vnni's integers."""
    CpuOptions().apply()
    assert _cpu.amx_thresholds()[0] == 16
    rng = _rng("amx-thr")
    w = _w(384, 384, rng)
    for M in (1, 15, 16, 17, 64):
        q = rng.integers(-127, 128, (M, 384)).astype(np.int16)
        out = np.full((M, 384), -(2**31), np.int32)
        _cpu.k_gemm_s32(q, None, w, out, "amx", 2)
        np.testing.assert_array_equal(out, _exact(q, w), err_msg=f"M={M}")


def test_amx_detection_consistent():
    info = _cpu.cpu_info()
    if HAS_AMX:
        assert info["amx_tile"] and info["amx_int8"] and _cpu.isa_supported("vnni")
        assert _cpu.kernel_layout("amx")["isa"] == "amx"
        # the same packed panels as vnni (one weight format, small M on vnni's kernel)
        assert _cpu.kernel_layout("amx")["i8_panel"] == _cpu.kernel_layout("vnni")["i8_panel"]
    else:
        with pytest.raises(ValueError):
            _cpu.kernel_layout("amx")
        env = dict(os.environ, ZOI_CPU_ISA="amx")
        r = subprocess.run(
            [
                sys.executable,
                "-c",
                "from zoi.backends.cpu.options import CpuOptions, apply_cpu_options; "
                "apply_cpu_options(CpuOptions.from_env())",
            ],
            env=env,
            capture_output=True,
            text=True,
        )
        assert r.returncode != 0 and "not supported by this CPU" in r.stderr, r.stderr


def _aligned(shape, fill=np.nan):
    n = int(np.prod(shape))
    buf = np.full(n + 16, fill, np.float32)
    off = (-buf.ctypes.data % 64) // 4
    y = buf[off : off + n].reshape(shape)
    assert y.ctypes.data % 64 == 0
    return y


@needs_amx
@pytest.mark.parametrize("M,N,K", [(129, 1536, 384), (40, 400, 100), (300, 96, 1536)])
@pytest.mark.parametrize("act", ["none", "gelu"])
def test_amx_streaming_stores_bit_identical(M, N, K, act, request):
    """Large float outputs leave the tile epilogue through streaming stores (64-byte aligned rows:
    CpuOptions.amx_nt_bytes=1 forces them at any size); the last partial panel (N = 400) keeps
    the masked stores. Same bits as vnni, residual and poisoned output included."""
    CpuOptions(amx_nt_bytes=1).apply()
    request.addfinalizer(lambda: CpuOptions().apply())
    rng = _rng("amx-nt", M, N, K, act)
    x = rng.standard_normal((M, K)).astype(np.float32)
    w = _w(N, K, rng)
    ws = (rng.random(N) * 0.02 + 1e-3).astype(np.float32)
    b = rng.standard_normal(N).astype(np.float32)
    res = rng.standard_normal((M, N)).astype(np.float32)
    y_ref = np.full((M, N), np.nan, np.float32)
    _cpu.k_linear_i8(x, w, ws, b, act, res, -1.0, y_ref, "vnni", 1)
    for nt in (1, 3):
        y = _aligned((M, N))
        _cpu.k_linear_i8(x, w, ws, b, act, res, -1.0, y, "amx", nt)
        np.testing.assert_array_equal(y, y_ref, err_msg=f"nt={nt}")


@needs_amx
@pytest.mark.parametrize("lengths", [[100, 100, 100], [77, 131, 49, 3], [128] * 8])
@pytest.mark.parametrize("nt", [1, 2])
def test_amx_engine_bit_identical_to_vnni(lengths, nt, monkeypatch):
    """A whole INT8 forward through the engine, amx (the tile kernel from 16 rows, its fused row
    quantisation of the GELU output from the plan's 256 rows: T = 300, 260, 1024) against vnni:
    the same bits. Awkward widths: K 96 (one tile step + a 32-byte K tail), FFN 200 (13 column
    groups: a lone last group; K tail 8), T % 32 = 12 / 4 / 0."""
    monkeypatch.delenv("ZOI_AMX_MIN_M", raising=False)
    spec = small_spec(hidden=96, heads=4, intermediate=200, layers=2, max_positions=160)
    T = sum(lengths)
    m = make_model(spec, "int8", max_tokens=T, max_batch=len(lengths), seed=3)
    ids, pos, cu = batch(lengths, spec.vocab_size, seed=len(lengths))
    outs = {}
    for isa in ("vnni", "amx"):
        be = CpuBackend(m, isa=isa, nthreads=nt)
        assert be.isa == isa
        # the FFN2 input copy is made by the FFN1 GEMM's epilogue at these T (the fused path)
        assert any(who == "linear" for _, _, who in be.describe(T)), be.describe(T)
        out = be.run(ids, pos, cu, False)
        assert np.isfinite(out).all(), isa
        outs[isa] = out
    np.testing.assert_array_equal(outs["amx"], outs["vnni"])


@needs_amx
@pytest.mark.parametrize("M,N,K", [(1024, 1536, 384), (256, 384, 1536), (300, 200, 96)])
def test_amx_gelu_residual_bit_identical_to_vnni_large(M, N, K):
    """MiniLM-sized GEMMs at the engine's M (the 2 x 2 pipeline over many blocks), GELU and
    residual epilogues, 1 and 2 threads, poisoned outputs, NaN never passes."""
    rng = _rng("amx-large", M, N, K)
    x = (rng.standard_normal((M, K)) * 2).astype(np.float32)
    w = _w(N, K, rng)
    ws = (rng.random(N) * 0.02 + 1e-3).astype(np.float32)
    b = rng.standard_normal(N).astype(np.float32)
    res = rng.standard_normal((M, N)).astype(np.float32)
    for act, r in (("gelu", None), ("none", res), ("gelu", res)):
        ref = np.full((M, N), np.nan, np.float32)
        _cpu.k_linear_i8(x, w, ws, b, act, r, -1.0, ref, "vnni", 1)
        assert np.isfinite(ref).all()
        for nt in (1, 2):
            y = np.full((M, N), np.nan, np.float32)
            _cpu.k_linear_i8(x, w, ws, b, act, r, -1.0, y, "amx", nt)
            np.testing.assert_array_equal(y, ref, err_msg=f"{act} res={r is not None} nt={nt}")
