"""The native pieces the heads added, per ISA: tanh (pooler epilogue), pool mode splade."""

from __future__ import annotations

import numpy as np
import pytest
from tests.fixtures import supported_isas

from zoi.numerics import reference as ref

_cpu = pytest.importorskip("zoi._cpu")


@pytest.mark.parametrize("isa", supported_isas())
def test_tanh_every_isa(isa):
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.standard_normal(997) * 3, [0.0, -0.0, 1e-8, -1e-8, 40, -40, 9.5, -9.5]])
    x = x.astype(np.float32)
    y = x.copy()
    _cpu.k_activation(y, "tanh", isa)
    assert np.isfinite(y).all()
    np.testing.assert_allclose(y, np.tanh(x.astype(np.float64)), rtol=0, atol=3e-7)
    np.testing.assert_allclose(ref.activation(x, "tanh"), np.tanh(x), atol=1e-7)


@pytest.mark.parametrize("isa", supported_isas())
@pytest.mark.parametrize("nt", [1, 3])
def test_pool_splade_every_isa(isa, nt):
    rng = np.random.default_rng(1)
    lens = [1, 7, 40, 3]
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    x = (rng.standard_normal((cu[-1], 1031)) * 2).astype(np.float32)
    x[:, :5] = -1.0  # columns never positive: exact zeros
    out = np.full((len(lens), 1031), np.nan, np.float32)  # poisoned
    _cpu.k_pool(x, cu, "splade", out, isa, nt)
    want = ref.pool(x, cu, "splade")
    np.testing.assert_allclose(out, want, rtol=2e-7, atol=1e-7)
    assert (out[:, :5] == 0).all() and (out >= 0).all()
    with pytest.raises(ValueError):
        _cpu.k_pool(x, cu, "sum", out, isa, nt)
