"""The embedding gather + LayerNorm (float and INT8 word tables), per backend (tests/ops/helpers.py)."""

from __future__ import annotations

import numpy as np
import pytest
from tests.ops.helpers import (
    DEV,
    ISAS,
    _assert_quant,
    _qargs,
    _qbufs,
    _rand,
    _transform,
    close,
    cuda,
    f16,
    k_embed,
    nanlike,
    poison,
    rel,
    t,
    torch,
)

from zoi import _cpu
from zoi.numerics import primitives as qp
from zoi.numerics import reference as ref


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("int8_table", [False, True])
@pytest.mark.parametrize("H,with_type", [(60, True), (384, False), (7, True)])
def test_embed_cpu(isa, int8_table, H, with_type, rng):
    V, P, T = 53, 41, 29
    word = rng.standard_normal((V, H)).astype(np.float32)
    pos = rng.standard_normal((P, H)).astype(np.float32)
    typ = rng.standard_normal((2, H)).astype(np.float32) if with_type else None
    lw = (1 + 0.1 * rng.standard_normal(H)).astype(np.float32)
    lb = (0.1 * rng.standard_normal(H)).astype(np.float32)
    ids = rng.integers(0, V, T).astype(np.int32)
    positions = rng.integers(0, P, T).astype(np.int32)
    y = nanlike((T, H))
    if int8_table:
        wq, ws = qp.quantize_embedding(word)
        tables, table = (None, wq, ws), qp.dequantize_weight(wq, ws)
    else:
        tables, table = (word, None, None), word
    typ0 = None if typ is None else typ[0].copy()
    _cpu.k_embed(ids, positions, *tables, pos, typ0, lw, lb, 1e-12, y, isa, 2)
    want = ref.embed(ids, positions, table, pos, lw, lb, 1e-12, typ, dtype=np.float64)
    close(y, want, 1e-5, 3e-6)


@cuda
@pytest.mark.parametrize("word_q", [False, True])
@pytest.mark.parametrize("has_type", [False, True])
@pytest.mark.parametrize(
    "qmode,tr",
    [
        ("dynamic", "none"),
        ("dynamic_asym", "shift+mul"),
        ("dynamic_asym", "none"),
        ("static", "mul"),
    ],
)
def test_embed_cuda(word_q, has_type, qmode, tr):
    rng = np.random.default_rng(word_q * 2 + has_type + len(tr))
    V, P, H, T = 50, 20, 40, 11
    word, pos, typ = _rand(rng, V, H), _rand(rng, P, H, scale=0.3), _rand(rng, 2, H, scale=0.3)
    lw, lb = 1 + _rand(rng, H, scale=0.1), _rand(rng, H, scale=0.1)
    ids = rng.integers(0, V, T).astype(np.int32)
    positions = rng.integers(0, P, T).astype(np.int32)
    if word_q:
        wq, ws = qp.quantize_embedding(word)
        word_ref = qp.dequantize_weight(wq, ws)
        word_arg, ws_arg = t(wq), t(ws)
    else:
        word_ref = f16(word)
        word_arg, ws_arg = t(word, torch.float16), None
    x = poison((T, H), torch.float16)
    amax = poison((T,), torch.float32)
    zero = poison((3, T + 5), torch.float32)
    cu = np.array([0, 4, 5, T], np.int32)
    tcum = torch.full((4,), -1, dtype=torch.int32, device=DEV)
    shift, mul = _transform(rng, H, tr)
    xq, xs, xz = _qbufs(T, H)
    k_embed.launch_embed(
        t(ids),
        t(positions),
        word_arg,
        ws_arg,
        t(pos, torch.float16),
        t(typ[0], torch.float16) if has_type else None,
        t(lw),
        t(lb),
        x,
        amax,
        zero,
        T,
        H,
        3,
        T + 5,
        1e-12,
        tiles=(t(np.array([0, 3, T], np.int32)), t(cu), tcum, 4, 16),
        **_qargs(qmode, shift, mul, 2.0, xq, xs, xz, "x"),
    )
    np.testing.assert_array_equal(tcum.cpu().numpy(), [1, 2, 4, -1])
    want = ref.embed(
        ids,
        positions,
        word_ref.astype(np.float64),
        f16(pos),
        lw.astype(np.float64),
        lb.astype(np.float64),
        1e-12,
        f16(typ) if has_type else None,
        np.float64,
    )
    got = x.float().cpu().numpy()
    assert rel(got, want) < 2e-3
    np.testing.assert_array_equal(amax.cpu().numpy(), np.abs(got).max(axis=1).astype(np.float32))
    _assert_quant(got, qmode, shift, mul, 2.0, xq, xs, xz)
    z = zero.cpu().numpy()
    assert (z[:, :T] == 0).all() and np.isnan(z[:, T:]).all()
