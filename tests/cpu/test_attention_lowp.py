"""The opt-in low-precision attention (AttnArgs::prec): prec = 1 is q.k^T in INT8 (q, k
quantised per token and head) with softmax and p.v in FP32, prec = 2 also p.v in INT8 (p as u8
of the row max, v per channel) (csrc/kernels/attention_i8.h, the VNNI builds: vnni, amx);
prec = 3 is q.k^T and p.v in BF16 on AMX tiles (attention_amx.h; CPUs with AMX-BF16, head dim
32 / 64, from the amx table only: ZOI_CPU_ISA=vnni runs FP32 for it, as the AMX-INT8 GEMM does
not run there either). Everywhere else (other ISAs, head dims that do not fit) the FP32 kernel
runs, checked bit for bit.

Against a numpy emulation of the same quantisation (codes computed in float32 exactly as the
kernel does, the rest in float64) and against the exact float64 attention, on fresh random
inputs: lengths 1, 7, 17, 129, 513 and ragged batches, head dims 32 / 64, 1 / 2 / 5 threads,
outputs poisoned, NaN in q / k / v."""

from __future__ import annotations

import math

import numpy as np
import pytest
from helpers import batch, make_model, small_spec, supported_isas

from zoi import _cpu
from zoi.numerics import reference as ref

ISAS = supported_isas()
I8_ISAS = ("vnni", "amx")  # the builds with the INT8 kernel
BF16_ISAS = ("amx",)  # the table whose attention runs the AMX-BF16 kernel


def _amx_bf16() -> bool:
    try:
        flags = open("/proc/cpuinfo").read().split("flags")[1].split("\n")[0].split()
    except (OSError, IndexError):
        return False
    return "amx" in ISAS and "amx_bf16" in flags and "avx512_bf16" in flags


AMX_BF16 = _amx_bf16()


def _active(isa: str, prec: int, d: int = 32) -> bool:
    """Whether the low-precision path of `prec` runs (else the FP32 kernel)."""
    if prec in (1, 2):
        return isa in I8_ISAS and d % 4 == 0
    return isa in BF16_ISAS and AMX_BF16 and d in (32, 64)


LENGTHS = [[1], [7], [17], [129], [513], [1, 129, 7, 17], "ragged"]
SHAPES = [(12, 32), (2, 64)]


def _lengths(spec, rng):
    if spec == "ragged":
        return [int(x) for x in rng.integers(1, 81, size=19)]
    return list(spec)


def _inputs(rng, lengths, heads, d, sd=1.5):
    T, H = sum(lengths), heads * d
    qkv = (rng.standard_normal((T, 3 * H)) * sd).astype(np.float32)
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    return qkv, cu


def _run(qkv, cu, heads, d, scale, isa, nt, prec):
    out = np.full((qkv.shape[0], heads * d), np.nan, np.float32)  # poisoned
    _cpu.k_attention(qkv, cu, heads, d, scale, out, isa, nt, prec)
    return out


