"""Pooling (mean / cls / max) and L2 normalisation, per backend (tests/ops/helpers.py)."""

from __future__ import annotations

import numpy as np
import pytest
from tests.ops.helpers import (
    ISAS,
    _rand,
    cuda,
    f16,
    k_pool,
    nanlike,
    poison,
    rel,
    t,
    torch,
)

from zoi import _cpu
from zoi.numerics import reference as ref


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("mode", ["mean", "cls", "max"])
def test_pool_and_normalize(isa, mode, rng):
    lengths = [1, 7, 30, 2]
    H = 45
    x = rng.standard_normal((sum(lengths), H)).astype(np.float32)
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    out = nanlike((len(lengths), H))
    _cpu.k_pool(x, cu, mode, out, isa, 3)
    want = ref.pool(x, cu, mode)
    np.testing.assert_array_equal(out, want)  # same float32 order as numpy's axis-0 reduction
    p = out.copy()
    p[1] = 0  # zero row stays zero
    want = ref.normalize(p)
    _cpu.k_normalize(p, isa)
    np.testing.assert_array_equal(p, want)


@cuda
@pytest.mark.parametrize("mode", ["mean", "cls", "max"])
@pytest.mark.parametrize("norm", [0, 1])
def test_pool(mode, norm):
    rng = np.random.default_rng(len(mode) + norm)
    lens = [3, 1, 40]
    T, H = sum(lens), 56
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    x = _rand(rng, T + 2, H)
    p = poison((5, H), torch.float32)
    k_pool.launch_pool(
        t(x, torch.float16), t(cu), t(np.array([norm, 3, T], np.int32)), p, 2, H, mode
    )
    want = ref.pool(f16(x), cu, mode)
    if norm:
        want = ref.normalize(want)
    got = p.cpu().numpy()
    assert rel(got[:3], want) < 1e-5
    assert np.isnan(got[3:]).all(), "slots past B must not be written"
