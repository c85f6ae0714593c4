"""Activation quantisation (symmetric, static, asymmetric, act_shift / act_mul), per backend (tests/ops/helpers.py)."""

from __future__ import annotations

import numpy as np
import pytest
from tests.ops.helpers import (
    ISAS,
    QMODES,
    TRANSFORMS,
    _assert_quant,
    _awkward_rows,
    _qbufs,
    _rand,
    _transform,
    cuda,
    k_q,
    nanlike,
    t,
)

from zoi import _cpu
from zoi.numerics import primitives as qp


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("static", [None, 0.7, 0.0])
def test_quantize_matches_primitives(isa, static, rng):
    x = (rng.standard_normal((37, 131)) * 2).astype(np.float32)
    x[3] = 0  # zero row -> q 0, scale 0
    x[5, 7] = 1e-30
    q = np.full(x.shape, 999, np.int16)
    s, zp = nanlike(37), np.full(37, -1, np.int32)
    _cpu.k_quantize(x, q, s, zp, -1.0 if static is None else static, False, None, None, isa, 4)
    q_ref, s_ref = qp.quantize_act(x, static)
    np.testing.assert_array_equal(q, q_ref)
    np.testing.assert_array_equal(s, s_ref)
    np.testing.assert_array_equal(zp, 0)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("transform", [False, True])
def test_quantize_asym_and_transform(isa, transform, rng):
    x = (rng.standard_normal((29, 97)) * 2 + 0.5).astype(np.float32)
    x[3] = 0
    x[4] = np.abs(x[4])  # all positive: lo = 0
    x[5] = -np.abs(x[5])  # all negative: hi = 0
    shift = rng.standard_normal(97).astype(np.float32) if transform else None
    mul = (0.5 + rng.random(97)).astype(np.float32) if transform else None
    xt = qp.act_transform(x, shift, mul) if transform else x
    for asym in (True, False):
        q = np.full(x.shape, 999, np.int16)
        s, zp = nanlike(29), np.full(29, -1, np.int32)
        _cpu.k_quantize(x, q, s, zp, -1.0, asym, shift, mul, isa, 3)
        if asym:
            q_ref, s_ref, zp_ref = qp.quantize_act_asym(xt)
        else:
            (q_ref, s_ref), zp_ref = qp.quantize_act(xt), 0
        np.testing.assert_array_equal(q, q_ref)
        np.testing.assert_array_equal(s, s_ref)
        np.testing.assert_array_equal(zp, zp_ref)


@cuda
@pytest.mark.parametrize("T,K", [(1, 24), (13, 100), (37, 130)])
@pytest.mark.parametrize("mode", QMODES)
@pytest.mark.parametrize("tr", TRANSFORMS)
def test_quantize_kernel(T, K, mode, tr):
    rng = np.random.default_rng(T * 31 + K + len(tr) + QMODES.index(mode) * 7)
    x = _awkward_rows(_rand(rng, T, K, scale=2.0)).astype(np.float16)
    shift, mul = _transform(rng, K, tr)
    q, qs, qz = _qbufs(T, K)
    k_q.launch_quantize(
        t(x),
        None if shift is None else t(shift),
        None if mul is None else t(mul),
        q,
        qs,
        qz,
        T,
        K,
        mode=mode,
        static_amax=3.0,
    )
    _assert_quant(x, mode, shift, mul, 3.0, q, qs, qz)
    if mode != "dynamic_asym":
        assert (qz.cpu().numpy() == -7).all()  # no zero point written
