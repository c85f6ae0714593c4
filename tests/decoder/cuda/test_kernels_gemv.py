"""The decode kernels of the decoder linear (gemv_kernel without tl.dot, mma_kernel on
K-contiguous W tiles) against a float64 reference of the exact inputs, at awkward shapes (N, K
not multiples of the tile), M 1 / 3 / 16, every epilogue flag, split-K on and off, outputs
poisoned with NaN, NaN inputs reaching the outputs; and the config table's rules."""

from __future__ import annotations

import numpy as np
import pytest
from tests.decoder.cuda.helpers import DEV, INTERP, dev, host, poisoned, rel, torch

from zoi.backends.cuda.kernels import linear_decode as kl
from zoi.backends.cuda.kernels import linear_table as lt

EPS = 1e-5


def quantize(w):
    s = np.maximum(np.abs(w).max(1), 1e-8) / 127.0
    return np.clip(np.round(w / s[:, None]), -127, 127).astype(np.int8), s.astype(np.float32)


def make(rng, M, N, K, wdt, *, rms=False, bias=False, res=False, swiglu=False, gather=False):
    """Inputs as the backend passes them (x fp32 at the RMS sites, else the activation dtype;
    out fp32 with a residual, else the activation dtype) and the float64 reference."""
    act = torch.float32 if wdt == "fp32" else torch.float16
    xdt = torch.float32 if (rms or wdt == "fp32") else act
    rows_total = M + 5 if gather else M
    x = rng.standard_normal((rows_total, K)).astype(np.float32) * 2.0
    x = torch.from_numpy(x).to(xdt).to(DEV)
    nw = 2 * N if swiglu else N
    w = (rng.standard_normal((nw, K)) / np.sqrt(K)).astype(np.float32)
    c = dict(x=x, scale=None)
    if wdt == "int8":
        wq, s = quantize(w)
        c["w"], c["scale"] = dev(wq), dev(s)
        wref = wq.astype(np.float64) * s.astype(np.float64)[:, None]
    else:
        wt = torch.from_numpy(w).to(act)
        c["w"] = wt.to(DEV)
        wref = wt.double().numpy()
    c["bias"] = dev(rng.standard_normal(N).astype(np.float32)) if bias else None
    c["rows"] = dev(rng.permutation(rows_total)[:M].astype(np.int32)) if gather else None
    c["r"] = rng.standard_normal((M, N)).astype(np.float32) if res else None
    c["out_dt"] = torch.float32 if res else act
    c["kw"] = dict(rms=rms, bias=bias, res=res, swiglu=swiglu, gather=gather)
    c["M"], c["N"], c["K"] = M, N, K
    c["wref"] = wref
    return c


def reference(c):
    x = host(c["x"]).astype(np.float64)
    if c["rows"] is not None:
        x = x[host(c["rows"])]
    if c["kw"]["rms"]:
        x = x / np.sqrt((x**2).mean(1, keepdims=True) + EPS)
    y = x @ c["wref"].T
    N = c["N"]
    if c["kw"]["swiglu"]:
        g, u = y[:, :N], y[:, N:]
        y = g / (1 + np.exp(-g)) * u
    if c["bias"] is not None:
        y = y + host(c["bias"]).astype(np.float64)
    if c["r"] is not None:
        y = y + c["r"]
    return y


def launch(c, cfg, reps=1, ieee=False):
    M, N, K, kw = c["M"], c["N"], c["K"], c["kw"]
    out = poisoned((M, N), c["out_dt"])
    ws = cnt = None
    if cfg.split_k > 1:
        ws = poisoned((kl.workspace_floats(M, N, cfg, kw["swiglu"]),), torch.float32)
        cnt = torch.zeros(kl.counters(M, N, cfg), dtype=torch.int32, device=DEV)
    for _ in range(reps):  # twice: the counters must be back at 0 (a replayed graph)
        if kw["res"]:
            out.copy_(dev(c["r"]))  # in place, as h += o(x)
        kl.linear(
            c["x"],
            c["w"],
            out,
            M,
            N,
            K,
            cfg,
            scale=c["scale"],
            bias=c["bias"],
            res=out if kw["res"] else None,
            rows=c["rows"],
            rms_eps=EPS if kw["rms"] else None,
            swiglu=kw["swiglu"],
            ws=ws,
            cnt=cnt,
            ieee=ieee,
        )
    if cnt is not None:
        assert int(cnt.abs().sum()) == 0, "split-K counters not reset"
    return out


def tol(c, cfg):
    """Exact products with fp32 sums (gemv, IEEE): the fp16 output's rounding (2**-11) or ~1e-6;
    mma feeds the dot fp16 x (the fp32 residual stream at the RMS sites): ~2**-11 more."""
    fp16_out = c["out_dt"] == torch.float16
    if cfg.kind == "gemv" or c["w"].dtype == torch.float32:
        return 1.2e-3 if fp16_out else 2e-5
    return 3e-3


