"""pool (+ normalize): p[b] = mean / cls / max of x over the rows of sequence b, then
optionally p / max(||p||_2, 1e-12). One program per sequence slot; an empty slot (padding
of cu_seqlens with T) writes zeros. ``flag_ptr[0] != 0`` turns normalisation on, read from
device memory so that one captured graph serves both settings.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def pool_kernel(
    x_ptr,  # [T, H] hidden states, row stride ldx
    cu_ptr,  # [n_seq + 1] int32
    flag_ptr,  # [1] int32: normalise when != 0
    p_ptr,  # [n_seq, H] fp32 output
    H,
    ldx,
    MODE: tl.constexpr,  # 0 mean, 1 cls, 2 max
    BLOCK_R: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    b = tl.program_id(0)
    s = tl.load(cu_ptr + b)
    e = tl.load(cu_ptr + b + 1)
    cols = tl.arange(0, BLOCK_H)
    c_ok = cols < H
    if MODE == 1:
        x = tl.load(x_ptr + s.to(tl.int64) * ldx + cols, mask=c_ok & (e > s), other=0).to(tl.float32)
        p = x
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
                acc = tl.maximum(acc, tl.where(m2, x, float("-inf")))
        if MODE == 0:
            n = tl.maximum(e - s, 1).to(tl.float32)
            p = tl.sum(acc, 0) / n
        else:
            p = tl.max(acc, 0)
            p = tl.where(e > s, p, 0.0)
    p = tl.where(c_ok, p, 0.0)
    flag = tl.load(flag_ptr)
    nrm = tl.sqrt(tl.sum(p * p, 0))
    div = tl.where(flag != 0, tl.maximum(nrm, 1e-12), 1.0)
    tl.store(p_ptr + b * H + cols, p / div, mask=c_ok)


MODES = {"mean": 0, "cls": 1, "max": 2}


def pick_config(H: int) -> dict:
    bh = triton.next_power_of_2(H)
    return dict(BLOCK_R=max(1, min(32, 8192 // bh)), BLOCK_H=bh, num_warps=4)


def launch_pool(x, cu, flag, p, n_seq, H, mode, cfg=None):
    cfg = cfg or pick_config(H)
    pool_kernel[(n_seq,)](x, cu, flag, p, H, x.stride(0), MODE=MODES[mode], **cfg)
