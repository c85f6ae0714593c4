"""LayerNorm and residual add + LayerNorm (with the fused INT8 copy), per backend (tests/ops/helpers.py)."""

from __future__ import annotations

import numpy as np
import pytest
from tests.ops.helpers import (
    ISAS,
    QMODES,
    TRANSFORMS,
    _assert_quant,
    _qargs,
    _qbufs,
    _rand,
    _transform,
    close,
    cuda,
    f16,
    k_ln,
    nanlike,
    poison,
    rel,
    t,
    torch,
)

from zoi import _cpu
from zoi.numerics import primitives as qp
from zoi.numerics import reference as ref


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("M,H", [(1, 1), (1, 384), (7, 60), (13, 97), (40, 768)])
def test_layernorm(isa, M, H, rng):
    x = (rng.standard_normal((M, H)) * 3 + 1).astype(np.float32)
    r = rng.standard_normal((M, H)).astype(np.float32)
    w = (1 + 0.1 * rng.standard_normal(H)).astype(np.float32)
    b = (0.1 * rng.standard_normal(H)).astype(np.float32)
    for res in (None, r):
        y = nanlike((M, H))
        q = np.full((M, H), 999, np.int16)
        s = nanlike(M)
        _cpu.k_layernorm(x, res, w, b, 1e-5, y, q, s, -1.0, isa, 3)
        xin = x.astype(np.float64) + (0 if res is None else res)
        close(y, ref.layernorm(xin, w.astype(np.float64), b.astype(np.float64), 1e-5), 1e-5, 3e-6)
        # and bit for bit the float32 reference (numpy's pairwise sums, same op order), so
        # that the fused quantisation rounds exactly as the emulation
        np.testing.assert_array_equal(y, ref.layernorm(x if res is None else x + res, w, b, 1e-5))
        q_ref, s_ref = qp.quantize_act(y)  # the fused quantisation of the kernel's own output
        np.testing.assert_array_equal(q, q_ref)
        np.testing.assert_array_equal(s, s_ref)


@cuda
@pytest.mark.parametrize("T,H", [(1, 24), (13, 100)])
@pytest.mark.parametrize("qmode", QMODES)
@pytest.mark.parametrize("tr", TRANSFORMS)
def test_add_layernorm(T, H, qmode, tr):
    rng = np.random.default_rng(T + H + len(tr))
    x, r = _rand(rng, T, H, scale=3.0), _rand(rng, T, H)
    w, b = 1 + _rand(rng, H, scale=0.1), _rand(rng, H, scale=0.1)
    y = poison((T, H), torch.float16)
    amax = poison((T,), torch.float32)
    shift, mul = _transform(rng, H, tr)
    yq, ys, yz = _qbufs(T, H)
    k_ln.launch_add_layernorm(
        t(x, torch.float16),
        t(r, torch.float16),
        t(w),
        t(b),
        y,
        amax,
        T,
        H,
        1e-5,
        **_qargs(qmode, shift, mul, 2.5, yq, ys, yz, "y"),
    )
    want = ref.add_layernorm(f16(x), f16(r), w.astype(np.float64), b.astype(np.float64), 1e-5)
    got = y.float().cpu().numpy()
    assert rel(got, want) < 2e-3
    np.testing.assert_array_equal(amax.cpu().numpy(), np.abs(got).max(axis=1).astype(np.float32))
    _assert_quant(got, qmode, shift, mul, 2.5, yq, ys, yz)
