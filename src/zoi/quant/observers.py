"""Activation observers: pick a per-tensor clipping range `amax` from calibration data.

All three see |x| through `update(x)` and answer `amax()`:

- `MinMaxObserver`: the largest |x| seen (never clips).
- `PercentileObserver`: the given percentile of |x| (99.99 by default); clips the rare outliers.
- `MSEObserver`: the amax minimising the expected squared error of symmetric INT8
  quantisation, E[(x - Q(x))^2], with rounding noise (amax/127)^2/12 for values inside the
  range and (|x| - amax)^2 for values clipped.

Percentile and MSE work on a histogram of |x| with a range that doubles when a larger value
arrives (bins merged pairwise), so memory stays constant whatever the amount of data.
They are used for the static (per-tensor) scheme; the dynamic scheme needs none.
"""

from __future__ import annotations

import numpy as np

from zoi.quant.detmath import fixed_sum

QMAX = 127


class Observer:
    name = "base"

    def update(self, x: np.ndarray) -> None:
        raise NotImplementedError

    def amax(self) -> float:
        raise NotImplementedError


class MinMaxObserver(Observer):
    name = "minmax"

    def __init__(self) -> None:
        self.max = 0.0

    def update(self, x: np.ndarray) -> None:
        if x.size:
            self.max = max(self.max, float(np.abs(x).max()))

    def amax(self) -> float:
        return self.max


class HistogramObserver(Observer):
    """Histogram of |x| over [0, range); the range doubles when needed (bins merged in pairs)."""

    def __init__(self, bins: int = 2048) -> None:
        if bins < 2 or bins % 2:
            raise ValueError("bins must be even and >= 2")
        self.bins = bins
        self.hist = np.zeros(bins, np.float64)
        self.range = 0.0
        self.max = 0.0
        self.count = 0

    def _grow(self, new_max: float) -> None:
        if self.range == 0.0:
            self.range = float(new_max) * 1.0001 if new_max > 0 else 0.0
            return
        while self.range <= new_max:
            h = self.hist.reshape(-1, 2).sum(axis=1)
            self.hist = np.concatenate([h, np.zeros(self.bins // 2)])
            self.range *= 2.0

    def update(self, x: np.ndarray) -> None:
        a = np.abs(np.asarray(x, np.float32)).ravel()
        if not a.size:
            return
        m = float(a.max())
        self.max = max(self.max, m)
        self.count += a.size
        if m >= self.range:
            self._grow(m)
        if self.range == 0.0:  # only zeros so far
            self.hist[0] += a.size
            return
        idx = np.minimum((a * (self.bins / self.range)).astype(np.int64), self.bins - 1)
        self.hist += np.bincount(idx, minlength=self.bins)

    def edges(self) -> np.ndarray:
        # i * (range / bins), elementwise (np.linspace's formula has changed across versions)
        return np.arange(self.bins + 1, dtype=np.float64) * (self.range / self.bins)


class PercentileObserver(HistogramObserver):
    name = "percentile"

    def __init__(self, percentile: float = 99.99, bins: int = 2048) -> None:
        super().__init__(bins)
        if not 0 < percentile <= 100:
            raise ValueError("percentile must lie in (0, 100]")
        self.percentile = float(percentile)

    def amax(self) -> float:
        if self.count == 0 or self.range == 0.0:
            return 0.0
        if self.percentile >= 100:
            return self.max
        cdf = np.cumsum(self.hist) / self.hist.sum()
        i = int(np.searchsorted(cdf, self.percentile / 100.0))
        return float(min(self.edges()[min(i + 1, self.bins)], self.max))


class MSEObserver(HistogramObserver):
    name = "mse"

    def __init__(self, bins: int = 2048, candidates: int = 256) -> None:
        super().__init__(bins)
        self.candidates = candidates

    def expected_error(self, c: float) -> float:
        """Sum over the histogram of the squared INT8 error with clipping range c."""
        centers = (self.edges()[:-1] + self.edges()[1:]) * 0.5
        step = c / QMAX
        inside = centers <= c
        err_in = fixed_sum(self.hist[inside]) * step * step / 12.0  # counts: exact
        over = centers[~inside] - c
        return float(err_in + fixed_sum(self.hist[~inside] * over * over))

    def amax(self) -> float:
        if self.count == 0 or self.max == 0.0:
            return 0.0
        cands = np.arange(1, self.candidates + 1, dtype=np.float64) * (self.max / self.candidates)
        errs = [self.expected_error(float(c)) for c in cands]
        return float(cands[int(np.argmin(errs))])


def make_observer(kind: str, percentile: float = 99.99) -> Observer:
    if kind == "minmax":
        return MinMaxObserver()
    if kind == "percentile":
        return PercentileObserver(percentile)
    if kind == "mse":
        return MSEObserver()
    raise ValueError(f"unknown observer {kind!r}: use minmax, percentile or mse")


OBSERVERS = ("minmax", "percentile", "mse")
