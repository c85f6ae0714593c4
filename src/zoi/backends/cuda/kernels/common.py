"""Triton helpers every kernel shares, written once: LayerNorm / RMSNorm of whole rows, the online
softmax step of flash attention, round-half-even, the activations, and the max reductions that
keep a NaN (the engine's rule: a NaN never passes; the engine refuses non-finite outputs).

NaN and the GPU: ``tl.maximum`` / ``tl.minimum`` (default ``PropagateNan.NONE``: PTX
``max.f32``) and the ``tl.max`` / ``tl.min`` reductions return the other operand when one is
NaN, so a NaN row can clamp / reduce to a finite value (the interpreter's reductions drop it too:
``np.nanmax``). Row statistics that decide a scale therefore use ``amax_rows`` (or
``colmax_nan``); a quantiser poisons the row's a_scale with the NaN (an int8 code cannot hold
one), so every output computed from the copy comes out NaN.

They are ``triton.jit`` functions (inlined into their callers at compile time), so using
them costs nothing at run time; the numerics are the ones the kernels had when each wrote
its own copy (the interpreter tests and the H200 tests compare every kernel against
zoi.numerics.reference).
"""

from __future__ import annotations

import triton
import triton.language as tl

ACTS = {"none": 0, "gelu": 1, "gelu_tanh": 2, "relu": 3, "sigmoid": 4, "silu": 5}


@triton.jit
def rint(s):
    """Round half to even for |s| < 2**22 (callers clamp first, which also keeps the add
    from contracting with a preceding multiply into an FMA)."""
    return (s + 12582912.0) - 12582912.0


@triton.jit
def amax_rows(x):
    """max |x| of each row of x [R, C] fp32, NaN when the row holds a NaN: an integer max of
    the bits of |x| (the sign bit cleared by an integer AND, whatever the NaN's sign;
    non-negative floats order as their bits, and every NaN lies above +inf), so no NaN is
    dropped the way tl.max drops it, and a NaN comes out positive (it wins a float atomic max).
    Masked entries must be 0 (callers' where)."""
    bits = x.to(tl.int32, bitcast=True) & 0x7FFFFFFF
    return tl.max(bits, axis=1).to(tl.float32, bitcast=True)


@triton.jit
def colmax_nan(acc):
    """Column max of acc [R, C] fp32 that keeps a NaN (tl.max may drop it); -inf stays -inf."""
    bad = tl.max((acc != acc).to(tl.int32), 0)
    m = tl.max(tl.where(acc != acc, float("-inf"), acc), 0)
    return tl.where(bad > 0, float("nan"), m)


@triton.jit
def activation(y, ACT: tl.constexpr):
    """ACT 0 none, 1 gelu (erf), 2 gelu (tanh form), 3 relu, 4 sigmoid, 5 silu (see ACTS)."""
    if ACT == 1:  # gelu, erf form (BERT)
        y = 0.5 * y * (1.0 + tl.erf(y * 0.7071067811865476))
    elif ACT == 2:  # gelu, tanh form; tanh via exp for the interpreter's sake
        u = 0.7978845608028654 * (y + 0.044715 * y * y * y)
        t = 1.0 - 2.0 / (tl.exp(2.0 * u) + 1.0)
        y = 0.5 * y * (1.0 + t)
    elif ACT == 3:
        y = tl.maximum(y, 0.0)
    elif ACT == 4:
        y = 1.0 / (1.0 + tl.exp(-y))
    elif ACT == 5:  # silu, x sigmoid(x) (SwiGLU's gate); exp(-y) = inf gives -0, not a NaN
        y = y / (1.0 + tl.exp(-y))
    return y


@triton.jit
def layernorm_rows(x, c_ok, lw, lb, N, eps):
    """LayerNorm of whole rows in fp32: x [R, C] (columns >= N masked by c_ok [C]), lw / lb
    [C] the gain and bias (already loaded: callers issue those loads where they hide best).
    Two-pass (mean, then the centred second moment); masked columns come out as lb (0)."""
    x = tl.where(c_ok[None, :], x, 0.0)
    mean = tl.sum(x, axis=1) / N
    d = tl.where(c_ok[None, :], x - mean[:, None], 0.0)
    var = tl.sum(d * d, axis=1) / N
    rstd = 1.0 / tl.sqrt(var + eps)
    return d * rstd[:, None] * lw[None, :] + lb[None, :]


@triton.jit
def norm_rows(x, c_ok, lw, lb, N, eps, RMS: tl.constexpr):
    """The norm of whole rows, fp32: LayerNorm (``layernorm_rows``) or, RMS, the RMSNorm of
    the decoder architectures, x / sqrt(mean(x^2) + eps) * lw + lb (no centring)."""
    if RMS:
        x = tl.where(c_ok[None, :], x, 0.0)
        rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / N + eps)
        return x * rstd[:, None] * lw[None, :] + lb[None, :]
    else:
        return layernorm_rows(x, c_ok, lw, lb, N, eps)


@triton.jit
def softmax_step(m_i, l_i, acc, s, v):
    """One key block of the online softmax (flash attention, base 2): s [M, N] fp32 scores
    already scaled by log2(e) / sqrt(d) and -inf where masked, v [N, D]; returns the new
    (row max, row sum, accumulator). A row that has seen no valid key yet keeps max -inf
    and contributes nothing (its exp2 terms are taken against 0)."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_use)
    p = tl.exp2(s - m_use[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return m_new, l_i, acc


@triton.jit
def softmax_step2(m_i, l_i, acc1, acc2, s, v1, v2):
    """softmax_step with v in two column halves (RoPE attention loads each head as its two
    halves): the same row statistics, one accumulator per half."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_use)
    p = tl.exp2(s - m_use[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    p16 = p.to(v1.dtype)
    acc1 = acc1 * alpha[:, None] + tl.dot(p16, v1)
    acc2 = acc2 * alpha[:, None] + tl.dot(p16, v2)
    return m_new, l_i, acc1, acc2
