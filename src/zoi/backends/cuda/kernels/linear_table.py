"""The linear kernels' measured tile tables: the encoder linear's (kernels/linear.py pick_config
reads _LINEAR) and the decode / prefill linear's (kernels/linear_decode.py) with its config rules.

## The decode / prefill linear (kernels/linear_decode.py)

Tile configs of the decode / prefill linear: which kernel and tiles each call site gets.

Three config kinds (``LinearConfig.kind``) over two kernels:

* ``"dot"``: the mma kernel with W tiles read [BLOCK_K, BLOCK_N] through strides (``W_KN``, no
  register transpose); prefill (M > 32), and two M = 32 fp16 sites the decode sweep picked.
* ``"gemv"``: decode at M <= 4: no tl.dot, W tiles [BLOCK_N, BLOCK_K] with K contiguous (16-byte
  loads), BLOCK_M rows (1, 2, 4) per program, fp32 multiply-accumulate, tl.sum over K.
* ``"mma"``: decode at 4 < M <= 32: tl.dot on W tiles loaded [BLOCK_N, BLOCK_K] K-contiguous and
  transposed in registers (``swap``: W is the dot's left operand, out^T = W x^T).

Decode configs come from DECODE_TABLE, keyed by (site, M bucket, N, K, weight dtype), filled in
from lab/gpu/sweep_gemv.py's "table" output on the H200 (edit it after a sweep); a shape not in
the table takes ``decode_rule``. The split-K of an entry is what the sweep timed on 132 SMs.
"""

from __future__ import annotations

from dataclasses import dataclass

