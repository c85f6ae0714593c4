"""7-bit weights (GemmI8Args::w_bits = 7, |w| <= 63): the AVX2 / AVX-512BW kernels' cheaper exact
K loop (u = a + 128 in [0, 255] x w in vpmaddubsw: pairs <= 2 * 255 * 63 = 32130 < 32767), on
every ISA this machine runs, forced. The integer sums must equal the exact products (and so
the 8-bit path's) at awkward M / N / K, on the adversarial rows that reach the pair bound; the
other ISAs take the flag and run their usual loop. A weight outside [-63, 63] in a 7-bit
linear is refused with a clear error; a model with mixed 7 / 8-bit linears gives the same
outputs as with every linear run as 8-bit, on every ISA, and matches the emulation."""

from __future__ import annotations

import zlib

import numpy as np
import pytest
from helpers import batch, make_model, small_spec, supported_isas

from zoi import _cpu
from zoi.backends.cpu import CpuBackend
from zoi.backends.reference import ReferenceBackend
from zoi.quant.gptq import QMAX_OF, choose_weight_bits, round_weight, weight_bits_option

ISAS = supported_isas()
# M 1..17 (every row-block remainder of the 5 x 2 / 8 x 3 / 4 x 3 kernels), N off the panel
# widths (16 / 24 / 48), K off the k-group (4) and the 32-byte vector
SHAPES = [(m, 49, 37) for m in range(1, 18)]
SHAPES += [
    (1, 17, 3),
    (2, 33, 37),
    (3, 47, 129),
    (5, 49, 31),
    (7, 97, 383),
    (9, 16, 33),
    (13, 25, 65),
    (16, 1, 1537),
    (17, 383, 129),
    (17, 129, 17),
    (6, 1537, 5),
    (129, 49, 383),
]


