"""Variable-length multi-head attention, per backend (tests/ops/helpers.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from tests.ops.helpers import (
    DEV,
    ISAS,
    _rand,
    cuda,
    f16,
    k_attn,
    nanlike,
    poison,
    rel,
    t,
    torch,
)

from zoi import _cpu
from zoi.numerics import reference as ref


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("heads,d", [(5, 12), (2, 64), (12, 32), (3, 7), (1, 1)])
@pytest.mark.parametrize("lengths", [[1], [5, 1, 17, 33], [130]])
def test_attention(isa, heads, d, lengths, rng):
    T, H = sum(lengths), heads * d
    qkv = (rng.standard_normal((T, 3 * H)) * 1.5).astype(np.float32)
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    out = nanlike((T, H))
    scale = 1 / math.sqrt(d)
    _cpu.k_attention(qkv, cu, heads, d, scale, out, isa, 3)
    want = ref.attention(qkv.astype(np.float64), cu, heads, d, scale)
    naive = ref.attention(qkv, cu, heads, d, scale)  # the float32 reference (numpy + BLAS)
    assert np.isfinite(out).all()
    # The kernel sums in numpy/BLAS's order where BLAS uses one FMA chain per output (then it is
    # bit-identical to `naive`), one chain elsewhere; a single chain over up to 130 keys has up
    # to ~3x the error of BLAS's blocked sums against float64.
    assert np.abs(out - want).max() <= 4 * np.abs(naive - want).max() + 1e-6


@cuda
@pytest.mark.parametrize("lens", [[1], [5, 1, 17], [70, 3], [2] * 21])
@pytest.mark.parametrize("head_dim,heads", [(8, 3), (24, 2)])
def test_attention_varlen(lens, head_dim, heads):
    rng = np.random.default_rng(sum(lens) + head_dim)
    T, H, B = sum(lens), heads * head_dim, len(lens)
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    hdr = np.array([0, B, T, 0], np.int32)
    T_bucket = T + 3  # rows past T are not part of any sequence
    qkv = np.zeros((T_bucket, 3 * H), np.float32)
    qkv[:T] = _rand(rng, T, 3 * H, scale=1.5)
    o = poison((T_bucket, H), torch.float16)
    amax = torch.zeros(T_bucket, dtype=torch.float32, device=DEV)
    scale = 1.0 / math.sqrt(head_dim)
    cfg = k_attn.pick_config(T_bucket, head_dim)
    n_seq = B + 5
    tcum = torch.full((n_seq,), -1, dtype=torch.int32, device=DEV)
    if len(lens) > 4:  # exercise the chunked scans (BLOCK_B smaller than B)
        k_attn.attention_tiles_kernel[(1,)](t(hdr), t(cu), tcum, BLOCK_M=cfg["BLOCK_M"], BLOCK_B=16)
    else:
        k_attn.launch_tiles(t(hdr), t(cu), tcum, n_seq, cfg)
    want_t = np.cumsum([(n + cfg["BLOCK_M"] - 1) // cfg["BLOCK_M"] for n in lens])
    np.testing.assert_array_equal(tcum.cpu().numpy()[:B], want_t)
    k_attn.launch_attention(
        t(qkv, torch.float16),
        t(hdr),
        t(cu),
        tcum,
        o,
        amax,
        T_bucket,
        n_seq,
        heads,
        head_dim,
        scale,
        cfg=cfg,
    )
    want = ref.attention(f16(qkv[:T]), cu, heads, head_dim, scale)
    got = o.float().cpu().numpy()
    assert rel(got[:T], want) < 3e-3
    assert np.isnan(got[T:]).all(), "rows past T must not be written"
    np.testing.assert_array_equal(
        amax.cpu().numpy()[:T], np.abs(got[:T]).max(axis=1).astype(np.float32)
    )
