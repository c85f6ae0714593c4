"""The decoder linear (zoi/decoder/cuda/kernels_linear.py) against numpy: INT8 weight-only,
FP16 and FP32 weights, decode and prefill shapes, split-K, every fused epilogue."""

from __future__ import annotations

import numpy as np
import pytest
from tests.decoder.cuda.helpers import DEV, dev, host, poisoned, rel, torch

from zoi.decoder.cuda import kernels_linear as kl


def quantize(w):
    s = np.maximum(np.abs(w).max(1), 1e-8) / 127.0
    return np.clip(np.round(w / s[:, None]), -127, 127).astype(np.int8), s.astype(np.float32)


def run_case(
    rng, M, N, K, wdt, cfg, *, rms=False, bias=False, res=False, swiglu=False, gather=False, reps=1,
    pdl=False,
):  # fmt: skip
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


def test_pick_config_splits_decode():
    c = kl.pick_config(1, 2048, 8192, 132)
    assert c.split_k > 1 and kl.counters(1, 2048, c) * c.split_k >= 132
    assert kl.pick_config(512, 2048, 2048, 132).split_k == 1