def _rng(*key):
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def _w7(N, K, rng):
    w = rng.integers(-63, 64, (N, K)).astype(np.int8)
    k = np.arange(K)
    pats = [np.full(K, 63), np.full(K, -63), np.where(k % 2 == 0, 63, -63)]
    for r, pat in zip(sorted({0, N // 2, N - 1}), pats, strict=False):
        w[r] = pat
    return w


def _exact(q, w, zp=None):
    acc = q.astype(np.float64) @ w.astype(np.float64).T
    if zp is not None:
        acc -= zp.astype(np.float64)[:, None] * w.astype(np.float64).sum(1)[None, :]
    return acc.astype(np.int64)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("M,N,K", SHAPES)
def test_gemm_w7_exact(isa, M, N, K):
    rng = _rng("w7", isa, M, N, K)
    w = _w7(N, K, rng)
    k = np.arange(K)
    # symmetric rows: 127, -127, alternating, then random
    q = rng.integers(-127, 128, (M, K)).astype(np.int16)
    for i, r in enumerate([np.full(K, 127), np.full(K, -127), np.where(k % 2 == 0, 127, -127)]):
        if i < M:
            q[i] = r
    # asymmetric rows 0..255 with zero points: all 0 (stored -128 on avx2 / avx512, u = 0), all
    # 255 (u = 255: the pair bound 2 * 255 * 63), alternating
    qa = rng.integers(0, 256, (M, K)).astype(np.int16)
    zp = rng.integers(0, 256, M).astype(np.int32)
    for i, (v, z) in enumerate([(255, 0), (0, 255), (128, 128)]):
        if i < M:
            qa[i], zp[i] = v, z
    for rows, z in ((q, None), (qa, zp)):
        want = _exact(rows, w, z)
        for nt in (1, 2):
            for bits in (7, 8):
                out = np.full((M, N), -(2**31), np.int32)  # poisoned
                _cpu.k_gemm_s32(rows, z, w, out, isa, nt, w_bits=bits)
                np.testing.assert_array_equal(
                    out, want, err_msg=f"{isa} w_bits={bits} nt={nt} asym={z is not None}"
                )
    if M >= 1 and K >= 1:  # the extremes were reached (the row of 255 against the row of 63)
        assert _exact(qa[:1], w[:1], zp[:1])[0, 0] == 255 * 63 * K


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("asym", [False, True])
@pytest.mark.parametrize("M,N,K", [(1, 17, 3), (7, 97, 383), (17, 49, 129), (64, 384, 384)])
def test_linear_w7_bitwise_equal_to_8bit_path(isa, asym, M, N, K):
    """The float linear (quantise, GEMM, epilogue with GELU, bias, residual): the 7-bit loop's
    output is bit for bit the 8-bit loop's on the same weights; NaN rows stay NaN."""
    rng = _rng("lin", isa, asym, M, N, K)
    x = rng.standard_normal((M, K)).astype(np.float32) * 3
    if M > 2:
        x[2, K // 2] = np.nan
    w = _w7(N, K, rng)
    ws = (rng.random(N) * 0.01 + 1e-3).astype(np.float32)
    b = rng.standard_normal(N).astype(np.float32)
    res = rng.standard_normal((M, N)).astype(np.float32)
    ys = {}
    for bits in (8, 7):
        y = np.full((M, N), -7.0e30, np.float32)  # poisoned
        _cpu.k_linear_i8(x, w, ws, b, "gelu", res, -1.0, y, isa, 2, asym, w_bits=bits)
        ys[bits] = y
    np.testing.assert_array_equal(ys[7], ys[8])
    finite = np.ones(M, bool)
    if M > 2:
        finite[2] = False
        assert np.isnan(ys[7][2]).all()
    assert np.isfinite(ys[7][finite]).all()
    assert (ys[7][finite] != -7.0e30).all()


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("bad", [64, -64, 127, -127])
def test_out_of_range_weight_refused(isa, bad):
    w = np.zeros((5, 9), np.int8)
    w[3, 7] = bad
    q = np.ones((2, 9), np.int16)
    with pytest.raises(ValueError, match=rf"weight {bad} at row 3, column 7 .*\[-63, 63\]"):
        _cpu.k_gemm_s32(q, None, w, np.zeros((2, 5), np.int32), isa, 1, w_bits=7)
    with pytest.raises(ValueError, match="weight bits must be 8 or 7"):
        _cpu.k_gemm_s32(q, None, w, np.zeros((2, 5), np.int32), isa, 1, w_bits=6)
    out = np.zeros((2, 5), np.int32)
    _cpu.k_gemm_s32(q, None, w, out, isa, 1, w_bits=8)  # an 8-bit linear takes it
    assert out[0, 3] == bad


def _mixed_model(seven=("l0.qkv", "l0.ffn1", "l1.o", "l1.ffn2"), max_tokens=128):
    """The small INT8 model with some linears re-rounded to 7 bits and marked so (the
    quantiser's record: LinearQuant.info["weight_bits"])."""
    fp = make_model(small_spec(), "fp32", max_tokens=max_tokens, max_batch=8)
    m = make_model(
        small_spec(), "int8", max_tokens=max_tokens, max_batch=8, default_scheme="dynamic"
    )
    for p in seven:
        m.weights[p + ".w_q"], m.weights[p + ".w_scale"] = round_weight(fp.weights[p + ".w"], 7)
        m.quant[p].info["weight_bits"] = 7
    return m


@pytest.mark.parametrize("isa", ISAS)
def test_mixed_7_8_bit_model_across_isas(isa):
    m = _mixed_model()
    assert max(int(np.abs(m.weights[p + ".w_q"].astype(int)).max()) for p in ("l0.qkv",)) <= 63
    ids, pos, cu = batch([5, 1, 17, 33, 2], m.spec.vocab_size, 0, m.spec.position_offset)
    want = ReferenceBackend(m).run(ids, pos, cu, True)
    got = CpuBackend(m, isa=isa).run(ids, pos, cu, True)
    assert np.isfinite(got).all()
    assert float(np.abs(got - want).max()) <= 1e-3  # test_backend's INT8 emulation tolerance
    # the flag off (the 8-bit loop on the same integers): the same outputs, bit for bit
    for q in m.quant.values():
        q.info.pop("weight_bits", None)
    got8 = CpuBackend(m, isa=isa).run(ids, pos, cu, True)
    np.testing.assert_array_equal(got, got8)
    # and against another ISA's run: within the cross-ISA tolerance
    if ISAS[0] != isa:
        other = CpuBackend(_mixed_model(), isa=ISAS[0]).run(ids, pos, cu, True)
        assert float(np.abs(got - other).max()) <= 1e-3


@pytest.mark.parametrize("isa", ISAS)
def test_mixed_model_out_of_range_refused_at_load(isa):
    m = _mixed_model()
    wq = m.weights["l1.o.w_q"].copy()
    wq[1, 2] = 64
    m.weights["l1.o.w_q"] = wq
    with pytest.raises(ValueError, match=r"weight 64 at row 1, column 2 of a linear marked 7-bit"):
        CpuBackend(m, isa=isa)


def test_weight_bits_option_and_choice():
    assert weight_bits_option(None) == 8 and weight_bits_option({}) == 8
    assert weight_bits_option({"weight_bits": "auto"}) == "auto"
    assert weight_bits_option({"weight_bits": "7"}) == 7
    with pytest.raises(ValueError, match="weight_bits must be 8, 7 or 'auto'"):
        weight_bits_option({"weight_bits": 6})
    s8, s7 = {"a": 30.0, "b": 30.0, "c": 25.0}, {"a": 29.5, "b": 27.0, "c": 24.2}
    assert choose_weight_bits("auto", s8, s7, ["a", "b", "c"], 1.0) == {"a": 7, "b": 8, "c": 7}
    assert choose_weight_bits(8, s8, s7, ["a"]) == {"a": 8}
    assert choose_weight_bits(7, s8, s7, ["a", "b"]) == {"a": 7, "b": 7}


def test_round_weight_7_bit_range():
    rng = _rng("round")
    w = rng.standard_normal((7, 33)).astype(np.float32)
    q, s = round_weight(w, 7)
    assert q.dtype == np.int8 and np.abs(q.astype(int)).max() == QMAX_OF[7] == 63
    np.testing.assert_allclose(s, np.abs(w).max(1) / 63, rtol=1e-6)
    assert np.abs(q * s[:, None] - w).max() <= s.max() / 2 * (1 + 1e-5)


@pytest.mark.parametrize("isa", ISAS)
def test_mixed_model_large_batch_fused_quant_path(isa):
    """From 256 rows the INT8 GEMM quantises its own output rows in row chunks (the fused
    path, per-thread scratch): the 7-bit loop there too gives the 8-bit loop's outputs."""
    m = _mixed_model(max_tokens=640)
    lengths = [60, 61, 62, 63, 64, 17, 2]  # 329 tokens
    ids, pos, cu = batch(lengths, m.spec.vocab_size, 1, m.spec.position_offset)
    got = CpuBackend(m, isa=isa, nthreads=2).run(ids, pos, cu, True)
    for q in m.quant.values():
        q.info.pop("weight_bits", None)
    got8 = CpuBackend(m, isa=isa, nthreads=2).run(ids, pos, cu, True)
    assert np.isfinite(got).all()
    np.testing.assert_array_equal(got, got8)
