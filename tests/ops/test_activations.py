"""The activation functions, per backend (tests/ops/helpers.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from tests.ops.helpers import (
    ACTS,
    ISAS,
)

from zoi import _cpu
from zoi.numerics import reference as ref


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("act", ACTS)
def test_activation(isa, act):
    x = np.concatenate(
        [np.linspace(-12, 12, 2001), [0.0, -0.0, 1e-8, -1e-8, 30, -30, -90, 90]]
    ).astype(np.float32)
    y = x.copy()
    _cpu.k_activation(y, act, isa)
    want = ref.activation(x.astype(np.float64), act)
    if act == "gelu_tanh":  # 0.5 x (1 + tanh u) cancels in the negative tail even in float64
        x64 = x.astype(np.float64)
        want = x64 / (1 + np.exp(-2 * math.sqrt(2 / math.pi) * (x64 + 0.044715 * x64**3)))
    with np.errstate(over="ignore"):
        naive = ref.activation(x, act)  # the float32 reference itself
    assert np.isfinite(y).all()
    err, err_naive = np.abs(y - want), np.abs(naive.astype(np.float64) - want)
    # at most ~2x the error of the float32 reference, elementwise, up to a few ulp; the GELU's
    # fast erf (rational fit, a few ulp of erf) costs up to ~7e-7 absolute in the negative tail
    # (and 1e-20 where the float64 formula itself cancels to 0 but the true value is ~1e-30)
    tail = 1e-6 if act == "gelu" else 1e-20

    assert (err <= 2 * err_naive + 4 * np.spacing(np.abs(want).astype(np.float32)) + tail).all(), (
        err.max()
    )