def check(rng, M, N, K, wdt, cfg, reps=1, **kw):
    c = make(rng, M, N, K, wdt, **kw)
    out = launch(c, cfg, reps, ieee=wdt == "fp32")
    e = rel(host(out), reference(c))
    assert e < tol(c, cfg), (M, N, K, wdt, cfg, kw, e)
    return e


FLAGS = [
    dict(),
    dict(rms=True, bias=True),  # qwen2's qkv
    dict(res=True),  # o / down: h += o(x), out aliases res
    dict(rms=True, swiglu=True),  # gate|up
    dict(rms=True, gather=True),  # lm_head over the last token of each prompt
]


def gemv(bm, split=1, bn=32, bk=64, fast=True):
    return kl.LinearConfig(bm, bn, bk, split, 4, 1, "gemv", fast_cvt=fast)


def mma(split=1, bn=32, bk=32, swap=False, fast=True, bm=16):
    return kl.LinearConfig(bm, bn, bk, split, 4, 1, "mma", swap=swap, fast_cvt=fast)


@pytest.mark.parametrize("wdt", ["int8", "fp16", "fp32"])
@pytest.mark.parametrize("flags", range(len(FLAGS)))
def test_gemv_epilogues(rng, wdt, flags):
    kw = FLAGS[flags]
    check(rng, 1, 70, 200, wdt, gemv(1), **kw)  # N, K not multiples of the 32 x 64 tile
    check(rng, 3, 45, 136, wdt, gemv(4, split=2), reps=2, **kw)  # row 3 of the tile masked


@pytest.mark.parametrize("wdt", ["int8", "fp16"])
@pytest.mark.parametrize("flags", range(len(FLAGS)))
def test_mma_epilogues(rng, wdt, flags):
    kw = FLAGS[flags]
    check(rng, 3, 40, 100, wdt, mma(), **kw)
    check(rng, 16, 37, 150, wdt, mma(split=3, swap=True), reps=2, **kw)


# 16 rows in 4 tiles of 4: the slow tier (~11 s in the interpreter); several row tiles are
# (3, 2)'s (the second one masked), a tile taller than M is (3, 4)'s
@pytest.mark.parametrize(
    "M,bm", [(1, 1), (3, 2), (3, 4), pytest.param(16, 4, marks=pytest.mark.slow)]
)
def test_gemv_rows_and_split(rng, M, bm):
    for split in (1, 3, 5):  # 5: past one unrolled trip of the reduction
        check(rng, M, 33, 300, "int8", gemv(bm, split=split), reps=2, rms=True)
    check(rng, M, 50, 72, "fp16", gemv(bm, split=2), res=True)


@pytest.mark.parametrize("M", [1, 3, 16])
@pytest.mark.parametrize("swap", [False, True])
def test_mma_rows_split_swap(rng, M, swap):
    check(rng, M, 33, 130, "int8", mma(split=2, swap=swap), reps=2, rms=True, swiglu=True)
    check(rng, M, 21, 64, "fp32", mma(swap=swap), res=True)  # IEEE dot


def test_int8_conversion_paths_agree(rng):
    """The exponent-bit INT8 conversions (FAST_CVT) are exact: bit-identical to I2F's result."""
    c = make(rng, 2, 40, 160, "int8", rms=True)
    for cfg, slow in ((gemv(2), gemv(2, fast=False)), (mma(), mma(fast=False))):
        a, b = launch(c, cfg), launch(c, slow)
        assert torch.equal(a, b), cfg.kind


def test_every_int8_value_converts(rng):
    """q = -127..127 (and -128) through each kernel: one output column per code, x = 1."""
    K = 64
    codes = np.arange(-128, 128, dtype=np.int32)
    N = codes.size
    wq = np.zeros((N, K), np.int8)
    wq[:, 5] = codes.astype(np.int8)
    x = np.zeros((1, K), np.float16)
    x[0, 5] = 1.0
    s = np.ones(N, np.float32)
    for cfg in (gemv(1, bn=64), mma(bn=64)):
        out = poisoned((1, N), torch.float32)
        kl.linear(dev(x), dev(wq), out, 1, N, K, cfg, scale=dev(s))
        assert np.array_equal(host(out)[0], codes.astype(np.float32)), cfg.kind


@pytest.mark.parametrize("kind", ["gemv", "mma"])
def test_nan_input_reaches_output(rng, kind):
    """A NaN in one row of x makes that row's outputs NaN (never a number), the others finite."""
    for kw in (dict(rms=True), dict(res=True), dict(rms=True, swiglu=True)):
        c = make(rng, 3, 40, 100, "int8", **kw)
        c["x"][1, 37] = float("nan")
        cfg = gemv(4, split=2) if kind == "gemv" else mma(split=2)
        y = host(launch(c, cfg))
        assert np.isnan(y[1]).all(), kw
        assert np.isfinite(y[[0, 2]]).all(), kw


