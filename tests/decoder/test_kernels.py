"""Every decoder kernel (csrc/decoder/dkernels.cc) against numpy, on every ISA this CPU runs:
random inputs, awkward shapes, outputs poisoned with NaN before each call."""

from __future__ import annotations

import numpy as np
import pytest
from tests.fixtures import supported_isas

from zoi.decoder.cpu import pack_panels
from zoi.decoder.reference import rms_norm, silu
from zoi.numerics.primitives import dequantize_weight, quantize_weight

_cpu = pytest.importorskip("zoi._cpu")
ISAS = supported_isas()


def _poison(*shape):
    return np.full(shape, np.nan, np.float32)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("int8", [False, True])
@pytest.mark.parametrize(
    "M,N,K", [(1, 33, 7), (3, 64, 300), (7, 95, 513), (13, 1, 64), (100, 70, 40)]
)
def test_linear(isa, int8, M, N, K):
    rng = np.random.default_rng(M * 1000 + N + K)
    x = rng.standard_normal((M, K)).astype(np.float32)
    w = rng.standard_normal((N, K)).astype(np.float32)
    b = rng.standard_normal(N).astype(np.float32)
    res = rng.standard_normal((M, N)).astype(np.float32)
    for bias, r in ((None, None), (b, res)):
        y = _poison(M, N)
        if int8:
            q, s = quantize_weight(w)
            sp = np.zeros(-(-N // 32) * 32, np.float32)
            sp[:N] = s
            _cpu.k_dec_linear(
                x, pack_panels(q).view(np.uint8).reshape(-1), sp, bias, r, N, True, y, isa
            )
            wr = dequantize_weight(q, s)
        else:
            _cpu.k_dec_linear(
                x, pack_panels(w).view(np.uint8).reshape(-1), None, bias, r, N, False, y, isa
            )
            wr = w
        ref = x.astype(np.float64) @ wr.T.astype(np.float64)
        if bias is not None:
            ref = ref + b + res
        assert np.isfinite(y).all()
        assert np.abs(y - ref).max() < 1e-4 * np.sqrt(K) * max(1.0, np.abs(ref).max())


@pytest.mark.parametrize("isa", ISAS)
def test_linear_parts_partition(isa):
    """Any number of parts computes the same, bit for bit (threads never change results)."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((9, 300)).astype(np.float32)
    wp = pack_panels(rng.standard_normal((200, 300)).astype(np.float32)).view(np.uint8).reshape(-1)
    ys = []
    for parts in (1, 2, 3, 7, 50):
        y = _poison(9, 200)
        _cpu.k_dec_linear(x, wp, None, None, None, 200, False, y, isa, parts)
        ys.append(y)
    for y in ys[1:]:
        assert np.array_equal(y, ys[0])
    # a row's result does not depend on the other rows of the batch (batched == alone)
    y1 = _poison(1, 200)
    _cpu.k_dec_linear(x[4:5].copy(), wp, None, None, None, 200, False, y1, isa)
    assert np.array_equal(y1[0], ys[0][4])


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("H", [1, 20, 64, 577])
def test_rmsnorm(isa, H):
    rng = np.random.default_rng(H)
    x = (3 * rng.standard_normal((5, H))).astype(np.float32)
    w = rng.standard_normal(H).astype(np.float32)
    y = _poison(5, H)
    _cpu.k_dec_rmsnorm(x, w, 1e-5, y, isa)
    ref = rms_norm(x.astype(np.float64), w.astype(np.float64), 1e-5)
    assert np.abs(y - ref).max() < 1e-5 * max(1.0, np.abs(ref).max())


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("I", [1, 17, 600])
def test_silu_mul(isa, I):
    rng = np.random.default_rng(I)
    gu = (4 * rng.standard_normal((3, 2 * I))).astype(np.float32)
    y = _poison(3, I)
    _cpu.k_dec_silu_mul(gu, y, isa)
    g, u = gu[:, :I].astype(np.float64), gu[:, I:].astype(np.float64)
    ref = silu(g) * u
    assert np.abs(y - ref).max() < 1e-5 * max(1.0, np.abs(ref).max())


def _attn_ref(q, kc, vc, pos, row, tables, nh):
    T = len(pos)
    nkv, bs, D = kc.shape[1], kc.shape[2], kc.shape[3]
    G = nh // nkv
    out = np.zeros((T, nh * D))
    for t in range(T):
        L = pos[t] + 1
        p = np.arange(L)
        blk = tables[row[t]][p // bs]
        K = kc[blk, :, p % bs].astype(np.float64)  # [L, nkv, D]
        V = vc[blk, :, p % bs].astype(np.float64)
        for h in range(nh):
            qh = q[t, h * D : (h + 1) * D].astype(np.float64)
            s = K[:, h // G] @ qh / np.sqrt(D)
            s = np.exp(s - s.max())
            out[t, h * D : (h + 1) * D] = (s / s.sum()) @ V[:, h // G]
    return out


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize(
    "nh,nkv,D,bs,splits", [(4, 2, 16, 8, 1), (6, 2, 20, 5, 3), (3, 3, 64, 16, 4), (7, 1, 33, 1, 2)]
)
def test_paged_attention(isa, nh, nkv, D, bs, splits):
    rng = np.random.default_rng(nh * 100 + D)
    NB, mb = 60, 40
    kc = rng.standard_normal((NB, nkv, bs, D)).astype(np.float32)
    vc = rng.standard_normal((NB, nkv, bs, D)).astype(np.float32)
    tables = np.stack([rng.permutation(NB)[:mb] for _ in range(3)]).astype(np.int32)
    maxlen = min(mb * bs, 150)
    pos = np.array([0, 1, maxlen - 1, bs, 37 % maxlen, maxlen // 2], np.int32)
    row = np.array([0, 1, 2, 2, 1, 0], np.int32)
    q = (2 * rng.standard_normal((len(pos), nh * D))).astype(np.float32)
    out = _poison(len(pos), nh * D)
    chunk = -(-maxlen // splits)
    _cpu.k_dec_attention(q, kc, vc, pos, row, tables, nh, splits, chunk, out, isa)
    ref = _attn_ref(q, kc, vc, pos, row, tables, nh)
    assert np.isfinite(out).all()
    assert np.abs(out - ref).max() < 2e-5


def test_bad_inputs_refused():
    x = np.zeros((2, 8), np.float32)
    with pytest.raises(ValueError):
        _cpu.k_dec_linear(
            x, np.zeros(5, np.uint8), None, None, None, 4, False, np.zeros((2, 4), np.float32), ""
        )
    with pytest.raises(ValueError):
        _cpu.k_dec_rmsnorm(x, np.zeros(8, np.float32), 1e-5, np.zeros((2, 8), np.float32), "sse9")
