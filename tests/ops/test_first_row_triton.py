"""The first row of each sequence quantised twice (LinearQuant.first_row) in the Triton INT8
path: the row map, the second quantisation of the first rows and the linear kernel's extra
term, against zoi.numerics (primitives.first_row_residual, reference.linear_apply with the
batch's cu_seqlens). Outputs poisoned; awkward batches: one sequence, one row, length-1
sequences, many sequences in one tile, a first row as the last row of a tile, a tile with
none, buffer rows past the call's tokens."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from tests.ops.helpers import DEV, _rand, _transform, cuda, f16, k_lin, k_q, poison, t, torch

from zoi.numerics import primitives as qp
from zoi.numerics import reference as ref

# (T, cu_seqlens): with 16-row tiles, the last case has 4 sequences in tile 0, a first row at
# row 15 (its last) and at row 16 (the next tile's first), and tile 2 (rows 32..36) holds none
BATCHES = [
    (1, [0, 1]),
    (9, [0, 9]),
    (37, [0, 1, 2, 3, 15, 16, 30, 37]),
]
SINK = 150.0  # a massive channel on each first row: its residual is what q2 carries


def _cu(cu):
    return t(np.asarray(cu, np.int32)), t(np.asarray([len(cu) - 1], np.int32))


def _rows(rng, T, K, cu):
    x = _rand(rng, T, K, scale=2.0)
    x[np.asarray(cu[:-1]), 3 % K] = SINK
    return f16(x).astype(np.float32)  # the fp16 values a producer stored


@cuda
@pytest.mark.parametrize("T,cu", BATCHES)
def test_first_row_map(T, cu):
    M = T + 5  # buffer rows past the call's tokens: -1
    cu_t, nb = _cu(cu)
    fr = torch.full((M,), -7, dtype=torch.int32, device=DEV)
    k_q.launch_first_row_map(cu_t, nb, fr, M, block_t=16, block_b=4)
    want = np.full(M, -1, np.int32)
    want[np.asarray(cu[:-1])] = np.arange(len(cu) - 1)
    np.testing.assert_array_equal(fr.cpu().numpy(), want)


@cuda
@pytest.mark.parametrize("T,cu", BATCHES)
@pytest.mark.parametrize(
    "mode,tr,amax", [("dynamic", "none", True), ("static", "mul", False),
                     ("dynamic_asym", "shift+mul", False)],
)  # fmt: skip
def test_first_row_q2_bit_exact(T, cu, mode, tr, amax):
    K, max_batch = 70, len(cu) + 2  # programs past B write nothing
    rng = np.random.default_rng(T * 7 + len(tr) + K)
    x = _rows(rng, T, K, cu)
    shift, mul = _transform(rng, K, tr)
    xt = qp.act_transform(x, shift, mul)
    static_amax = 2.5
    cu_t, nb = _cu(cu)
    q2 = torch.full((max_batch, K), 99, dtype=torch.int8, device=DEV)
    s2 = poison((max_batch,), torch.float32)
    k_q.launch_first_row_q2(
        t(x.astype(np.float16)), cu_t, nb,
        None if shift is None else t(shift), None if mul is None else t(mul),
        q2, s2, K, max_batch, mode=mode, static_amax=static_amax,
        amax=t(np.abs(x).max(axis=1).astype(np.float32)) if amax else None,
    )  # fmt: skip
    if mode == "dynamic_asym":
        q, a_scale, zp = qp.quantize_act_asym(xt)
    else:
        (q, a_scale), zp = qp.quantize_act(xt, static_amax if mode == "static" else None), None
    rows = qp.first_rows(cu, T)
    wq2, ws2 = qp.first_row_residual(xt, q, a_scale, zp, rows)
    B = len(cu) - 1
    got_q2, got_s2 = q2.cpu().numpy(), s2.cpu().numpy()
    np.testing.assert_array_equal(got_q2[:B], wq2)
    np.testing.assert_array_equal(got_s2[:B], ws2)
    assert (ws2 > 0).all() and (np.abs(wq2) > 0).any()  # a residual there to carry
    assert (got_q2[B:] == 99).all() and np.isnan(got_s2[B:]).all()


def _weights(rng, N, K, shift, mul):
    w_q, w_s = qp.quantize_weight(_rand(rng, N, K))
    wd = {"p.w_q": w_q, "p.w_scale": w_s, "p.b": _rand(rng, N, scale=0.1)}
    if shift is not None:
        wd["p.act_shift"] = shift
    if mul is not None:
        wd["p.act_mul"] = mul
    return wd


@cuda
@pytest.mark.parametrize("T,cu", BATCHES)
@pytest.mark.parametrize(
    "quant,mode,tr",
    [
        (1, "dynamic", "none"),  # quantised while loading, the producer's amax
        (2, "static", "none"),
        (4, "dynamic", "mul"),  # int8 copy from quantize_kernel
        (4, "dynamic_asym", "shift+mul"),
        (16, "dynamic_asym", "mul"),  # quantisation folded into the GEMM
    ],
)
def test_linear_first_row_vs_emulation(T, cu, quant, mode, tr):
    N, K = 40, 72
    rng = np.random.default_rng(T * 11 + quant + len(mode) + len(tr))
    x = _rows(rng, T, K, cu)
    shift, mul = _transform(rng, K, tr)
    wd = _weights(rng, N, K, shift, mul)
    r = _rand(rng, T, N)
    static_amax = 2.5
    lq = SimpleNamespace(scheme=mode, amax=static_amax, first_row=True)
    x16, cu_t, nb = t(x.astype(np.float16)), *_cu(cu)
    st, mt = (None if shift is None else t(shift)), (None if mul is None else t(mul))
    B = len(cu) - 1
    fr = torch.full((T,), -7, dtype=torch.int32, device=DEV)
    q2 = torch.full((B, K), 99, dtype=torch.int8, device=DEV)
    s2 = poison((B,), torch.float32)
    k_q.launch_first_row_map(cu_t, nb, fr, T)
    k_q.launch_first_row_q2(
        x16, cu_t, nb, st, mt, q2, s2, K, B, mode=mode, static_amax=static_amax,
        amax=t(np.abs(x).max(axis=1).astype(np.float32)) if quant == 1 else None,
    )  # fmt: skip
    kw = dict(quant=quant, act="gelu", static_amax=static_amax)
    colsum = t(wd["p.w_q"].astype(np.int64).sum(1).astype(np.int32))
    if quant == 1:
        a, a_s = x16, t(np.abs(x).max(axis=1).astype(np.float32))
    elif quant == 2:
        a, a_s = x16, None
    elif quant == 4:
        a = torch.full((T, K), 99, dtype=torch.int8, device=DEV)
        a_s = poison((T,), torch.float32)
        zp = torch.full((T,), -7, dtype=torch.int32, device=DEV)
        k_q.launch_quantize(x16, st, mt, a, a_s, zp, T, K, mode=mode)
        if mode == "dynamic_asym":
            kw.update(a_zp=zp, colsum=colsum)
    else:
        a, a_s = x16, None
        kw.update(in_mode=mode, in_shift=st, in_mul=mt, colsum=colsum)
    y = poison((T, N), torch.float32)
    cfg = dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=32, GROUP_M=8, num_warps=4, num_stages=2)
    k_lin.launch_linear(
        a, a_s, t(wd["p.w_q"]), t(wd["p.w_scale"]), t(wd["p.b"]), t(r, torch.float16),
        None, None, y, None, T, N, K, cfg=cfg, first_row=(fr, q2, s2), **kw,
    )  # fmt: skip
    lin = ref.linear_apply(x, wd, "p", lq, cu_seqlens=np.asarray(cu))
    lin0 = ref.linear_apply(x, wd, "p", lq)  # one quantisation per row
    r16 = f16(r)
    want = ref.activation(lin.astype(np.float64), "gelu") + r16
    want0 = ref.activation(lin0.astype(np.float64), "gelu") + r16
    got = y.cpu().numpy().astype(np.float64)
    assert np.isfinite(got).all(), "output not fully written"
    err = np.abs(got - want)
    assert err.max() <= 1e-4 * max(1.0, np.abs(want).max()), err.max()
    rows = np.asarray(cu[:-1])
    other = np.setdiff1d(np.arange(T), rows)
    np.testing.assert_array_equal(want[other], want0[other])  # only first rows change
    # the second term is there (and not on the others): the first rows move far beyond the error
    assert np.abs(want0[rows] - want[rows]).max() > 100 * max(err.max(), 1e-6)
