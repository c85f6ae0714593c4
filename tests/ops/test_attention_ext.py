"""The attention kernel's optional inputs (MPNet's relative bias, ModernBERT's local window and
RoPE) and the glu kernel, per ISA, against zoi.numerics.reference on random awkward shapes."""

from __future__ import annotations

import math

import numpy as np
import pytest
from tests.ops.helpers import ISAS, nanlike

from zoi import _cpu
from zoi.frontend.archs import rope_tables
from zoi.numerics import reference as ref

VARIANTS = ["bias", "window", "rope", "rope+window", "bias+window", "all"]


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("heads,d", [(5, 8), (3, 6), (2, 64), (1, 2)])
@pytest.mark.parametrize("lengths", [[1], [5, 1, 17, 33], [70, 2], [130]])
def test_attention_ext(isa, variant, heads, d, lengths, rng):
    T, H = sum(lengths), heads * d
    qkv = (rng.standard_normal((T, 3 * H)) * 1.5).astype(np.float32)
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    P = max(lengths) + int(rng.integers(0, 9))
    kw = {}
    bias = cos = sin = None
    window = 0
    if "bias" in variant or variant == "all":
        bias = (rng.standard_normal((heads, 2 * P - 1)) * 2).astype(np.float32)
        kw["bias"] = bias
    if "window" in variant or variant == "all":
        window = int(rng.integers(1, 12))
        kw["window"] = window
    if "rope" in variant or variant == "all":
        cos, sin = rope_tables(float(rng.choice([1e4, 1.6e5, 37.0])), d, P)
        kw["rope_cs"] = (cos, sin)
    scale = 1 / math.sqrt(d)
    for nt in (1, 3):
        out = nanlike((T, H))
        _cpu.k_attention_ext(qkv, cu, heads, d, scale, out, bias, window, cos, sin, isa, nt)
        want = ref.attention(qkv.astype(np.float64), cu, heads, d, scale, **kw)
        naive = ref.attention(qkv, cu, heads, d, scale, **kw)
        assert np.isfinite(out).all()
        # as tests/ops/test_attention.py: a single FMA chain vs BLAS's blocked sums
        assert np.abs(out - want).max() <= 4 * np.abs(naive - want).max() + 1e-6


def test_window_and_bias_change_the_result(rng):
    """The options are not ignored: each moves the output far beyond rounding."""
    heads, d, L = 2, 8, 40
    qkv = rng.standard_normal((L, 3 * heads * d)).astype(np.float32)
    cu = np.array([0, L], np.int32)
    base = nanlike((L, heads * d))
    _cpu.k_attention_ext(qkv, cu, heads, d, 0.35, base, None, 0, None, None)
    cos, sin = rope_tables(1e4, d, L)
    bias = rng.standard_normal((heads, 2 * L - 1)).astype(np.float32)
    for args in ((bias, 0, None, None), (None, 3, None, None), (None, 0, cos, sin)):
        out = nanlike((L, heads * d))
        _cpu.k_attention_ext(qkv, cu, heads, d, 0.35, out, *args)
        assert np.abs(out - base).max() > 1e-2


def test_bad_tables_are_refused(rng):
    qkv = rng.standard_normal((10, 3 * 8)).astype(np.float32)
    cu = np.array([0, 10], np.int32)
    out = nanlike((10, 8))
    with pytest.raises(ValueError, match="bias"):
        _cpu.k_attention_ext(qkv, cu, 1, 8, 1.0, out, np.zeros((1, 9), np.float32), 0, None, None)
    cos, sin = rope_tables(1e4, 8, 4)
    with pytest.raises(ValueError, match="RoPE"):
        _cpu.k_attention_ext(qkv, cu, 1, 8, 1.0, out, None, 0, cos, sin)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("act", ["gelu", "gelu_tanh", "relu"])
@pytest.mark.parametrize("M,n", [(1, 1), (7, 37), (33, 16), (5, 1152)])
def test_glu(isa, act, M, n, rng):
    x = (rng.standard_normal((M, 2 * n)) * 3).astype(np.float32)
    want = ref.glu(x.astype(np.float64), act)
    naive = ref.glu(x, act)
    for nt in (1, 3):
        y = nanlike((M, n))
        _cpu.k_glu(x, act, y, isa, nt)
        assert np.isfinite(y).all()
        err = np.abs(y - want).max()
        assert err <= 2 * np.abs(naive - want).max() + 1e-6 * np.abs(want).max(), err
        if act == "relu":  # no rounding but the product's: the float32 reference exactly
            np.testing.assert_array_equal(y, naive)