def _bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> bf16 (round to nearest even), as float64"""
    b = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
    r = ((b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)
    return r.view(np.float32).astype(np.float64)


def _codes(x: np.ndarray, axis: int):
    """Symmetric INT8 codes and scales as the kernel computes them (float32: inv = 127 / amax,
    rint(x * inv) half to even, scale = amax / 127)."""
    amax = np.abs(x).max(axis=axis, keepdims=True).astype(np.float32)
    inv = np.where(amax > 0, np.float32(127) / np.where(amax > 0, amax, 1), 0).astype(np.float32)
    q = np.rint(x * inv).astype(np.float32)
    return q, (amax / np.float32(127)).astype(np.float32)


def _emulate(qkv, cu, heads, d, scale, prec):
    H = heads * d
    out = np.empty((qkv.shape[0], H), np.float64)
    for s in range(len(cu) - 1):
        a, e = int(cu[s]), int(cu[s + 1])
        q = qkv[a:e, :H].reshape(e - a, heads, d).transpose(1, 0, 2)
        k = qkv[a:e, H : 2 * H].reshape(e - a, heads, d).transpose(1, 0, 2)
        v = qkv[a:e, 2 * H :].reshape(e - a, heads, d).transpose(1, 0, 2)
        if prec == 3:  # bf16 q, k, v; FP32 exps rounded to bf16 for p.v, normalised by their sum
            sc = _bf16(q) @ _bf16(k).transpose(0, 2, 1)
            ex = np.exp(scale * (sc - sc.max(axis=2, keepdims=True)))
            ctx = (_bf16(ex.astype(np.float32)) @ _bf16(v)) / ex.sum(axis=2, keepdims=True)
            out[a:e] = ctx.transpose(1, 0, 2).reshape(e - a, H)
            continue
        q8, sq = _codes(q, 2)
        k8, sk = _codes(k, 2)
        sqs = (sq * np.float32(scale)).astype(np.float32)
        acc = (q8.astype(np.float64) @ k8.astype(np.float64).transpose(0, 2, 1)).astype(np.float32)
        sc = (acc * sk.transpose(0, 2, 1)).astype(np.float32) * sqs  # float32, the kernel's order
        ex = np.exp(sc.astype(np.float64) - sc.max(axis=2, keepdims=True))
        if prec == 1:
            ctx = (ex @ v.astype(np.float64)) / ex.sum(axis=2, keepdims=True)
        else:
            p8 = np.rint(255 * ex)
            v8, sv = _codes(v, 1)  # per channel: amax over the sequence
            ctx = (p8 @ v8.astype(np.float64)) * sv / p8.sum(axis=2, keepdims=True)
        out[a:e] = ctx.transpose(1, 0, 2).reshape(e - a, H)
    return out


def _check_lowp(out, qkv, cu, heads, d, scale, prec):
    assert np.isfinite(out).all(), "output not fully written (or NaN)"
    emu = _emulate(qkv, cu, heads, d, scale, prec)
    vmax = float(np.abs(qkv[:, 2 * heads * d :]).max())
    err = np.abs(out - emu)
    if prec == 1:
        # same codes and float32 scores; exp / sums in float32: ~1e-6 relative to max |v|
        assert err.max() <= 1e-5 * vmax, err.max()
    elif prec == 3:
        # an exp within a few ulp of the emulation's may round to the other bf16 (2^-8 of it)
        assert err.max() <= 4e-3 * vmax, err.max()
        assert np.mean(err) <= 5e-5 * vmax, np.mean(err)
    else:
        # a p8 code may round the other way (the kernel's exp2 fit is within 2 ulp of exp):
        # one code changes ctx by <= 127 sv / sum p8 <= max|v| / 255 (sum p8 >= 255); rarely
        assert err.max() <= 2 * vmax / 255, err.max()
        assert np.mean(err) <= 2e-5 * vmax, np.mean(err)
    exact = ref.attention(qkv.astype(np.float64), cu, heads, d, scale)
    return float(np.abs(out - exact).max()) / vmax


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("prec", [1, 2, 3])
@pytest.mark.parametrize("heads,d", SHAPES)
@pytest.mark.parametrize(
    "spec", LENGTHS, ids=lambda s: s if isinstance(s, str) else "-".join(map(str, s))
)
def test_lowp_attention_vs_emulation(isa, prec, heads, d, spec):
    rng = np.random.default_rng([heads, d, len(str(spec)), prec, 11])
    lengths = _lengths(spec, rng)
    qkv, cu = _inputs(rng, lengths, heads, d)
    scale = 1 / math.sqrt(d)
    fp32 = _run(qkv, cu, heads, d, scale, isa, 1, 0)
    for nt in (1, 2, 5):
        out = _run(qkv, cu, heads, d, scale, isa, nt, prec)
        if not _active(isa, prec, d):  # the FP32 kernel runs
            np.testing.assert_array_equal(out, fp32)
            continue
        rel = _check_lowp(out, qkv, cu, heads, d, scale, prec)
        # the accuracy it buys: 1.5-sigma inputs, scores of order 1-10; against exact attention
        # (prec 2: probabilities under 1/510 of the row max vanish, more of them in long rows)
        assert rel <= {1: 0.03, 2: 0.08, 3: 0.02}[prec], rel
        if max(lengths) > 1:
            assert not np.array_equal(out, fp32), "low precision requested but the FP32 kernel ran"


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("d", [7, 30, 48])
def test_head_dims_that_do_not_fit_run_fp32(isa, d):
    """INT8: head dims that are not a multiple of 4; AMX-BF16: other than 32 / 64."""
    rng = np.random.default_rng(d)
    qkv, cu = _inputs(rng, [17, 5], 3, d)
    fp32 = _run(qkv, cu, 3, d, 0.3, isa, 2, 0)
    for prec in (1, 2, 3):
        out = _run(qkv, cu, 3, d, 0.3, isa, 2, prec)
        if _active(isa, prec, d):
            _check_lowp(out, qkv, cu, 3, d, 0.3, prec)
        else:
            np.testing.assert_array_equal(out, fp32)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("prec", [1, 2, 3])
def test_lowp_attention_peaked_flat_and_zero_rows(isa, prec):
    """Near one-hot rows (scores of order 100), q = 0 (every score 0: ctx = mean of v, exact
    up to the v codes), and an all-zero k / v head (scales 0: no division by zero)."""
    rng = np.random.default_rng(4)
    heads, d, lengths = 2, 32, [129, 40, 1]
    qkv, cu = _inputs(rng, lengths, heads, d, sd=6.0)
    H = heads * d
    out = _run(qkv, cu, heads, d, 1.0, isa, 2, prec)
    if _active(isa, prec):
        _check_lowp(out, qkv, cu, heads, d, 1.0, prec)
    flat = qkv.copy()
    flat[:, :H] = 0.0
    out = _run(flat, cu, heads, d, 0.125, isa, 1, prec)
    for s in range(len(lengths)):
        a, e = cu[s], cu[s + 1]
        mean = flat[a:e, 2 * H :].astype(np.float64).mean(axis=0)
        vmax = float(np.abs(flat[a:e, 2 * H :]).max())
        # INT8 v: half a code step (amax / 254); BF16 v: 2^-9 relative
        tol = {2: vmax / 254, 3: vmax / 256}.get(prec, 2e-6) if _active(isa, prec) else 2e-6
        np.testing.assert_allclose(out[a:e], np.broadcast_to(mean, (e - a, H)), rtol=0, atol=tol)
    zero = qkv.copy()
    zero[:, H:] = 0.0  # k and v all zero: ctx = 0
    out = _run(zero, cu, heads, d, 0.125, isa, 1, prec)
    np.testing.assert_array_equal(out, 0.0)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("prec", [1, 2, 3])
@pytest.mark.parametrize("where", ["q", "k", "v"])
def test_lowp_attention_nan_propagates(isa, prec, where):
    """A NaN in one token's q, k or v reaches the outputs it reaches in the FP32 kernel (its row;
    the head; its channel of the head), never turning into a finite value there; the other
    sequences are unchanged."""
    rng = np.random.default_rng(6)
    heads, d, lengths = 3, 32, [17, 33, 5]
    qkv, cu = _inputs(rng, lengths, heads, d, sd=1.0)
    T, H = qkv.shape[0], heads * d
    clean_out = _run(qkv, cu, heads, d, 1 / math.sqrt(d), isa, 2, prec)
    col = {"q": 0, "k": H, "v": 2 * H}[where] + d + 3
    qkv[17 + 10, col] = np.nan
    out = _run(qkv, cu, heads, d, 1 / math.sqrt(d), isa, 2, prec)
    head1 = out[17:50, d : 2 * d]
    if where == "q":
        assert np.isnan(head1[10]).all()
    elif where == "k":
        assert np.isnan(head1).all()
    else:
        assert np.isnan(head1[:, 3]).all()
    clean = np.delete(np.arange(T), np.arange(17, 50))
    np.testing.assert_array_equal(out[clean], clean_out[clean])
    assert np.isfinite(out[17:50, :d]).all() and np.isfinite(out[17:50, 2 * d :]).all()


@pytest.mark.parametrize("isa", ISAS)
def test_engine_attention_precision_opt_in(isa):
    """Engine.set_attention_precision: off by default, 1 / 2 / 3 change the outputs where the path
    runs (by little: cosine >= 0.999 on a small random INT8 model), anything else refused."""
    from zoi.backends.cpu import CpuBackend

    spec = small_spec(hidden=64, heads=2)  # head dim 32
    model = make_model(spec, "int8", max_tokens=128)
    be = CpuBackend(model, isa=isa, nthreads=2)
    ids, pos, cu = batch([40, 9, 33], spec.vocab_size, 2)
    base = be.run(ids, pos, cu, False).copy()
    for mode in (1, 2, 3):
        be.engine.set_attention_precision(mode)
        got = be.run(ids, pos, cu, False).copy()
        if _active(isa, mode):
            assert not np.array_equal(got, base)
            cos = (got * base).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(base, axis=1)
            assert cos.min() >= 0.999, cos
        else:
            np.testing.assert_array_equal(got, base)
    be.engine.set_attention_precision(0)
    np.testing.assert_array_equal(be.run(ids, pos, cu, False), base)
    with pytest.raises(ValueError, match="0, 1, 2 or 3"):
        be.engine.set_attention_precision(4)


@pytest.mark.parametrize("isa", ISAS)
def test_attention_precision_follows_the_forced_isa(isa, monkeypatch):
    """An engine of the ISA ZOI_CPU_ISA forces (read at the API's edge, handed to the backend)
    runs a mode only where
    that ISA has its kernel: INT8 (1, 2) on vnni / amx, AMX-BF16 (3) on amx (not on vnni, even on
    a CPU with AMX-BF16: the CPU's features are not the ISA's); elsewhere the FP32 kernel, bit for
    bit. The kernel entry of that ISA (k_attention) agrees with the engine."""
    from zoi.backends.cpu import CpuBackend
    from zoi.backends.cpu.options import CpuOptions

    monkeypatch.setenv("ZOI_CPU_ISA", isa)
    spec = small_spec(hidden=64, heads=2)  # head dim 32
    model = make_model(spec, "int8", max_tokens=128)
    be = CpuBackend(model, nthreads=2, options=CpuOptions.from_env())
    assert be.isa == isa
    ids, pos, cu = batch([40, 9, 33], spec.vocab_size, 3)
    base = be.run(ids, pos, cu, False).copy()
    rng = np.random.default_rng(9)
    qkv, kcu = _inputs(rng, [33, 8], 2, 32)
    k_fp32 = _run(qkv, kcu, 2, 32, 0.2, isa, 2, 0)
    for mode in (1, 2, 3):
        be.engine.set_attention_precision(mode)
        got = be.run(ids, pos, cu, False)
        k_out = _run(qkv, kcu, 2, 32, 0.2, isa, 2, mode)
        if _active(isa, mode):
            assert not np.array_equal(got, base), (isa, mode)
            assert not np.array_equal(k_out, k_fp32), (isa, mode)
        else:
            np.testing.assert_array_equal(got, base)
            np.testing.assert_array_equal(k_out, k_fp32)
    assert _active("amx", 3) == AMX_BF16 and not _active("vnni", 3)
