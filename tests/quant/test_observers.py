"""Observers: min-max, percentile and MSE-optimal clipping ranges."""

from __future__ import annotations

import numpy as np
import pytest

from zoi.numerics import primitives as P
from zoi.quant.observers import MinMaxObserver, MSEObserver, PercentileObserver, make_observer


def _batches(seed=0, n=20, scale_growth=True):
    r = np.random.default_rng(seed)
    for i in range(n):
        s = (1.0 + i) if scale_growth else 1.0  # later batches are wider: the histogram must grow
        yield (r.standard_normal((64, 32)) * s).astype(np.float32)


def test_minmax_is_the_max():
    o = MinMaxObserver()
    allx = []
    for x in _batches():
        o.update(x)
        allx.append(x)
    assert o.amax() == pytest.approx(float(np.abs(np.concatenate(allx)).max()))


@pytest.mark.parametrize("pct", [99.0, 99.9, 99.99])
def test_percentile_matches_numpy_within_a_bin(pct):
    o = PercentileObserver(pct)
    allx = []
    for x in _batches(1):
        o.update(x)
        allx.append(x)
    a = np.abs(np.concatenate(allx)).ravel()
    want = float(np.percentile(a, pct))
    bin_w = o.range / o.bins
    assert abs(o.amax() - want) <= 2 * bin_w
    assert o.amax() <= a.max()
    assert o.count == a.size and o.hist.sum() == a.size


def test_histogram_growth_keeps_counts():
    o = PercentileObserver()
    o.update(np.zeros((4, 4), np.float32))  # zeros first: no range yet
    o.update(np.array([[0.1, 0.2]], np.float32))
    o.update(np.array([[100.0]], np.float32))
    assert o.hist.sum() == 16 + 2 + 1 and o.range > 100.0


def test_mse_clips_heavy_tails_but_not_uniform():
    r = np.random.default_rng(2)
    heavy = r.standard_normal((20000, 16)).astype(np.float32)
    heavy[7, 3] = 40.0  # one rare outlier: clipping it costs less than coarse steps for all
    o = MSEObserver()
    o.update(heavy)
    m = float(np.abs(heavy).max())
    assert o.amax() < 0.5 * m

    # the chosen range really gives a lower error than min-max
    def err(c):
        q, s = P.quantize_act(heavy, c)
        return float(np.mean((q.astype(np.float32) * s[:, None] - heavy) ** 2))

    assert err(o.amax()) < err(m)
    uni = r.uniform(-1, 1, (4000, 16)).astype(np.float32)
    o2 = MSEObserver()
    o2.update(uni)
    assert o2.amax() > 0.9 * float(np.abs(uni).max())


def test_empty_and_factory():
    for k in ("minmax", "percentile", "mse"):
        o = make_observer(k)
        assert o.amax() == 0.0
        o.update(np.zeros((0, 3), np.float32))
        assert o.amax() == 0.0
    with pytest.raises(ValueError):
        make_observer("kl")
    with pytest.raises(ValueError):
        PercentileObserver(0)
