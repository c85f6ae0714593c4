"""The kernel configurations as they were before the lab/gpu sweep (main at b79c276), kept
so that the sweep and the end-to-end A/B can time "before" and "after" in one process.

Copied verbatim from src/zoi/backends/cuda/kernels/{linear,attention,quantize,layernorm}.py.
"""

from __future__ import annotations


def _np2(n: int) -> int:
    return 1 << (int(n) - 1).bit_length()


def linear(M: int, N: int, K: int, quant: bool, ln: bool) -> dict:
    bk = 128 if quant else 64
    if ln:
        bn = _np2(N)
        bm = 16 if M <= 256 else (32 if M <= 4096 else 64)
        if bn >= 1024:
            bk = 64
        warps = 4 if bn * bm <= 8192 else 8
        stages = 3 if bn <= 512 else 2
        return dict(
            BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8, num_warps=warps, num_stages=stages
        )
    if M <= 256:
        return dict(
            BLOCK_M=16,
            BLOCK_N=32 if N <= 512 else 64,
            BLOCK_K=bk,
            GROUP_M=8,
            num_warps=4,
            num_stages=4,
        )
    if M <= 4096:
        return dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=bk, GROUP_M=8, num_warps=4, num_stages=4)
    if N >= 1024:
        return dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=bk, GROUP_M=8, num_warps=8, num_stages=3)
    return dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=bk, GROUP_M=8, num_warps=8, num_stages=4)


def attention(T_bucket: int, head_dim: int) -> dict:
    bm = 16 if T_bucket <= 64 else (64 if T_bucket <= 8192 else 128)
    return dict(BLOCK_M=bm, BLOCK_N=64, BLOCK_D=max(16, _np2(head_dim)), num_warps=4, num_stages=2)


def quantize(K: int) -> dict:
    bk = _np2(K)
    return dict(BLOCK_R=max(1, min(16, 4096 // bk)), BLOCK_K=bk, num_warps=4 if bk <= 1024 else 8)


def layernorm(H: int) -> dict:
    bh = _np2(H)
    return dict(BLOCK_R=max(1, min(16, 4096 // bh)), BLOCK_H=bh, num_warps=4 if bh <= 1024 else 8)
