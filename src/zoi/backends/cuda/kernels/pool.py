"""pool (+ normalize): p[b] = mean / cls / max / last of x over the rows of sequence b, then
optionally p / max(||p||_2, 1e-12), written as fp32 [B, H]. "last" is the last token of each
sequence (decoder embedders: sentence-transformers' lasttoken); "rows" reads row b of x itself
(x already [B, H]: the output of the Dense modules after the pool, normalised here). NORM off:
never normalised (a pool whose [B, H] rows the Dense modules read). The call header in device
memory holds B and the normalise flag, so that one captured graph serves every batch size and
both settings; programs stride over the B sequences. Max pooling keeps a NaN (NaN-propagating
maxima).
"""

from __future__ import annotations

import triton
import triton.language as tl

from zoi.backends.cuda.kernels.common import colmax_nan
from zoi.backends.cuda.kernels.pdl import pdl_begin


@triton.jit
def pool_kernel(
    x_ptr,  # [T, H] hidden states, row stride ldx
    cu_ptr,  # [B + 1] int32
    hdr_ptr,  # [>=3] int32 call header: [normalize flag, B, T]
    p_ptr,  # [B, H] fp32 output
    H,
    ldx,
    MODE: tl.constexpr,  # 0 mean, 1 cls, 2 max, 3 last, 4 rows (MODES)
    BLOCK_R: tl.constexpr,
    BLOCK_H: tl.constexpr,
    PDL: tl.constexpr,
    NORM: tl.constexpr = True,  # False: never normalise (the header's flag is for the output)
):
    pdl_begin(PDL)  # programmatic dependent launch: wait for the previous kernel's writes
    cols = tl.arange(0, BLOCK_H)
    c_ok = cols < H
    flag = tl.load(hdr_ptr)
    if not NORM:
        flag = flag * 0
    B = tl.load(hdr_ptr + 1)
    for b in range(tl.program_id(0), B, tl.num_programs(0)):
        _pool_one(x_ptr, cu_ptr, p_ptr, b, flag, cols, c_ok, H, ldx, MODE, BLOCK_R, BLOCK_H)


@triton.jit
def _pool_one(
    x_ptr,
    cu_ptr,
    p_ptr,
    b,
    flag,
    cols,
    c_ok,
    H,
    ldx,
    MODE: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    s = tl.load(cu_ptr + b)
    e = tl.load(cu_ptr + b + 1)
    if MODE == 1 or MODE == 3 or MODE == 4:  # one row: the first, the last, or row b
        ok = c_ok & (e > s)  # an empty sequence pools to 0
        if MODE == 1:
            row = s
        elif MODE == 3:
            row = e - 1
        else:
            row = b
            ok = c_ok
        p = tl.load(x_ptr + row.to(tl.int64) * ldx + cols, mask=ok, other=0).to(tl.float32)
    else:
        rr = tl.arange(0, BLOCK_R)
        if MODE == 0:
            acc = tl.zeros((BLOCK_R, BLOCK_H), tl.float32)
        else:
            acc = tl.zeros((BLOCK_R, BLOCK_H), tl.float32) - float("inf")
        for r0 in range(s, e, BLOCK_R):
            rows = r0 + rr
            m2 = (rows < e)[:, None] & c_ok[None, :]
            x = tl.load(x_ptr + rows[:, None].to(tl.int64) * ldx + cols[None, :], mask=m2, other=0)
            x = x.to(tl.float32)
            if MODE == 0:
                acc += x
            else:
                x = tl.where(m2, x, float("-inf"))
                acc = tl.maximum(acc, x, propagate_nan=tl.PropagateNan.ALL)
        if MODE == 0:
            n = tl.maximum(e - s, 1).to(tl.float32)
            p = tl.sum(acc, 0) / n
        else:
            p = colmax_nan(acc)  # a NaN token keeps the column NaN (tl.max would drop it)
            p = tl.where(e > s, p, 0.0)
    p = tl.where(c_ok, p, 0.0)
    nrm = tl.sqrt(tl.sum(p * p, 0))
    div = tl.where(flag != 0, tl.maximum(nrm, 1e-12), 1.0)
    tl.store(p_ptr + b * H + cols, p / div, mask=c_ok)


MODES = {"mean": 0, "cls": 1, "max": 2, "last": 3, "rows": 4}


def pick_config(H: int) -> dict:
    """Rows per step and warps from lab/gpu/pool_sweep.py on the H200 (bench/results/
    gpu_pool_sweep_20261203T1443Z.json, mean + normalise, 128-token sequences): H 384 (BLOCK_H
    512) 32 rows / 8 warps, 1x128 14.3 -> 5.6 us, 256x128 16.3 -> 10.0; H 768 16 rows / 4
    warps, 1x128 20.9 -> 7.6 us, 256x128 49.5 -> 19.9 (the old 16 / 8 rows by 4 warps walked
    a sequence in 8-16 dependent steps)."""
    bh = triton.next_power_of_2(H)
    return dict(BLOCK_R=max(1, min(32, 16384 // bh)), BLOCK_H=bh, num_warps=8 if bh <= 512 else 4)


def launch_pool(x, cu, hdr, p, n_seq, H, mode, cfg=None, pdl=False, normalize=True):
    """p fp32 [>= B, H] (row stride H); normalize False: never normalised (NORM off)."""
    cfg = cfg or pick_config(H)
    pool_kernel[(max(1, min(n_seq, 1024)),)](
        x, cu, hdr, p, H, x.stride(0), MODE=MODES[mode], PDL=pdl, NORM=bool(normalize),
        launch_pdl=pdl, **cfg,
    )  # fmt: skip