# Winners of lab/gpu/sweep_linear.py on the H200 (bench/results/gpu_sweep_20261201T0959Z.json:
# every config compiled, checked against a float64 torch reference on fresh random inputs with
# poisoned outputs, then timed as the median of CUDA-graph replays), per (precision, N, K)
# and token bucket M: (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages), GROUP_M 8.
# INT8 = QUANT 4 (int8 A, asym) with the real epilogues (bias; GELU for ffn1). Times in us per
# launch, the pick before the sweep -> the winner.
# A bucket between the measured ones takes the nearest one's (log scale).
# Persistent-tile sweep, 2026-12-03 (bench/results/gpu_sweep_persist_20261203T1417Z.json: INT8 plain / gelu at
# 4096 / 32768 tokens, 660 units, 0 wrong): 128x128x128 / 4 warps / 3 stages won the large-M
# plain sites (minilm qkv 62.1 -> 60.1, o 21.6 -> 20.8, ffn2 46.3 -> 43.1 us; bert-base qkv
# 158.4 -> 147.8, o 57.1 -> 53.3, ffn2 151.3 -> 128.1 us), entered below. The same sweep
# timed a persistent variant of this kernel (grid-stride over the output tiles, tile and K
# loops flattened): it won nowhere by more than 0.5% and lost up to 15% (ffn1 148 vs 131 us),
# so it was removed again (lab/gpu/NOTES.md, "Persistent GEMM tiles").
_LINEAR = {
    # minilm qkv: v1 -> best us at M=4096 12.9 -> 10.6, M=32768 77.1 -> 62.2
    ("int8", 1152, 384): {
        16: (16, 64, 128, 4, 4),
        128: (16, 64, 128, 4, 3),
        1024: (64, 64, 128, 4, 3),
        4096: (64, 128, 128, 4, 3),
        16384: (128, 64, 64, 4, 3),
        32768: (128, 128, 128, 4, 3),
    },
    # minilm o: v1 -> best us at M=4096 5.7 -> 5.2, M=32768 31.7 -> 22.2
    ("int8", 384, 384): {
        16: (16, 64, 128, 4, 3),
        128: (16, 32, 128, 4, 4),
        1024: (64, 64, 128, 4, 4),
        4096: (64, 64, 128, 4, 3),
        16384: (64, 128, 128, 4, 3),
        32768: (128, 128, 128, 4, 3),
    },
    # minilm ffn1: v1 -> best us at M=4096 21.4 -> 18.8, M=32768 177.8 -> 132.0
    ("int8", 1536, 384): {
        16: (16, 64, 128, 4, 4),
        128: (16, 64, 128, 4, 3),
        1024: (64, 64, 128, 4, 3),
        4096: (64, 128, 128, 4, 3),
        16384: (64, 128, 128, 4, 3),
        32768: (64, 128, 128, 4, 3),
    },
    # minilm ffn2: v1 -> best us at M=4096 8.4 -> 8.4, M=32768 59.6 -> 46.7
    ("int8", 384, 1536): {
        16: (32, 32, 256, 4, 3),
        128: (16, 32, 128, 4, 4),
        1024: (64, 64, 128, 4, 4),
        4096: (64, 64, 128, 4, 4),
        16384: (64, 128, 128, 4, 3),
        32768: (128, 128, 128, 4, 3),
    },
    # bert-base qkv: v1 -> best us at M=4096 27.9 -> 23.4, M=32768 180.0 -> 158.9
    ("int8", 2304, 768): {
        16: (16, 64, 128, 4, 4),
        128: (32, 32, 128, 4, 3),
        1024: (64, 128, 128, 4, 3),
        4096: (64, 128, 128, 4, 3),
        16384: (128, 128, 64, 4, 4),
        32768: (128, 128, 128, 4, 3),
    },
    # bert-base o: v1 -> best us at M=4096 10.9 -> 8.9, M=32768 78.0 -> 58.2
    ("int8", 768, 768): {
        16: (16, 64, 128, 4, 4),
        128: (32, 32, 256, 4, 3),
        1024: (64, 64, 128, 4, 4),
        4096: (64, 128, 128, 4, 3),
        16384: (128, 128, 64, 4, 4),
        32768: (128, 128, 128, 4, 3),
    },
    # bert-base ffn1: v1 -> best us at M=4096 47.7 -> 41.9, M=32768 409.4 -> 325.9
    ("int8", 3072, 768): {
        16: (16, 64, 128, 4, 4),
        128: (32, 32, 128, 4, 3),
        1024: (64, 128, 128, 4, 3),
        4096: (64, 128, 128, 4, 3),
        16384: (64, 128, 128, 4, 3),
        32768: (64, 128, 128, 4, 3),
    },
    # bert-base ffn2: v1 -> best us at M=4096 23.4 -> 19.3, M=32768 188.6 -> 152.5
    ("int8", 768, 3072): {
        16: (32, 32, 256, 4, 4),
        128: (32, 32, 256, 4, 4),
        1024: (64, 64, 128, 4, 4),
        4096: (64, 128, 128, 4, 3),
        16384: (128, 128, 64, 4, 4),
        32768: (128, 128, 128, 4, 3),
    },
    # minilm qkv: v1 -> best us at M=4096 14.5 -> 12.9, M=32768 98.7 -> 74.0
    ("fp16", 1152, 384): {
        16: (16, 64, 128, 4, 4),
        128: (32, 32, 128, 4, 3),
        1024: (64, 64, 64, 4, 3),
        4096: (64, 128, 64, 4, 3),
        16384: (128, 128, 64, 4, 3),
        32768: (128, 128, 64, 4, 3),
    },
    # minilm o: v1 -> best us at M=4096 6.6 -> 6.1, M=32768 35.4 -> 27.7
    ("fp16", 384, 384): {
        16: (32, 32, 128, 4, 3),
        128: (16, 32, 64, 4, 4),
        1024: (64, 64, 64, 4, 4),
        4096: (64, 64, 64, 4, 3),
        16384: (128, 128, 64, 4, 3),
        32768: (128, 128, 64, 4, 3),
    },
    # minilm ffn1: v1 -> best us at M=4096 23.3 -> 20.6, M=32768 161.3 -> 148.5
    ("fp16", 1536, 384): {
        16: (16, 64, 64, 4, 4),
        128: (32, 32, 64, 4, 4),
        1024: (64, 64, 64, 4, 3),
        4096: (128, 128, 64, 8, 3),
        16384: (128, 128, 64, 8, 3),
        32768: (128, 64, 64, 4, 3),
    },
    # minilm ffn2: v1 -> best us at M=4096 15.5 -> 13.1, M=32768 82.9 -> 75.4
    ("fp16", 384, 1536): {
        16: (16, 32, 64, 4, 4),
        128: (32, 32, 128, 4, 4),
        1024: (64, 64, 128, 4, 4),
        4096: (128, 128, 64, 4, 3),
        16384: (128, 128, 64, 8, 3),
        32768: (128, 128, 64, 4, 3),
    },
    # bert-base qkv: v1 -> best us at M=4096 40.1 -> 33.1, M=32768 292.2 -> 238.0
    ("fp16", 2304, 768): {
        16: (16, 64, 128, 4, 4),
        128: (32, 64, 64, 4, 3),
        1024: (128, 64, 64, 4, 3),
        4096: (128, 128, 64, 4, 3),
        16384: (128, 128, 64, 4, 3),
        32768: (128, 128, 64, 4, 3),
    },
    # bert-base o: v1 -> best us at M=4096 16.5 -> 12.3, M=32768 99.2 -> 81.4
    ("fp16", 768, 768): {
        16: (16, 64, 128, 4, 3),
        128: (16, 64, 128, 4, 3),
        1024: (128, 64, 64, 4, 3),
        4096: (128, 64, 64, 4, 3),
        16384: (128, 128, 64, 4, 3),
        32768: (128, 128, 64, 4, 3),
    },
    # bert-base ffn1: v1 -> best us at M=4096 62.3 -> 52.8, M=32768 422.7 -> 422.0
    ("fp16", 3072, 768): {
        16: (16, 64, 64, 4, 4),
        128: (32, 128, 128, 4, 3),
        1024: (128, 64, 64, 4, 3),
        4096: (128, 128, 64, 8, 3),
        16384: (128, 128, 64, 8, 3),
        32768: (128, 256, 32, 8, 4),
    },
    # bert-base ffn2: v1 -> best us at M=4096 52.9 -> 40.6, M=32768 319.0 -> 280.7
    ("fp16", 768, 3072): {
        16: (16, 64, 128, 4, 4),
        128: (32, 32, 128, 4, 3),
        1024: (128, 64, 64, 4, 4),
        4096: (128, 64, 64, 4, 3),
        16384: (256, 128, 64, 8, 3),
        32768: (256, 128, 64, 8, 3),
    },
}


