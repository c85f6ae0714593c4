"""The first row of each sequence quantised twice (LinearQuant.first_row) in the Triton INT8
path: the row map (written by the embedding kernel), the second quantisation
(quantize.first_row_q2, bit-exact) and the linear kernel that computes it in its own K loop
(every INT8 mode: quantised while loading, static, int8 copies symmetric / asymmetric; with
and without act_shift / act_mul), against zoi.numerics (primitives.first_row_residual,
reference.linear_apply with the batch's cu_seqlens). Outputs poisoned; awkward batches: one sequence, one row, length-1
sequences, many sequences in one tile, a first row as the last row of a tile, a tile with
none, buffer rows past the call's tokens; NaN rows."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from tests.ops.helpers import (
    DEV,
    _rand,
    _transform,
    cuda,
    f16,
    k_embed,
    k_lin,
    k_q,
    poison,
    t,
    torch,
)

from zoi.numerics import primitives as qp
from zoi.numerics import reference as ref

if torch is not None:
    import triton
    import triton.language as tl

    from zoi.backends.cuda.kernels.quantize import first_row_q2

    @triton.jit
    def _q2_probe(
        x_ptr, q1_ptr, s1_ptr, q2_ptr, R, C, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr
    ):
        rows = tl.arange(0, BLOCK_R)
        cols = tl.arange(0, BLOCK_C)
        ok = (rows < R)[:, None] & (cols < C)[None, :]
        offs = rows[:, None] * C + cols[None, :]
        x = tl.load(x_ptr + offs, mask=ok, other=0.0)
        q1 = tl.load(q1_ptr + offs, mask=ok, other=0.0)
        s1 = tl.load(s1_ptr + rows, mask=rows < R, other=0.0)
        q2 = first_row_q2(x, q1, s1, s1 * 0.00390625, ok)
        tl.store(q2_ptr + offs, q2, mask=ok)


# (T, cu_seqlens): with 16-row tiles, the last case has 4 sequences in tile 0, a first row at
# row 15 (its last) and at row 16 (the next tile's first), and tile 2 (rows 32..36) holds none
BATCHES = [
    (1, [0, 1]),
    (9, [0, 9]),
    (37, [0, 1, 2, 3, 15, 16, 30, 37]),
]
SINK = 150.0  # a massive channel on each first row: its residual is what q2 carries
STATIC_AMAX = 2.5  # below the rows' amax: q1 clamps, q2 saturates there
# (QUANT, scheme, transform): every INT8 path of the linear kernel
MODES = [
    (1, "dynamic", "none"),  # quantised while loading, the producer's amax
    (2, "static", "none"),
    (4, "dynamic", "mul"),  # int8 copy from quantize_kernel: x' from the fp16 rows in the loop
    (4, "static", "shift+mul"),
    (4, "dynamic_asym", "shift+mul"),
    (4, "dynamic_asym", "none"),
]
CFG = dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=32, GROUP_M=8, num_warps=4, num_stages=2)


def _rows(rng, T, K, cu):
    x = _rand(rng, T, K, scale=2.0)
    x[np.asarray(cu[:-1]), 3 % K] = SINK
    return f16(x).astype(np.float32)  # the fp16 values a producer stored


def _q1(xt, mode):
    """(q1 - zp as float32, a_scale) of the transformed rows, as the linear quantises them."""
    if mode == "dynamic_asym":
        q, s1, zp = qp.quantize_act_asym(xt)
        return q.astype(np.float32) - zp.astype(np.float32)[:, None], s1, (q, zp)
    q, s1 = qp.quantize_act(xt, STATIC_AMAX if mode == "static" else None)
    return q.astype(np.float32), s1, (q, None)


def _map(cu, M):
    """Row -> the sequence it starts, -1 elsewhere (rows past the call's tokens too)."""
    want = np.full(M, -1, np.int32)
    want[np.asarray(cu[:-1])] = np.arange(len(cu) - 1)
    return want


@cuda
@pytest.mark.parametrize("T,cu", BATCHES)
def test_first_row_map(T, cu):
    """The embedding kernel's row map (FR_MAP), sequences looked up 4 at a time, over a bucket
    of M > T rows (the embedding itself: tests/ops/test_embed.py)."""
    M, V, P, H = T + 5, 30, 64, 24
    rng = np.random.default_rng(T)
    word, pos = _rand(rng, V, H), _rand(rng, P, H, scale=0.3)
    fr = torch.full((M,), -7, dtype=torch.int32, device=DEV)
    B = len(cu) - 1
    hdr = t(np.array([0, B, T], np.int32))
    tcum = torch.full((B,), -1, dtype=torch.int32, device=DEV)
    k_embed.launch_embed(
        t(rng.integers(0, V, M).astype(np.int32)), t(np.arange(M, dtype=np.int32)),
        t(word, torch.float16), None, t(pos, torch.float16), None, None, None,
        poison((M, H), torch.float16), None, None, M, H, 0, M, 1e-12,
        tiles=(hdr, t(np.asarray(cu, np.int32)), tcum, 16, 4), cfg=dict(BLOCK_R=4, BLOCK_H=32, num_warps=4),
        first_row_map=fr,
    )  # fmt: skip
    np.testing.assert_array_equal(fr.cpu().numpy(), _map(cu, M))


@cuda
@pytest.mark.parametrize("mode", ["dynamic", "static", "dynamic_asym"])
def test_first_row_q2_bit_exact(mode):
    """quantize.first_row_q2 == primitives.first_row_residual, code for code: random rows,
    a zero row (s2 = 0), NaN / Inf scales (q2 = 0), exact ties (r / s2 = k + 1/2: to even)
    and, static, clamped q1 (q2 saturates)."""
    R, C = 8, 45
    rng = np.random.default_rng(len(mode))
    x = _rand(rng, R, C, scale=2.0)
    x[0, 5] = 40.0  # dynamic: a large amax, a coarse step
    x[1] = 0.0
    q1, s1, _ = _q1(x, mode)
    s1 = s1.copy()
    # row 2: scale 1, x' = q1 + (2j + 1) / 512 exactly: r / s2 = j + 1/2, a tie on each element
    q1[2] = np.round(q1[2])
    s1[2] = 1.0
    j = rng.integers(-100, 100, C)
    x[2] = q1[2] + (2 * j + 1).astype(np.float32) / 512
    s1[3], s1[4] = np.nan, np.inf
    q2 = torch.full((R, C), 99, dtype=torch.int8, device=DEV)
    _q2_probe[(1,)](t(x), t(q1), t(s1), q2, R, C, BLOCK_R=8, BLOCK_C=64)
    # first_row_residual takes the codes and zp: q1 here is already q1 - zp
    with np.errstate(invalid="ignore"):  # 0 * inf in d of the Inf-scale row
        want, _ = qp.first_row_residual(x, q1, s1, None, np.arange(R))
    got = q2.cpu().numpy()
    np.testing.assert_array_equal(got, want)
    assert (got[1] == 0).all() and (got[3:5] == 0).all()
    assert (np.abs(got[2]) % 2 == 0).all() and np.abs(got[2]).max() > 0  # ties to even
    assert np.abs(got[0]).max() > 10
    if mode == "static":
        assert (np.abs(got) == 127).any()  # q1 clamped: the residual saturates


def _weights(rng, N, K, shift, mul, w=None, bias=0.1):
    w_q, w_s = qp.quantize_weight(_rand(rng, N, K) if w is None else w)
    wd = {"p.w_q": w_q, "p.w_scale": w_s, "p.b": _rand(rng, N, scale=bias)}
    if shift is not None:
        wd["p.act_shift"] = shift
    if mul is not None:
        wd["p.act_mul"] = mul
    return wd


def _linear(x, wd, cu, quant, mode, shift, mul, act="none", r=None):
    """The linear kernel with the first-row term over fp16 rows x (as the backend feeds it per
    QUANT mode), fp32 output [T, N], poisoned before."""
    T, K = x.shape
    N = wd["p.w_q"].shape[0]
    x16, fr = t(x.astype(np.float16)), t(_map(cu, T))
    st, mt = (None if shift is None else t(shift)), (None if mul is None else t(mul))
    kw = dict(quant=quant, act=act, static_amax=STATIC_AMAX)
    colsum = t(wd["p.w_q"].astype(np.int64).sum(1).astype(np.int32))
    src = None
    if quant == 1:
        with np.errstate(invalid="ignore"):
            a, a_s = x16, t(np.abs(x).max(axis=1).astype(np.float32))  # NaN rows: NaN
    elif quant == 2:
        a, a_s = x16, None
    else:  # QUANT 4: the int8 copy a producer wrote; q2 from its fp16 source rows
        a = torch.full((T, K), 99, dtype=torch.int8, device=DEV)
        a_s = poison((T,), torch.float32)
        zp = torch.full((T,), -7, dtype=torch.int32, device=DEV)
        k_q.launch_quantize(x16, st, mt, a, a_s, zp, T, K, mode=mode, static_amax=STATIC_AMAX)
        kw.update(in_shift=st, in_mul=mt)
        if mode == "dynamic_asym":
            kw.update(a_zp=zp, colsum=colsum)
        src = x16
    y = poison((T, N), torch.float32)
    k_lin.launch_linear(
        a, a_s, t(wd["p.w_q"]), t(wd["p.w_scale"]), t(wd["p.b"]),
        None if r is None else t(r, torch.float16), y, None, T, N, K, cfg=CFG,
        first_row=(fr, src), **kw,
    )  # fmt: skip
    return y.cpu().numpy().astype(np.float64)


@cuda
@pytest.mark.parametrize("T,cu", BATCHES)
@pytest.mark.parametrize("quant,mode,tr", MODES)
def test_linear_first_row_q2_exact(T, cu, quant, mode, tr):
    """Every q2 the kernel accumulated, read back bit-exact: W a permutation (w_q 127 on one
    element per output, no bias) makes y[t, n] = (q1 - zp) s1 + q2 s2 at the permuted column,
    and s2 = s1 / 256 is far above y's fp32 rounding, so rint((y - (q1 - zp) s1') / s2') is q2."""
    K = N = 72
    rng = np.random.default_rng(T * 13 + quant + len(mode) + len(tr))
    x = _rows(rng, T, K, cu)
    x[cu[-2], 7] = -SINK  # the last first row: a negative sink too
    shift, mul = _transform(rng, K, tr)
    perm = rng.permutation(K)
    w = np.zeros((N, K), np.float32)
    w[np.arange(N), perm] = 1.0
    wd = _weights(rng, N, K, shift, mul, w=w, bias=0.0)
    wd["p.b"][:] = 0.0
    y = _linear(x, wd, cu, quant, mode, shift, mul)
    assert np.isfinite(y).all(), "output not fully written"
    xt = qp.act_transform(x, shift, mul)
    q1, s1, (q, zp) = _q1(xt, mode)
    rows = np.asarray(cu[:-1])
    assert (wd["p.w_q"][np.arange(N), perm] == 127).all()
    sw1 = (s1[:, None] * wd["p.w_scale"][None, :]).astype(np.float32).astype(np.float64)
    s2 = (s1 * np.float32(2.0**-8)).astype(np.float32)
    sw2 = (s2[:, None] * wd["p.w_scale"][None, :]).astype(np.float32).astype(np.float64)
    main = 127.0 * q1[:, perm].astype(np.float64) * sw1
    got = (y - main) / (127.0 * sw2)
    assert np.abs(got - np.rint(got)).max() < 0.05, "not a whole number of q2 steps"
    got = np.rint(got)
    want2, _ = qp.first_row_residual(xt, q, s1, zp, rows)
    np.testing.assert_array_equal(got[rows], want2[:, perm].astype(np.float64))
    other = np.setdiff1d(np.arange(T), rows)
    assert (got[other] == 0).all(), "a second term on a row that starts no sequence"
    assert np.abs(want2).max() > 0 and (want2 != 0).mean() > 0.5  # a residual there to carry


@cuda
@pytest.mark.parametrize("T,cu", BATCHES)
@pytest.mark.parametrize("quant,mode,tr", MODES)
def test_linear_first_row_vs_emulation(T, cu, quant, mode, tr):
    N, K = 40, 72
    rng = np.random.default_rng(T * 11 + quant + len(mode) + len(tr))
    x = _rows(rng, T, K, cu)
    shift, mul = _transform(rng, K, tr)
    wd = _weights(rng, N, K, shift, mul)
    r = _rand(rng, T, N)
    lq = SimpleNamespace(scheme=mode, amax=STATIC_AMAX, first_row=True)
    got = _linear(x, wd, cu, quant, mode, shift, mul, act="gelu", r=r)
    lin = ref.linear_apply(x, wd, "p", lq, cu_seqlens=np.asarray(cu))
    lin0 = ref.linear_apply(x, wd, "p", lq)  # one quantisation per row
    r16 = f16(r)
    want = ref.activation(lin.astype(np.float64), "gelu") + r16
    want0 = ref.activation(lin0.astype(np.float64), "gelu") + r16
    assert np.isfinite(got).all(), "output not fully written"
    err = np.abs(got - want)
    assert err.max() <= 1e-4 * max(1.0, np.abs(want).max()), err.max()
    rows = np.asarray(cu[:-1])
    other = np.setdiff1d(np.arange(T), rows)
    np.testing.assert_array_equal(want[other], want0[other])  # only first rows change
    # the second term is there (and not on the others): the first rows move far beyond the error
    assert np.abs(want0[rows] - want[rows]).max() > 100 * max(err.max(), 1e-6)


@cuda
@pytest.mark.parametrize("quant,mode,tr", MODES)
def test_linear_first_row_nan_rows(quant, mode, tr):
    """A NaN in a first row or in another row: that row's outputs are all NaN (its a_scale,
    hence s2, is NaN), the other rows match the emulation."""
    T, cu = BATCHES[-1]
    N, K = 24, 72
    rng = np.random.default_rng(quant + len(mode) + len(tr))
    x = _rows(rng, T, K, cu)
    bad = [15, 20]  # a first row (the last of tile 0), a row inside a sequence
    x[15, 40] = np.nan
    x[20, 0] = np.nan
    shift, mul = _transform(rng, K, tr)
    wd = _weights(rng, N, K, shift, mul)
    got = _linear(x, wd, cu, quant, mode, shift, mul)
    assert np.isnan(got[bad]).all(), "a NaN row passed"
    good = np.setdiff1d(np.arange(T), bad)
    lq = SimpleNamespace(scheme=mode, amax=STATIC_AMAX, first_row=True)
    with np.errstate(invalid="ignore"):
        want = ref.linear_apply(x, wd, "p", lq, cu_seqlens=np.asarray(cu)).astype(np.float64)
    assert np.isfinite(got[good]).all()
    err = np.abs(got[good] - want[good])
    assert err.max() <= 1e-5 * max(1.0, np.abs(want[good]).max()), err.max()
