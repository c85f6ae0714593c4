"""What the per-op tests share: poisoned outputs, tolerance checks, the ISAs of this CPU and,
when torch + triton are installed, the Triton kernels on DEV (the GPU when compiled, else the
CPU through the interpreter).

CPU kernels: outputs are poisoned (NaN / sentinel) before each call and must come back fully
written; shapes are awkward on purpose (1 token, primes, K not a multiple of the block, N odd);
`nt` > 1 runs every thread share of the partition (one after the other) to test the split.

Triton kernels: tolerances are relative Frobenius errors against float64; fp16 storage of
activations puts a naive fp16 implementation near 5e-4..1e-3, so 3e-3 is the bar (about 2x +
margin); INT8 linears are compared against the integer-exact emulation (zoi.numerics.primitives)
run on the same fp16-rounded activations, where only float epilogue rounding differs.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from tests.fixtures import supported_isas

from zoi.numerics import primitives as qp

ISAS = supported_isas()
ACTS = ["none", "gelu", "gelu_tanh", "relu", "sigmoid"]
QMODES = ["dynamic", "static", "dynamic_asym"]
TRANSFORMS = ["none", "mul", "shift+mul"]

try:
    import torch
    import triton  # noqa: F401

    from zoi.backends.cuda.kernels import attention as k_attn
    from zoi.backends.cuda.kernels import embed as k_embed
    from zoi.backends.cuda.kernels import layernorm as k_ln
    from zoi.backends.cuda.kernels import linear as k_lin
    from zoi.backends.cuda.kernels import pool as k_pool
    from zoi.backends.cuda.kernels import quantize as k_q
except ImportError:  # the CPU runtime runs without torch: only the cuda cases skip
    torch = k_attn = k_embed = k_ln = k_lin = k_pool = k_q = None

cuda = pytest.mark.skipif(torch is None, reason="the cuda backend needs torch and triton")
DEV = (
    "cuda"
    if torch is not None and torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"
    else "cpu"
)


# ---- CPU kernels (zoi._cpu) ----
def nanlike(shape, dtype=np.float32):
    return np.full(shape, np.nan, dtype)


def close(got, want, rtol, atol):
    want = np.asarray(want, np.float64)
    err = np.abs(np.asarray(got, np.float64) - want)
    bound = atol + rtol * np.abs(want)
    assert np.isfinite(got).all(), "output not fully written"
    worst = float((err - bound).max()) if err.size else 0.0
    assert worst <= 0, f"max err {err.max():.3g} exceeds tolerance (rtol={rtol}, atol={atol})"


# ---- Triton kernels (zoi.backends.cuda.kernels) ----
def t(a, dtype=None):
    x = torch.from_numpy(np.ascontiguousarray(a))
    if dtype is not None:
        x = x.to(dtype)
    return x.to(DEV)


def poison(shape, dtype):
    return torch.full(shape, float("nan"), dtype=dtype, device=DEV)


def rel(out, want) -> float:
    out = np.asarray(out, np.float64)
    want = np.asarray(want, np.float64)
    assert np.isfinite(out).all(), "non-finite output (unwritten or NaN)"
    return float(np.linalg.norm(out - want) / max(np.linalg.norm(want), 1e-30))


def f16(a):
    return np.asarray(a, np.float32).astype(np.float16).astype(np.float64)


def _rand(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def _transform(rng, K, tr):
    """Random act_shift / act_mul of a consumer (as zoi.quant writes them), numpy."""
    shift = (0.3 * rng.standard_normal(K)).astype(np.float32) if "shift" in tr else None
    mul = (0.5 + rng.random(K)).astype(np.float32) if "mul" in tr else None
    return shift, mul


def _qbufs(T, K):
    """Poisoned int8 copy / a_scale / zero point outputs."""
    return (
        torch.full((T, K), 99, dtype=torch.int8, device=DEV),
        poison((T,), torch.float32),
        torch.full((T,), -7, dtype=torch.int32, device=DEV),
    )


def _qargs(mode, shift, mul, static_amax, q, qs, qz, pre):
    return {
        f"{pre}q": q,
        f"{pre}q_scale": qs,
        f"{pre}q_zp": qz,
        "q_mode": mode,
        "q_shift": None if shift is None else t(shift),
        "q_mul": None if mul is None else t(mul),
        "q_static_amax": static_amax,
    }


def _assert_quant(x, mode, shift, mul, static_amax, q, qs, qz):
    """The int8 copy (asymmetric: q_u8 - 128), a_scale and zp bit-exact against
    zoi.numerics.primitives on x (float32, the values the kernel stored), after the transform."""
    xt = qp.act_transform(np.asarray(x, np.float32), shift, mul)
    q, qs, qz = q.cpu().numpy(), qs.cpu().numpy(), qz.cpu().numpy()
    assert np.isfinite(qs).all()
    if mode == "dynamic_asym":
        wq, ws, wz = qp.quantize_act_asym(xt)
        np.testing.assert_array_equal(q.astype(np.int32) + 128, wq.astype(np.int32))
        np.testing.assert_array_equal(qz, wz)
    else:
        wq, ws = qp.quantize_act(xt, static_amax if mode == "static" else None)
        np.testing.assert_array_equal(q, wq)
    np.testing.assert_array_equal(qs, ws)


def _awkward_rows(x):
    """Rows that stress the row statistics: all zero, all positive, all negative, one value."""
    T = x.shape[0]
    if T >= 4:
        x[1] = 0.0
        x[2] = np.abs(x[2]) + 0.01
        x[3] = -np.abs(x[3]) - 0.01
    if T >= 5:
        x[4] = 0.0
        x[4, -1] = -2.5
    return x