@dataclass(frozen=True)
class LinearConfig:
    block_m: int
    block_n: int
    block_k: int
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 3
    kind: str = "dot"  # "dot" | "gemv" | "mma"
    swap: bool = False  # mma: W is the left operand of the dot (acc^T [BLOCK_N, BLOCK_M])
    fast_cvt: bool = True  # gemv / mma INT8: int8 -> float by exponent bits, not I2F


KINDS = ("dot", "gemv", "mma")
SMEM_BUDGET = 160 * 1024  # bytes of pipelined tiles per program (H100 / H200: 227 KB per block)
DECODE_BUCKETS = (1, 2, 4, 8, 16, 32)
NEW_DECODE = True  # False: decode on "dot" configs (pick_dot), as before the GEMV
WDT = {1: "int8", 2: "fp16", 4: "fp32"}

# (site, M bucket, N, K, weight dtype) -> config. Sites: qkv (+RMS, +bias on qwen2), o (+residual),
# gu (SwiGLU gate|up, +RMS; N is the gate width), down (+residual), lm (+RMS).
# Paste lab/gpu/sweep_gemv.py's "table" lines here; None of the shapes here are required.
# fmt: off
DECODE_TABLE: dict[tuple[str, int, int, int, str], LinearConfig] = {
    ("down", 1, 2048, 8192, "fp16"): LinearConfig(1, 32, 256, 7, 8, 1, "gemv", swap=False, fast_cvt=True),  # 11.68 us, 2875.7 GB/s
    ("down", 1, 2048, 8192, "int8"): LinearConfig(1, 64, 512, 13, 8, 1, "gemv", swap=False, fast_cvt=True),  # 8.41 us, 2000.6 GB/s
    ("down", 32, 896, 4864, "fp16"): LinearConfig(32, 32, 256, 10, 4, 3, "dot", swap=False, fast_cvt=True),  # 7.57 us, 1223.2 GB/s
    ("down", 32, 896, 4864, "int8"): LinearConfig(32, 32, 128, 15, 4, 3, "mma", swap=True, fast_cvt=True),  # 7.86 us, 624.0 GB/s
    ("gu", 1, 8192, 2048, "fp16"): LinearConfig(1, 32, 256, 1, 8, 1, "gemv", swap=False, fast_cvt=True),  # 18.03 us, 3724.0 GB/s
    ("gu", 1, 8192, 2048, "int8"): LinearConfig(1, 32, 256, 2, 8, 1, "gemv", swap=False, fast_cvt=True),  # 12.64 us, 2662.1 GB/s
    ("gu", 32, 4864, 896, "fp16"): LinearConfig(32, 64, 64, 2, 4, 3, "mma", swap=True, fast_cvt=True),  # 12.11 us, 1475.0 GB/s
    ("gu", 32, 4864, 896, "int8"): LinearConfig(32, 64, 128, 2, 4, 3, "mma", swap=False, fast_cvt=True),  # 13.52 us, 679.3 GB/s
    ("lm", 1, 128256, 2048, "fp16"): LinearConfig(1, 128, 256, 1, 4, 1, "gemv", swap=False, fast_cvt=True),  # 119.31 us, 4407.4 GB/s
    ("lm", 1, 128256, 2048, "int8"): LinearConfig(1, 32, 256, 1, 4, 1, "gemv", swap=False, fast_cvt=True),  # 67.34 us, 3915.9 GB/s
    ("lm", 32, 151936, 896, "fp16"): LinearConfig(32, 128, 64, 1, 4, 3, "mma", swap=True, fast_cvt=True),  # 77.45 us, 3767.8 GB/s
    ("lm", 32, 151936, 896, "int8"): LinearConfig(32, 128, 128, 1, 4, 3, "mma", swap=True, fast_cvt=True),  # 75.48 us, 2070.8 GB/s
    ("o", 1, 2048, 2048, "fp16"): LinearConfig(1, 32, 256, 7, 8, 1, "gemv", swap=False, fast_cvt=True),  # 5.53 us, 1520.1 GB/s
    ("o", 1, 2048, 2048, "int8"): LinearConfig(1, 32, 512, 4, 8, 1, "gemv", swap=False, fast_cvt=True),  # 4.77 us, 884.5 GB/s
    ("o", 32, 896, 896, "fp16"): LinearConfig(32, 32, 256, 4, 4, 3, "dot", swap=False, fast_cvt=True),  # 4.28 us, 442.1 GB/s
    ("o", 32, 896, 896, "int8"): LinearConfig(32, 32, 128, 5, 4, 3, "mma", swap=True, fast_cvt=True),  # 4.74 us, 230.4 GB/s
    ("qkv", 1, 3072, 2048, "fp16"): LinearConfig(1, 32, 256, 5, 4, 1, "gemv", swap=False, fast_cvt=True),  # 6.39 us, 1971.5 GB/s
    ("qkv", 1, 3072, 2048, "int8"): LinearConfig(1, 32, 256, 5, 4, 1, "gemv", swap=False, fast_cvt=True),  # 5.53 us, 1142.9 GB/s
    ("qkv", 32, 1152, 896, "fp16"): LinearConfig(32, 64, 128, 7, 4, 3, "mma", swap=True, fast_cvt=True),  # 6.47 us, 348.1 GB/s
    ("qkv", 32, 1152, 896, "int8"): LinearConfig(32, 64, 128, 7, 4, 3, "mma", swap=True, fast_cvt=True),  # 6.13 us, 199.8 GB/s
}
# fmt: on

