"""ModernBERT has no position table (RoPE in attention): the CPU engine holds none (it
used to build a zero table of min(P, max_tokens) x H floats, ~25 MB
for ModernBERT-base at 8192 tokens, and count it as weights), the embed kernel adds nothing,
and positions stay bounded by the RoPE tables."""

from __future__ import annotations

import numpy as np
import pytest
from tests.archs.helpers import TEXTS, checkpoint, cosine, hf_hidden
from tests.conftest import compile_int8_for_kernels
from tests.fixtures import supported_isas

import zoi
from zoi import _cpu
from zoi.numerics import primitives as qp
from zoi.numerics import reference as ref


@pytest.fixture(scope="module")
def modernbert(tmp_path_factory):
    return checkpoint("modernbert", tmp_path_factory.mktemp("mb"), seed=7)


@pytest.mark.parametrize("isa", supported_isas())
@pytest.mark.parametrize("int8_table", [False, True])
@pytest.mark.parametrize("H", [40, 7, 384])
def test_embed_kernel_without_position_table(isa, int8_table, H):
    rng = np.random.default_rng(H + 100 * int8_table)
    V, T = 53, 29
    word = rng.standard_normal((V, H)).astype(np.float32)
    lw = (1 + 0.1 * rng.standard_normal(H)).astype(np.float32)
    lb = (0.1 * rng.standard_normal(H)).astype(np.float32)
    ids = rng.integers(0, V, T).astype(np.int32)
    positions = rng.integers(0, 10**6, T).astype(np.int32)  # never read without a table
    if int8_table:
        wq, ws = qp.quantize_embedding(word)
        tables, table = (None, wq, ws), qp.dequantize_weight(wq, ws)
    else:
        tables, table = (word, None, None), word
    y = np.full((T, H), np.nan, np.float32)  # poisoned: every row must be written
    _cpu.k_embed(ids, positions, *tables, None, None, lw, lb, 1e-12, y, isa, 2)
    want = ref.embed(ids, positions, table, None, lw, lb, 1e-12, dtype=np.float64)
    assert np.isfinite(y).all()
    np.testing.assert_allclose(y, want, atol=3e-6, rtol=1e-5)


def test_engine_holds_no_position_table(modernbert, tmp_path):
    model, folder = modernbert
    eng = zoi.compile(folder, device="cpu")
    assert "embed.pos" not in eng.model.weights
    assert "pos" not in eng.model.graph.ops[0].weights
    got = eng.encode(TEXTS, normalize_embeddings=False)
    want = np.stack([hf_hidden(model, s).mean(0) for s in eng.tokenize(TEXTS)])
    assert cosine(got, want).min() >= 0.99999
    # 4x the positions: the held weights grow by the RoPE tables (held once each, not once
    # per layer) and by no zero position table of P x H floats
    _, folder4 = checkpoint("modernbert", tmp_path / "p4", seed=7, max_position_embeddings=1600)
    for prec in ("fp32", "int8"):  # INT8: the quantiser's small calibration (the bytes matter)
        build = compile_int8_for_kernels if prec == "int8" else zoi.compile
        a, b = build(folder, device="cpu"), build(folder4, device="cpu")
        rope = {n: w.nbytes for n, w in b.model.weights.items() if n.startswith("rope.")}
        assert len(rope) == 4  # global and local cos / sin
        grown = b.backend.memory()["weights_bytes"] - a.backend.memory()["weights_bytes"]
        assert grown == sum(rope.values()) * (1600 - 400) // 1600, (prec, grown)


def test_engine_binding_counts_no_table():
    H, V, P = 8, 4, 32
    args = (np.zeros((V, H), np.float32), None, None)
    ln = (np.ones(H, np.float32), np.zeros(H, np.float32), 1e-5)
    e = _cpu.Engine(1 << 20, 8, 1)
    e.add_embed(0, *args, None, None, *ln, P)
    with_table = _cpu.Engine(1 << 20, 8, 1)
    with_table.add_embed(0, *args, np.zeros((P, H), np.float32), None, *ln)
    assert with_table.weights_bytes - e.weights_bytes == P * H * 4
    with pytest.raises(ValueError, match="max_pos"):
        _cpu.Engine(1 << 20, 8, 1).add_embed(0, *args, None, None, *ln)  # no table, no bound
    with pytest.raises(ValueError, match="max_pos"):
        _cpu.Engine(1 << 20, 8, 1).add_embed(0, *args, np.zeros((P, H), np.float32), None, *ln, 3)


def test_positions_still_bounded_without_a_table(modernbert):
    _, folder = modernbert
    eng = zoi.compile(folder, device="cpu", max_tokens=1024)
    P = eng.spec.max_positions
    ids, cu = np.full(3, 5, np.int32), np.array([0, 3], np.int32)
    eng.backend.run(ids, np.array([0, 1, P - 1], np.int32), cu, False)  # the last row: fine
    with pytest.raises(Exception, match="position"):
        eng.backend.run(ids, np.array([0, 1, P], np.int32), cu, False)


def test_int8_artifact_round_trips_without_table(modernbert, tmp_path):
    _, folder = modernbert
    eng = compile_int8_for_kernels(folder)  # what is saved matters, not the calibration
    art = eng.save(tmp_path / "art")
    from safetensors.numpy import load_file

    names = set(load_file(str(art / "weights.safetensors")))
    assert not any(n.startswith("embed.pos") for n in names)
    back = zoi.load(art, device="cpu")
    np.testing.assert_array_equal(back.encode(TEXTS), eng.encode(TEXTS))
