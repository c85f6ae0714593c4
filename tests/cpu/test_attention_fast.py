"""The attention kernel (csrc/kernels/attention.cc: division-free softmax with `vexp2`, the
normalisation applied to the output rows, K^T transposed in registers, V rows copied, the next
item prefetched) on every ISA the machine runs, against the float64 reference on fresh random
inputs: awkward lengths (1, 3, 17, 127, 129, many ragged sequences), head_dim 32 / 64 / odd,
outputs poisoned before each run, thread splits, peaked and flat softmax rows, NaN inputs."""

from __future__ import annotations

import math

import numpy as np
import pytest
from helpers import supported_isas

from zoi import _cpu
from zoi.numerics import reference as ref

ISAS = supported_isas()
SHAPES = [(12, 32), (2, 64), (3, 7), (1, 16), (4, 48)]
LENGTHS = [[1], [3], [17], [127], [129], [1, 129, 3, 127, 17], "ragged"]


def _lengths(spec, rng):
    if spec == "ragged":  # many sequences of different lengths, 1..80 tokens
        return [int(x) for x in rng.integers(1, 81, size=23)]
    return list(spec)


def _run(qkv, cu, heads, d, scale, isa, nt):
    out = np.full((qkv.shape[0], heads * d), np.nan, np.float32)  # poisoned
    _cpu.k_attention(qkv, cu, heads, d, scale, out, isa, nt)
    return out


def _check(out, qkv, cu, heads, d, scale, well_conditioned=True):
    want = ref.attention(qkv.astype(np.float64), cu, heads, d, scale)
    naive = ref.attention(qkv, cu, heads, d, scale)  # numpy float32 (BLAS)
    assert np.isfinite(out).all(), "output not fully written (or NaN)"
    err = float(np.abs(out - want).max())
    # within 4x the float32 numpy reference's own error against float64, and, for scores of
    # order 1, a few ulp of the output's magnitude (ctx rows are convex combinations of v rows)
    assert err <= 4 * float(np.abs(naive - want).max()) + 1e-6, err
    if well_conditioned:
        assert err <= 2e-6 * max(1.0, float(np.abs(want).max())), err


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("heads,d", SHAPES)
@pytest.mark.parametrize(
    "spec", LENGTHS, ids=lambda s: s if isinstance(s, str) else "-".join(map(str, s))
)
def test_attention_vs_float64(isa, heads, d, spec):
    rng = np.random.default_rng([heads, d, len(str(spec)), 7])
    lengths = _lengths(spec, rng)
    T, H = sum(lengths), heads * d
    qkv = (rng.standard_normal((T, 3 * H)) * 1.5).astype(np.float32)
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    scale = 1 / math.sqrt(d)
    for nt in (1, 2, 5):  # every share of the (sequence, head) split, and the prefetch chain
        _check(_run(qkv, cu, heads, d, scale, isa, nt), qkv, cu, heads, d, scale)


@pytest.mark.parametrize("isa", ISAS)
def test_attention_peaked_and_flat_rows(isa):
    """Near one-hot softmax rows (scores spread over hundreds: exps down to the clamp) and rows
    of equal scores (the output is the mean of v)."""
    rng = np.random.default_rng(3)
    heads, d, lengths = 2, 32, [129, 40, 1]
    T, H = sum(lengths), heads * d
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    qkv = (rng.standard_normal((T, 3 * H)) * 8).astype(np.float32)
    # scores of order 1e3: their own float32 rounding (~1e-4) is exponentiated, in numpy too
    _check(_run(qkv, cu, heads, d, 1.0, isa, 2), qkv, cu, heads, d, 1.0, well_conditioned=False)
    flat = qkv.copy()
    flat[:, :H] = 0.0  # q = 0: every score 0
    out = _run(flat, cu, heads, d, 0.125, isa, 1)
    for s in range(len(lengths)):
        a, e = cu[s], cu[s + 1]
        mean = flat[a:e, 2 * H :].astype(np.float64).mean(axis=0)
        np.testing.assert_allclose(out[a:e], np.broadcast_to(mean, (e - a, H)), rtol=0, atol=2e-6)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("where", ["q", "k", "v"])
def test_attention_nan_propagates(isa, where):
    """A NaN in one token's q, k or v never turns into a finite output of its sequence's head;
    the other sequences stay exact."""
    rng = np.random.default_rng(5)
    heads, d, lengths = 3, 32, [17, 33, 5]
    T, H = sum(lengths), heads * d
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    qkv = rng.standard_normal((T, 3 * H)).astype(np.float32)
    col = {"q": 0, "k": H, "v": 2 * H}[where] + d + 3  # head 1, channel 3
    qkv[17 + 10, col] = np.nan  # token 10 of sequence 1
    out = _run(qkv, cu, heads, d, 1 / math.sqrt(d), isa, 2)
    head1 = out[17:50, d : 2 * d]
    if where == "q":  # every score of that query row
        assert np.isnan(head1[10]).all()
    elif where == "k":  # that key's score in every row of the head
        assert np.isnan(head1).all()
    else:  # channel 3 of every output row of the head
        assert np.isnan(head1[:, 3]).all()
    clean = np.delete(np.arange(T), np.arange(17, 50))
    good = qkv[clean]
    cu2 = np.array([0, 17, 22], np.int32)
    want = ref.attention(good.astype(np.float64), cu2, heads, d, 1 / math.sqrt(d))
    assert np.abs(out[clean] - want).max() <= 2e-6
    assert np.isfinite(out[17:50, :d]).all() and np.isfinite(out[17:50, 2 * d :]).all()
