"""The decoder linear (zoi/backends/cuda/kernels/linear_decode.py) against numpy: INT8 weight-only,
FP16 and FP32 weights, decode and prefill shapes, split-K, every fused epilogue."""

from __future__ import annotations

import numpy as np
import pytest
from tests.decoder.cuda.helpers import DEV, dev, host, poisoned, rel, torch

from zoi.backends.cuda.kernels import linear_decode as kl


def quantize(w):
    s = np.maximum(np.abs(w).max(1), 1e-8) / 127.0
    return np.clip(np.round(w / s[:, None]), -127, 127).astype(np.int8), s.astype(np.float32)


def a8_dot(x, wq, bk):
    """W8A8's x @ Wq^T as the kernels compute it: x quantised per (row, BLOCK_K tile of K) to
    int8 (floor(x / s + 0.5), s = amax / 127 in float32), int dots, times the tile's row scale."""
    M, K = x.shape
    y = np.zeros((M, wq.shape[0]))
    for k0 in range(0, K, bk):
        xs = x[:, k0 : k0 + bk].astype(np.float32)
        a = np.abs(xs).max(1)
        sx = np.where(a > 0, a / np.float32(127.0), np.float32(1.0)).astype(np.float32)
        q = np.clip(np.floor(xs / sx[:, None] + np.float32(0.5)), -127, 127)
        y += (q.astype(np.int64) @ wq[:, k0 : k0 + bk].T.astype(np.int64)) * sx[:, None].astype(
            np.float64
        )
    return y


def run_case(
    rng, M, N, K, wdt, cfg, *, rms=False, bias=False, res=False, swiglu=False, gather=False, reps=1,
    pdl=False, a8=False, ref_a8=None,
):  # fmt: skip
    """ref_a8: whether the expectation mirrors W8A8's int8 x (default: a8)."""
    rows_total = M + 5 if gather else M
    x = rng.standard_normal((rows_total, K)).astype(np.float32)
    nw = 2 * N if swiglu else N
    w = (rng.standard_normal((nw, K)) / np.sqrt(K)).astype(np.float32)
    b = rng.standard_normal(N).astype(np.float32) if bias else None
    r = rng.standard_normal((M, N)).astype(np.float32) if res else None
    rows = rng.permutation(rows_total)[:M].astype(np.int32) if gather else None
    kw = {}
    if wdt == "int8":
        wq, s = quantize(w)
        wd = dev(wq)
        kw["scale"] = dev(s)
        wref = wq.astype(np.float64) * s[:, None]
    elif wdt == "fp16":
        wd = dev(w, torch.float16)
        wref = w.astype(np.float16).astype(np.float64)
    else:
        wd = dev(w)
        wref = w.astype(np.float64)
    xin = x if (rms or wdt == "fp32") else x.astype(np.float16)
    xd = dev(xin)
    xr = xin.astype(np.float64)[rows] if gather else xin.astype(np.float64)
    if rms:
        xr = xr / np.sqrt((xr**2).mean(1, keepdims=True) + 1e-5)
    if wdt != "fp32":  # the kernel feeds the dot fp16 x (before the rms scale)
        xx = (x[rows] if gather else x) if rms else xin[rows] if gather else xin
        xq = xx.astype(np.float16).astype(np.float64)
        xr = xq / np.sqrt((xx.astype(np.float64) ** 2).mean(1, keepdims=True) + 1e-5) if rms else xq
    y = xr @ wref.T
    if (
        a8 if ref_a8 is None else ref_a8
    ):  # the W8A8 reference: int8 x per (row, K tile) of the fp32 x the kernel loads
        xl = (x[rows] if gather else x) if rms else (xin[rows] if gather else xin)
        y = a8_dot(xl.astype(np.float32), wq, cfg.block_k) * s[None, :].astype(np.float64)
        if rms:
            xx = (x[rows] if gather else x).astype(np.float64)
            y = y / np.sqrt((xx**2).mean(1, keepdims=True) + 1e-5)
    if swiglu:
        g, u = y[:, :N], y[:, N:]
        y = g / (1 + np.exp(-g)) * u
    if bias:
        y = y + b
    if res:
        y = y + r
    out = poisoned((M, N), torch.float32 if wdt == "fp32" else torch.float16)
    if res:  # in place, as h += o(x)
        out.copy_(dev(r))
    ws = cnt = None
    if cfg.split_k > 1:
        ws = poisoned((kl.workspace_floats(M, N, cfg, swiglu),), torch.float32)
        cnt = torch.zeros(kl.counters(M, N, cfg), dtype=torch.int32, device=DEV)
    for _ in range(reps):
        if res:
            out.copy_(dev(r))
        kl.linear(
            xd,
            wd,
            out,
            M,
            N,
            K,
            cfg,
            bias=dev(b) if bias else None,
            res=out if res else None,
            rows=dev(rows) if gather else None,
            rms_eps=1e-5 if rms else None,
            swiglu=swiglu,
            ws=ws,
            cnt=cnt,
            ieee=wdt == "fp32",
            pdl=pdl,
            prefetch=pdl,
            a8=a8,
            **kw,
        )
    if cnt is not None:
        assert int(cnt.abs().sum()) == 0, "split-K counters not reset"
    return rel(host(out), y)


