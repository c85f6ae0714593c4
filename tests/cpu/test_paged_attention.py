"""The paged attention kernel of generation (csrc/kernels/attention_paged.cc) against numpy, on every
ISA this CPU runs: random caches and block tables, awkward shapes (odd head widths, one-token
blocks, grouped KV heads, splits over the context), outputs poisoned with NaN before each call."""

from __future__ import annotations

import numpy as np
import pytest
from tests.fixtures import supported_isas

_cpu = pytest.importorskip("zoi._cpu")
ISAS = supported_isas()


def _poison(*shape):
    return np.full(shape, np.nan, np.float32)


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
    _cpu.k_paged_attention(q, kc, vc, pos, row, tables, nh, splits, chunk, out, isa)
    ref = _attn_ref(q, kc, vc, pos, row, tables, nh)
    assert np.isfinite(out).all()
    assert np.abs(out - ref).max() < 2e-5


def test_bad_inputs_refused():
    q = np.zeros((2, 8), np.float32)
    kc = np.zeros((3, 1, 4, 8), np.float32)
    pos, row = np.zeros(2, np.int32), np.zeros(2, np.int32)
    tables = np.zeros((1, 3), np.int32)
    with pytest.raises(ValueError):  # heads x D != q's width
        _cpu.k_paged_attention(q, kc, kc, pos, row, tables, 2, 1, 1, np.zeros_like(q), "")
    with pytest.raises(ValueError):
        _cpu.k_paged_attention(q, kc, kc, pos, row, tables, 1, 1, 1, np.zeros_like(q), "sse9")