# Prefill (M > 32, the "dot" configs): (site, prefill bucket of M, N, K, weight dtype) -> config,
# from lab/gpu/sweep_prefill.py on the H200 (bench/results/gpu_prefill_sweep_20261202T1556Z.json:
# Qwen2.5-0.5B x32 time to first token 21.5 -> 17.6 ms, tokens/s 24.6k -> 25.2k with these
# entries); a shape not here takes pick_dot's 64x64x64 tiles.
PREFILL_BUCKETS = (512, 4096)
# fmt: off
PREFILL_TABLE: dict[tuple[str, int, int, int, str], LinearConfig] = {
    ('qkv', 512, 1152, 896, 'int8'): LinearConfig(64, 128, 64, 1, 4, 3),  # qwen2.5-0.5b 24.8 us (64x64x64: 28.5)
    ('qkv', 4096, 1152, 896, 'int8'): LinearConfig(128, 128, 64, 1, 8, 3),  # qwen2.5-0.5b 80.9 us (64x64x64: 97.6)
    ('o', 512, 896, 896, 'int8'): LinearConfig(64, 64, 128, 1, 4, 3),  # qwen2.5-0.5b 9.3 us (64x64x64: 10.1)
    ('o', 4096, 896, 896, 'int8'): LinearConfig(128, 64, 64, 1, 4, 3),  # qwen2.5-0.5b 31.3 us (64x64x64: 32.8)
    ('gu', 512, 4864, 896, 'int8'): LinearConfig(64, 128, 64, 1, 4, 3),  # qwen2.5-0.5b 76.8 us (64x64x64: 78.1)
    ('gu', 4096, 4864, 896, 'int8'): LinearConfig(128, 128, 64, 1, 8, 3),  # qwen2.5-0.5b 397.9 us (64x64x64: 505.8)
    ('down', 512, 896, 4864, 'int8'): LinearConfig(64, 64, 128, 1, 4, 3),  # qwen2.5-0.5b 34.8 us (64x64x64: 39.8)
    ('down', 4096, 896, 4864, 'int8'): LinearConfig(128, 128, 64, 1, 4, 3),  # qwen2.5-0.5b 108.0 us (64x64x64: 142.7)
}
# fmt: on