TOL = {"fp32": 1e-5, "fp16": 4e-3, "int8": 4e-3}


@pytest.mark.parametrize("wdt", ["int8", "fp16", "fp32"])
@pytest.mark.parametrize("M,N,K", [(1, 40, 72), (5, 33, 100), (19, 70, 48), (70, 24, 40)])
def test_linear_plain(rng, wdt, M, N, K):
    cfg = kl.pick_config(M, N, K, 8, interpret=True)
    assert run_case(rng, M, N, K, wdt, cfg) < TOL[wdt]


@pytest.mark.parametrize("wdt", ["int8", "fp16"])
@pytest.mark.parametrize("split", [2, 3])
def test_linear_split_k_fused(rng, wdt, split):
    cfg = kl.LinearConfig(16, 16, 32, split, 4, 1)
    # decode shape: rms prologue + bias, residual, swiglu, each through the split-K reduce
    assert run_case(rng, 3, 37, 150, wdt, cfg, rms=True, bias=True, reps=2) < TOL[wdt]
    assert run_case(rng, 2, 21, 130, wdt, cfg, res=True, reps=2) < TOL[wdt]
    assert run_case(rng, 4, 18, 100, wdt, cfg, rms=True, swiglu=True) < TOL[wdt]


@pytest.mark.parametrize("wdt", ["int8", "fp32"])
def test_linear_prefill_fused(rng, wdt):
    cfg = kl.pick_config(40, 50, 56, 8, interpret=True)
    assert run_case(rng, 40, 50, 56, wdt, cfg, rms=True, swiglu=True) < TOL[wdt]
    assert run_case(rng, 3, 45, 56, wdt, cfg, rms=True, gather=True) < TOL[wdt]


@pytest.mark.parametrize("kind", ["dot", "mma", "mma-swap"])
@pytest.mark.parametrize("M,N,K", [(3, 37, 150), (17, 70, 100), (32, 24, 64), (40, 50, 56)])
def test_linear_w8a8(rng, kind, M, N, K):
    """W8A8 (a8=True) in the dot and mma kernels against the int8-x reference of the same tiles
    (awkward M, N, K; the K tail tile partial), every epilogue, split-K; and within 3% of the
    weight-only result."""
    bk = 32
    if kind == "dot":
        cfg = kl.LinearConfig(16 if M <= 16 else 32, 16, bk, 1, 4, 1)
        split = kl.LinearConfig(16 if M <= 16 else 32, 16, bk, 3, 4, 1)
    else:
        if M > 32:
            pytest.skip("mma: decode rows (M <= 32)")
        mk = lambda sp: kl.LinearConfig(  # noqa: E731
            16 if M <= 16 else 32, 32, bk, sp, 4, 1, "mma", swap=kind == "mma-swap"
        )
        cfg, split = mk(1), mk(3)
    assert run_case(rng, M, N, K, "int8", cfg, a8=True) < 1e-3
    assert run_case(rng, M, N, K, "int8", split, rms=True, bias=True, a8=True, reps=2) < 1e-3
    assert run_case(rng, M, N, K, "int8", cfg, res=True, a8=True) < 1e-3
    assert run_case(rng, M, N, K, "int8", split, rms=True, swiglu=True, a8=True) < 1e-3
    w8a8 = np.random.default_rng(7)
    # the W8A8 error itself against the weight-only reference (no a8 in the expectation)
    assert run_case(w8a8, M, N, K, "int8", cfg, a8=True, ref_a8=False) < 3e-2


def test_linear_w8a8_refuses_non_int8():
    x = torch.zeros((2, 32), device=DEV)
    with pytest.raises(ValueError, match="W8A8"):
        kl.linear(x, x, x, 2, 32, 32, kl.LinearConfig(16, 16, 32), a8=True)


def test_pick_config_splits_decode():
    c = kl.pick_config(1, 2048, 8192, 132)
    assert c.split_k > 1 and kl.counters(1, 2048, c) * c.split_k >= 132
    assert kl.pick_config(512, 2048, 2048, 132).split_k == 1
