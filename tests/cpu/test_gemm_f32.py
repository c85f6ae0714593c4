"""The FP32 GEMM (csrc/kernels/gemm_f32.cc) on every ISA this machine runs, through the op hook
`_cpu.k_linear_f32` (pack, then the kernel on 1-3 pool threads), against numpy in float64.

M runs through the few-row path (1, 2, 3, 5, 7, 8, 9, 13: below, at and past every ISA's
register tile, where one tile covers all of K) and the blocked path (127, 128, 129: M chunks and
the tile remainder); K through 1, 17, 255-257 and 1536, and past the K-block size of every ISA
(zmm: K > 2048; ymm / neon: K > 256; scalar: K > 1024), also on exact small-integer data; N is mostly not a multiple of the panels (32, 16 or 4 columns), so the masked
last panel runs everywhere. Every output is poisoned with NaN before each run; the epilogue (bias,
each activation, residual) is checked on every shape."""

from __future__ import annotations

import math
import zlib

import numpy as np
import pytest
from helpers import supported_isas

from zoi import _cpu

ISAS = supported_isas()
MS = (1, 2, 3, 5, 7, 8, 9, 13, 127, 128, 129)
KS = (1, 17, 255, 256, 257, 1536)
NS = (
    1,
    17,
    47,
    100,
    383,
    161,
    49,
    1000,
)  # panels: 32 (zmm), 16 (ymm), 16 (neon), 4 (scalar) columns
ACTS = ("none", "gelu", "gelu_tanh", "relu", "sigmoid", "tanh", "silu")

_erf = np.vectorize(math.erf)


def _act(z: np.ndarray, act: str) -> np.ndarray:
    if act == "gelu":
        return 0.5 * z * (1.0 + _erf(z / math.sqrt(2.0)))
    if act == "gelu_tanh":
        return 0.5 * z * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (z + 0.044715 * z**3)))
    if act == "relu":
        return np.maximum(z, 0.0)
    if act == "sigmoid":
        return 1.0 / (1.0 + np.exp(-z))
    if act == "tanh":
        return np.tanh(z)
    if act == "silu":
        return z / (1.0 + np.exp(-z))
    return z


def _rng(*key):
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def _check(isa, M, N, K, act, bias, res, nts=(1, 2, 3), seed=0):
    rng = _rng("gemm_f32", isa, M, N, K, act, bias, res, seed)
    x = rng.standard_normal((M, K)).astype(np.float32)
    w = rng.standard_normal((N, K)).astype(np.float32)
    b = rng.standard_normal(N).astype(np.float32) if bias else None
    r = rng.standard_normal((M, N)).astype(np.float32) if res else None
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    z = x64 @ w64.T + (b if bias else 0.0)
    want = _act(z, act) + (r if res else 0.0)
    # float32 summation of K products (any order) and a few-ulp activation: bounded by the sum of
    # the magnitudes; one product dropped or counted twice is ~|x||w| ~ 0.6, far above it
    mag = np.abs(x64) @ np.abs(w64).T + (np.abs(b) if bias else 0.0)
    tol = 2e-6 * (1.0 + math.sqrt(K)) * (mag + 1.0) + (4e-6 * np.abs(r) if res else 0.0)
    for nt in nts:
        y = np.full((M, N), np.nan, np.float32)  # poisoned: an unwritten element fails
        _cpu.k_linear_f32(x, w, b, act, r, y, isa, nt)
        assert np.isfinite(y).all(), (
            f"{isa} nt={nt}: {np.argwhere(~np.isfinite(y))[:4].tolist()} not written"
        )
        err = np.abs(y - want)
        bad = err > tol
        assert not bad.any(), (
            f"{isa} M={M} N={N} K={K} act={act} nt={nt}: {bad.sum()} elements off, "
            f"first {np.argwhere(bad)[0].tolist()} err {err[bad].max():.3g} tol {tol[bad].min():.3g}"
        )


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("M", MS)
@pytest.mark.parametrize("K", KS)
def test_gemm_f32_shapes(isa, M, K):
    """Every M x K on every ISA; N, the activation and whether bias / residual are on rotate with
    the shape so each is met at small and large M and K."""
    i = MS.index(M) * len(KS) + KS.index(K)
    N = NS[i % len(NS)]
    act = ACTS[i % len(ACTS)]
    _check(isa, M, N, K, act, bias=i % 3 != 1, res=i % 2 == 0)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("act", ACTS)
def test_gemm_f32_epilogue(isa, act):
    """Each activation with bias and residual, on the one-row path and the blocked path across K
    blocks (257) and an N spanning several panels plus a masked one."""
    _check(isa, 1, 1000, 257, act, bias=True, res=True)
    _check(isa, 129, 383, 257, act, bias=True, res=True)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("M", (1, 4, 8, 16))
def test_gemm_f32_decode_shapes(isa, M):
    """Generation's few-row shapes at full panels (N a multiple of 128) and wide N split over the
    threads: Qwen2.5-0.5B's q|k|v width and MLP width over a K of 896."""
    _check(isa, M, 1152, 896, "none", bias=True, res=False, nts=(1, 2))
    _check(isa, M, 2432, 128, "silu", bias=False, res=True, nts=(2, 3))


@pytest.mark.parametrize("isa", ISAS)
def test_gemm_f32_k0_is_the_epilogue(isa):
    """K = 0: no products; y = act(bias) + res on every element."""
    _check(isa, 9, 47, 0, "gelu", bias=True, res=True)
    _check(isa, 1, 47, 0, "none", bias=False, res=False)


@pytest.mark.parametrize("isa", ISAS)
def test_gemm_f32_nan_propagates(isa):
    """A NaN in a row of x poisons that row only: no NaN is swallowed by the accumulators' reuse
    across tiles, and no other row sees it."""
    rng = _rng("nan", isa)
    M, N, K = 13, 100, 257
    x = rng.standard_normal((M, K)).astype(np.float32)
    w = rng.standard_normal((N, K)).astype(np.float32)
    x[5, 200] = np.nan
    for nt in (1, 2):
        y = np.full((M, N), -7.0, np.float32)
        _cpu.k_linear_f32(x, w, None, "none", None, y, isa, nt)
        assert np.isnan(y[5]).all(), (isa, nt)
        assert np.isfinite(np.delete(y, 5, axis=0)).all(), (isa, nt)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("M,K", [(13, 2049), (129, 4097), (13, 16385), (129, 16385)])
def test_gemm_f32_k_blocks_exact(isa, M, K):
    """K split into blocks (the accumulators go through y between blocks) on small integers: every
    partial sum is exact in float32 (|sum| <= 4K < 2**24), so any summation order gives the exact
    result and a block dropped, repeated or misaligned by one k is an exact mismatch."""
    rng = _rng("kblocks", isa, M, K)
    N = 47
    x = rng.integers(-2, 3, (M, K)).astype(np.float32)
    w = rng.integers(-2, 3, (N, K)).astype(np.float32)
    b = rng.integers(-8, 9, N).astype(np.float32)
    r = rng.integers(-8, 9, (M, N)).astype(np.float32)
    want = (x.astype(np.int64) @ w.astype(np.int64).T + b.astype(np.int64)) + r.astype(np.int64)
    for nt in (1, 2, 3):
        y = np.full((M, N), np.nan, np.float32)
        _cpu.k_linear_f32(x, w, b, "none", r, y, isa, nt)
        np.testing.assert_array_equal(y, want.astype(np.float32), err_msg=f"{isa} nt={nt}")
