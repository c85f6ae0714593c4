"""FP8 (E4M3) numerics: the contract every FP8 kernel reproduces (docs/QUANT.md, "FP8").

E4M3 as NVIDIA's ``float8e4nv`` / torch's ``float8_e4m3fn``: 1 sign, 4 exponent (bias 7),
3 mantissa bits; normals 2**-6 .. 448 (= 1.75 * 2**8), subnormals k * 2**-9 (k = 1..7),
no infinities (the all-ones code is NaN; never produced here).

Quantisation of rows (weights per output channel, activations per token), all float32:

    amax = max_k |x[r, k]|
    inv  = 448 / amax          (IEEE division; 0 when amax == 0)
    v    = clip(x * inv, -448, 448)
    q    = e4m3_round(v)       (round to nearest even on the E4M3 grid; |v| <= 448 saturates)
    scale = amax / 448         (weights: 1 when amax == 0; activations: 0)

``e4m3_round`` is exact arithmetic: for |v| >= 2**-6 the grid step is 2**(e - 3) with
e = floor(log2 |v|), below it 2**-9; ``q = rint(v / step) * step`` (both products by a power
of two are exact in float32, rint is round-half-even). A kernel does the same on fp32 and
then converts the (exactly representable) value to float8e4nv, which is exact on the GPU
and in the Triton interpreter (whose own float->fp8 rounding is not round-to-nearest-even).

The linear (``linear_fp8_emulated``): ``acc[t, n] = sum_k q_a[t, k] q_w[n, k]`` (products of
two E4M3 values are exact in float32; the sum here is float64 rounded once to float32, the
ideal of a kernel's float32 accumulation, which differs from it by float32 rounding only),
``y = acc * (a_scale[t] * w_scale[n]) + b[n]`` in float32, as the INT8 epilogue.
"""

from __future__ import annotations

import numpy as np

FP8_MAX = 448.0
MIN_NORMAL_EXP = -6  # 2**-6, the smallest normal E4M3 value
MANT_BITS = 3


def e4m3_round(v: np.ndarray) -> np.ndarray:
    """Round float32 values with |v| <= 448 to the nearest E4M3 value (ties to even),
    returned as float32. Larger magnitudes are clipped to +-448 first (saturation)."""
    v = np.clip(np.asarray(v, np.float32), -FP8_MAX, FP8_MAX).astype(np.float32)
    bits = v.view(np.int32)
    e = ((bits >> 23) & 0xFF).astype(np.int32) - 127  # floor(log2|v|) for normal float32
    e = np.maximum(e, MIN_NORMAL_EXP) - MANT_BITS  # the grid step's exponent, >= -9
    step = ((e + 127).astype(np.int32) << 23).view(np.float32)
    inv_step = ((127 - e).astype(np.int32) << 23).view(np.float32)
    q = (np.rint(v * inv_step) * step).astype(np.float32)
    return q


def quantize_rows_fp8(x: np.ndarray, zero_scale: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Per-row E4M3: x float [R, K] -> (q float32 [R, K] with E4M3 values, scale float32 [R]).
    A row of zeros quantises to 0 with scale `zero_scale` (activations 0, weights 1)."""
    x = np.asarray(x, np.float32)
    am = np.abs(x).max(axis=1) if x.shape[1] else np.zeros(x.shape[0], np.float32)
    am = am.astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(am > 0, np.float32(FP8_MAX) / np.where(am > 0, am, 1), 0)
    inv = inv.astype(np.float32)
    q = e4m3_round((x * inv[:, None]).astype(np.float32))
    scale = np.where(am > 0, am / np.float32(FP8_MAX), np.float32(zero_scale)).astype(np.float32)
    return q, scale


def quantize_weight_fp8(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-output-channel E4M3 weights: w [N, K] -> (q float32 E4M3 values, w_scale [N])."""
    return quantize_rows_fp8(w, zero_scale=1.0)


def quantize_act_fp8(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-token E4M3 activations: x [T, K] -> (q float32 E4M3 values, a_scale [T])."""
    return quantize_rows_fp8(x, zero_scale=0.0)


def fp8_matmul(qa: np.ndarray, qw: np.ndarray) -> np.ndarray:
    """sum_k qa[t, k] qw[n, k] in float64 (every product exact), rounded once to float32."""
    return (qa.astype(np.float64) @ qw.astype(np.float64).T).astype(np.float32)


def linear_fp8_emulated(
    x: np.ndarray, w_q: np.ndarray, w_scale: np.ndarray, b: np.ndarray | None
) -> np.ndarray:
    """The FP8 linear (before activation / residual): x float32 [T, K], w_q E4M3 values [N, K]."""
    qa, a_scale = quantize_act_fp8(x)
    y = fp8_matmul(qa, w_q) * (a_scale[:, None] * np.asarray(w_scale, np.float32)[None, :])
    if b is not None:
        y = y + np.asarray(b, np.float32)[None, :]
    return y.astype(np.float32)


def e4m3_encode(q: np.ndarray) -> np.ndarray:
    """E4M3 values (float32, exactly representable, |q| <= 448) -> their uint8 codes."""
    q = np.asarray(q, np.float32)
    sign = (q.view(np.uint32) >> 31).astype(np.uint8) << 7
    a = np.abs(q).astype(np.float64)
    bits = a.astype(np.float32).view(np.int32)
    e = ((bits >> 23) & 0xFF).astype(np.int32) - 127
    normal = a >= 2.0**MIN_NORMAL_EXP
    mant_n = np.where(normal, a / np.exp2(np.where(normal, e, 0)) * 8 - 8, 0)
    code_n = ((e + 7) << 3) + mant_n.astype(np.int32)
    code_s = (a / 2.0**-9).astype(np.int32)  # subnormal: k * 2**-9, k = 0..7
    code = np.where(normal, code_n, code_s).astype(np.uint8)
    if not np.array_equal(e4m3_decode(code), a.astype(np.float32)):
        raise ValueError("e4m3_encode: values are not on the E4M3 grid (use e4m3_round first)")
    return code | sign


def e4m3_decode(code: np.ndarray) -> np.ndarray:
    """uint8 E4M3 codes -> float32 values (0x7F / 0xFF, NaN in E4M3, decode as NaN)."""
    c = np.asarray(code, np.uint8).astype(np.int32)
    s = np.where(c & 0x80, -1.0, 1.0)
    e = (c >> 3) & 0xF
    m = c & 0x7
    v = np.where(e == 0, m * 2.0**-9, (1 + m / 8.0) * np.exp2(e - 7))
    v = np.where((c & 0x7F) == 0x7F, np.nan, v)
    return (s * v).astype(np.float32)