def prefill_bucket(M: int) -> int:
    return next((b for b in PREFILL_BUCKETS if b >= M), PREFILL_BUCKETS[-1])


def cdiv(a: int, b: int) -> int:
    return -(-int(a) // int(b))


def bucket(M: int) -> int:
    return next((b for b in DECODE_BUCKETS if b >= M), M)


def _np2(n: int) -> int:
    return 1 << (int(n) - 1).bit_length()


def _bk(K: int, target: int) -> int:
    """The K tile: the largest power of two <= target (>= 64) dividing K, else target (masked tail)."""
    b = target
    while b > 64 and K % b:
        b //= 2
    return b if K % b == 0 else min(target, max(16, _np2(K)))


def split_for(tiles: int, K: int, bk: int, sms: int, per_sm: int = 2, cap: int = 16) -> int:
    """K slices so that tiles x slices reaches ~per_sm programs per SM (1 when tiles alone do)."""
    return max(1, min(cdiv(K, bk), cdiv(per_sm * sms, tiles), cap))


def decode_rule(M: int, N: int, K: int, sms: int, wbytes: int = 1, swiglu: bool = False):
    """The config of a decode shape the table lacks (a guess before a sweep: ~16 KB of W per
    program per K step, ~2 programs per SM)."""
    if M <= 4:
        bm = _np2(M)
        bn = 64
        bk = _bk(K, 512 // wbytes if wbytes <= 2 else 128)
        split = split_for(cdiv(M, bm) * cdiv(N, bn), K, bk, sms)
        return LinearConfig(bm, bn, bk, split, 4, 1, "gemv")
    bm = 16 if M <= 16 else 32
    bn = 64
    bk = _bk(K, 256 // min(wbytes, 2))
    per = bm * bk * 4 + bn * bk * wbytes * (2 if swiglu else 1)
    stages = int(max(2, min(4, SMEM_BUDGET // per)))
    split = split_for(cdiv(M, bm) * cdiv(N, bn), K, bk, sms)
    return LinearConfig(bm, bn, bk, split, 4, stages, "mma")


def pick_dot(
    M: int, N: int, K: int, sms: int, wbytes: int = 1, swiglu: bool = False
) -> LinearConfig:
    """The original pick of "dot" configs (the only kind before the GEMV kernel): decode
    (M <= 32) gets narrow N tiles and split-K until the grid covers ~2 programs per SM; prefill
    gets 64x64 tiles. The pipeline depth is what fits the shared-memory budget (x is staged as
    fp32 at the RMS sites; wbytes: weight element size)."""
    nw = 2 if swiglu else 1
    if M <= 32:
        bm, bn = (16 if M <= 16 else 32), 32
        bk = 256 if K >= 256 else 64
        while bk > 64 and 2 * (bm * bk * 4 + bk * bn * wbytes * nw) > SMEM_BUDGET:
            bk //= 2
        stages = int(max(2, min(4, SMEM_BUDGET // (bm * bk * 4 + bk * bn * wbytes * nw))))
        tiles = cdiv(M, bm) * cdiv(N, bn)
        kblocks = cdiv(K, bk)
        split = max(1, min(kblocks, cdiv(2 * sms, tiles), 16))
        return LinearConfig(bm, bn, bk, split, 4, stages)
    per = 64 * 64 * 4 + 64 * 64 * wbytes * nw
    return LinearConfig(64, 64, 64, 1, 4, int(max(2, min(3, SMEM_BUDGET // per))))


def pick_interpret(M: int, N: int, K: int) -> LinearConfig:
    """The interpreter runs programs one by one: few, big programs (the same kernels as the GPU)."""
    bn = 32 if N <= 32 else 64
    if M <= 4:
        return LinearConfig(_np2(M), bn, 64 if K >= 64 else 32, 1, 4, 1, "gemv")
    bm = 16 if M <= 16 else 32 if M <= 32 else 64
    return LinearConfig(bm, bn, 64 if K >= 64 else 32, 1, 4, 1, "mma" if M <= 32 else "dot")


def pick_config(
    M: int,
    N: int,
    K: int,
    sms: int,
    interpret: bool = False,
    wbytes: int = 1,
    swiglu: bool = False,
    site: str | None = None,
) -> LinearConfig:
    """The config of one call site: for M <= 32 the table's entry for (site, bucket(M), N, K,
    dtype), else decode_rule; for prefill PREFILL_TABLE's entry, else pick_dot's tiles."""
    if interpret:
        return pick_interpret(M, N, K)
    if M <= DECODE_BUCKETS[-1] and NEW_DECODE:
        hit = DECODE_TABLE.get((site, bucket(M), N, K, WDT.get(wbytes, "?")))
        if hit is not None:
            return hit
        return decode_rule(M, N, K, sms, wbytes, swiglu)
    hit = PREFILL_TABLE.get((site, prefill_bucket(M), N, K, WDT.get(wbytes, "?")))
    return hit if hit is not None else pick_dot(M, N, K, sms, wbytes, swiglu)


def workspace_floats(M: int, N: int, cfg: LinearConfig, swiglu: bool = False) -> int:
    if cfg.split_k == 1:
        return 0
    tiles = cdiv(M, cfg.block_m) * cdiv(N, cfg.block_n)
    return tiles * cfg.split_k * (cfg.block_m * cfg.block_n * (2 if swiglu else 1) + cfg.block_m)


def counters(M: int, N: int, cfg: LinearConfig) -> int:
    return cdiv(M, cfg.block_m) * cdiv(N, cfg.block_n)