def test_bad_configs_named():
    c = kl.LinearConfig(8, 32, 64, 1, 4, 1, "gemv")
    x, w = torch.zeros((1, 64), device=DEV), torch.zeros((32, 64), device=DEV)
    out = torch.zeros((1, 32), device=DEV)
    with pytest.raises(ValueError, match="block_m must be 1, 2 or 4"):
        kl.linear(x, w, out, 1, 32, 64, c)
    with pytest.raises(ValueError, match="tl.dot needs"):
        kl.linear(x, w, out, 1, 32, 64, kl.LinearConfig(8, 32, 64, 1, 4, 1, "mma"))
    ws, cnt = torch.zeros(3, device=DEV), torch.zeros(1, dtype=torch.int32, device=DEV)
    with pytest.raises(ValueError, match="workspace_floats"):
        kl.linear(x, w, out, 1, 32, 64, gemv(1, split=2, bk=32), ws=ws, cnt=cnt)


# ----------------------------------------------------------------------------- the config table
LLAMA = [("qkv", 3072, 2048, False), ("o", 2048, 2048, False), ("gu", 8192, 2048, True),
         ("down", 2048, 8192, False), ("lm", 128256, 2048, False)]  # fmt: skip
QWEN = [("qkv", 1152, 896, False), ("o", 896, 896, False), ("gu", 4864, 896, True),
        ("down", 896, 4864, False), ("lm", 151936, 896, False)]  # fmt: skip


@pytest.mark.parametrize("wb", [1, 2, 4])
def test_decode_picks_the_new_kernels(wb):
    """The rule (shapes without a table entry): gemv up to M = 4, mma up to 32, dot beyond;
    split-K until ~2 programs per SM."""
    assert lt.NEW_DECODE, "linear_table.NEW_DECODE is off: decode runs the old dot kernel"
    for site, N, K, sw in LLAMA + QWEN:
        for M in lt.DECODE_BUCKETS:
            c = kl.pick_config(M, N, K, 132, wbytes=wb, swiglu=sw, site=site)
            if (site, M, N, K, lt.WDT[wb]) in lt.DECODE_TABLE:
                continue
            assert c.kind == ("gemv" if M <= 4 else "mma"), (site, M, c)
            assert 1 <= c.split_k <= 16 and c.block_k <= max(64, lt._np2(K))
            tiles = kl.counters(M, N, c)
            assert tiles * c.split_k >= 264 or c.split_k in (lt.cdiv(K, c.block_k), 16), (site, M)
        assert kl.pick_config(300, N, K, 132, wbytes=wb, swiglu=sw, site=site).kind == "dot"


def test_switch_back_to_the_dot_kernel(monkeypatch):
    monkeypatch.setattr(lt, "NEW_DECODE", False)
    for M in lt.DECODE_BUCKETS:
        assert kl.pick_config(M, 2048, 8192, 132, site="down") == lt.pick_dot(M, 2048, 8192, 132)


def test_table_entry_wins_and_entries_valid(monkeypatch):
    mine = kl.LinearConfig(1, 128, 1024, 2, 8, 1, "gemv")
    monkeypatch.setitem(lt.DECODE_TABLE, ("o", 1, 2048, 2048, "int8"), mine)
    assert kl.pick_config(1, 2048, 2048, 132, wbytes=1, site="o") is mine
    assert kl.pick_config(1, 2048, 2048, 132, wbytes=2, site="o") is not mine  # fp16: the rule
    assert kl.pick_config(2, 2048, 2048, 132, wbytes=1, site="o") is not mine  # bucket 2
    for (site, M, _n, _k, dt), c in lt.DECODE_TABLE.items():
        assert site in ("qkv", "o", "gu", "down", "lm") and M in lt.DECODE_BUCKETS, (site, M)
        assert dt in lt.WDT.values() and c.kind in lt.KINDS
        assert c.kind != "gemv" or c.block_m in (1, 2, 4)
        assert c.kind != "mma" or min(c.block_m, c.block_n, c.block_k) >= 16
        for b in (c.block_n, c.block_k):
            assert b & (b - 1) == 0


@pytest.mark.skipif(INTERP, reason="real decode tiles: compiled on the GPU (scripts/gpu_check.sh)")
@pytest.mark.parametrize("wdt", ["int8", "fp16"])
@pytest.mark.parametrize("M", [1, 4, 32])
def test_picked_configs_compiled(rng, wdt, M):
    """What pick_config gives on this GPU at the Llama-3.2-1B sites (table or rule), compiled."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    wb = {"int8": 1, "fp16": 2}[wdt]
    for site, N, K, sw in LLAMA[:4]:
        kw = dict(qkv=dict(rms=True, bias=True), o=dict(res=True), gu=dict(rms=True, swiglu=True),
                  down=dict(res=True))[site]  # fmt: skip
        cfg = kl.pick_config(M, N, K, sms, wbytes=wb, swiglu=sw, site=site)
        check(rng, M, N, K, wdt, cfg, reps=2, **kw)
