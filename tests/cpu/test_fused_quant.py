"""An INT8 GEMM that quantises its own output rows for the next INT8 GEMM (FFN1 -> FFN2) once a
call has >= kI8FuseQuantMinM (256) tokens: the same integers, scales and zero points as the
separate quantise step, so a big batch is bitwise equal to its sequences run alone (< 256 tokens,
the unfused path), on every ISA and quantisation scheme."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import batch, make_model, small_spec, supported_isas

from zoi.backends.cpu import CpuBackend
from zoi.backends.cpu.options import CpuOptions
from zoi.graph.fusion import FusionPolicy

ISAS = supported_isas()
LENGTHS = [80, 79, 80, 3, 80, 1]  # 323 tokens: fused; each sequence alone: not


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize(
    "default_scheme,schemes,tr",
    [
        ("dynamic", {}, {}),
        ("dynamic_asym", {}, {"l0.ffn2": "mul", "l1.ffn2": "shift+mul"}),
        ("dynamic", {"l0.ffn2": "static", "l1.ffn2": "dynamic_asym"}, {"l1.ffn2": "mul"}),
    ],
)
def test_fused_output_quantisation_is_the_quantise_step(isa, default_scheme, schemes, tr):
    from zoi.quant.forward import run_graph

    m = make_model(
        small_spec(intermediate=300),
        "int8",
        max_tokens=400,
        max_batch=8,
        schemes=schemes,
        default_scheme=default_scheme,
        act_transforms=tr,
    )
    be = CpuBackend(m, isa=isa, nthreads=2)
    ids, pos, cu = batch(LENGTHS, m.spec.vocab_size, 11)
    assert cu[-1] >= 256
    full = be.run(ids, pos, cu, False)
    assert np.isfinite(full).all()
    for b in range(len(LENGTHS)):
        a, e = cu[b], cu[b + 1]
        one = be.run(ids[a:e], pos[a:e], np.array([0, e - a], np.int32), False)
        np.testing.assert_array_equal(one[0], full[b])
    want = run_graph(m.graph, m.weights, ids, pos, cu, quant=m.quant, normalize=False)
    assert np.abs(full - want).max() <= 1e-3 * max(1.0, float(np.abs(want).max()))


# ---- the float rows of the fused path in per-thread scratch (GemmI8Args::y_scratch): where the
# plan says nothing reads the FFN1 output but its quantisation (zoi.graph.fusion quant_out_only,
# add_linear_i8's y_dead; FusionPolicy(quant_out_only=False) turns it off); Engine::check_dead_outputs verifies it


def _fusedq(isa, x, w, ws, b, act, y_scratch, nt, static_amax=-1.0, asym=False):
    from zoi import _cpu

    M, N = x.shape[0], w.shape[0]
    y = np.full((M, N), np.nan, np.float32)  # poisoned
    q = np.full((M, N), -999, np.int16)
    qs = np.full(M, np.nan, np.float32)
    qz = np.full(M, -999, np.int32)
    _cpu.k_linear_i8_fusedq(x, w, ws, b, act, y, y_scratch, q, qs, qz, static_amax, asym, isa, nt)
    return y, q, qs, qz


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize(
    "M,N,K", [(1, 7, 37), (17, 300, 96), (64, 48, 64), (65, 200, 100), (300, 1536, 384)]
)
@pytest.mark.parametrize("nt", [1, 3])
def test_scratch_rows_leave_y_unwritten_and_quantise_the_same(isa, M, N, K, nt, request):
    """y_scratch on: y stays poisoned (NaN in every element: the GEMM did not write it) and the int8
    rows, scales and zero points are bit-identical to the path that writes y (off), which wrote
    every element of y. M below / above the 64-row chunk and amx's 16-row tile path."""
    CpuOptions(amx_min_m=1).apply()  # amx: every M on the tile kernel
    request.addfinalizer(lambda: CpuOptions().apply())
    rng = np.random.default_rng(M * 7 + N)
    x = rng.standard_normal((M, K)).astype(np.float32)
    w = rng.integers(-127, 128, (N, K)).astype(np.int8)
    ws = (rng.random(N).astype(np.float32) + 0.5) * 1e-3
    b = rng.standard_normal(N).astype(np.float32)
    for asym in (False, True):
        y0, q0, s0, z0 = _fusedq(isa, x, w, ws, b, "gelu", False, nt, asym=asym)
        assert np.isfinite(y0).all() and np.isfinite(s0).all() and (q0 != -999).all()
        y1, q1, s1, z1 = _fusedq(isa, x, w, ws, b, "gelu", True, nt, asym=asym)
        assert np.isnan(y1).all(), "y_scratch on: the float output must not be written"
        np.testing.assert_array_equal(q1, q0)
        np.testing.assert_array_equal(s1.view(np.int32), s0.view(np.int32))
        np.testing.assert_array_equal(z1, z0)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize(
    "lengths", [[80, 79, 80, 3, 80, 1], [80, 53]]
)  # 323 tokens (fused), 133 (not)
def test_engine_scratch_rows_bit_identical_to_arena_rows(isa, lengths, monkeypatch):
    """The engine with the FFN1 float rows in scratch (default where the plan allows it) against
    FusionPolicy(quant_out_only=False) (into the arena): the same bits, above and below q_min_m (256), 2 threads;
    the IR marks the FFN1s (quant_out_only) only when on, and the engine's GEMM steps marked
    (steps_info y_scratch) are exactly those of the marked linears, each writing a copy."""
    m = make_model(small_spec(intermediate=300), "int8", max_tokens=400, max_batch=8)
    ids, pos, cu = batch(lengths, m.spec.vocab_size, 5)
    outs = {}
    for flag in ("0", "1"):
        be = CpuBackend(m, isa=isa, nthreads=2, fusion=FusionPolicy(quant_out_only=flag == "1"))
        info = be.engine.steps_info()
        marked = [s for s in info if s.get("y_scratch")]
        ir = {_prefix(o): bool(o.attrs.get("quant_out_only")) for o in m.graph.linears()}
        assert {p for p, on in ir.items() if on} == (
            set() if flag == "0" else {"l0.ffn1", "l1.ffn1"}
        )
        assert _scratch_steps(be) == ir
        if flag == "0":
            assert not marked
        else:
            assert marked and all(s["kind"] == "gemm_i8" and s["writes_copy"] for s in marked)
            assert len(marked) == sum(
                1 for s in info if s["kind"] == "gemm_i8" and s["writes_copy"]
            )
        out = be.run(ids, pos, cu, False)
        assert np.isfinite(out).all()
        outs[flag] = out
    np.testing.assert_array_equal(outs["1"], outs["0"])


def _prefix(op) -> str:
    return op.weights["w"].rsplit(".", 1)[0]


def _scratch_steps(be) -> dict[str, bool]:
    """{linear prefix: its GEMM step's y_scratch} read back from the engine (steps in op order)."""
    gemms = [s for s in be.engine.steps_info() if s["kind"] in ("gemm_i8", "gemm_f32")]
    lin = be.model.graph.linears()
    assert len(gemms) == len(lin)
    return {_prefix(o): bool(s["y_scratch"]) for o, s in zip(lin, gemms, strict=True)}


def _hand_plan(reader, y_dead, copy=True):
    """A GEMM (FFN1, arena bytes 0..) and the INT8 GEMM after it that reads its copy (written by
    FFN1 from 4 rows when `copy`, else by a quantise step), then `reader`'s steps."""
    from zoi import _cpu

    H, T = 8, 8
    e = _cpu.Engine(1 << 20, T, 2, "", 1)
    wq = np.ones((H, H), np.int8)
    ws = np.ones(H, np.float32)
    one, zero = np.ones(H, np.float32), np.zeros(H, np.float32)
    X, Y, Z, W = 0, 4096, 8192, 12288  # byte offsets of [T, H] buffers
    e.add_linear_i8(W, X, wq, ws, None, "gelu", q_from=0, y_dead=y_dead)  # FFN1: X
    e.add_linear_i8(X, Y, wq, ws, None, "none", q_from=int(copy), q_min_m=4 if copy else 0)
    out = Y
    if reader == "layernorm":
        e.add_layernorm(X, -1, Z, one, zero, 1e-5)
        out = Z
    elif reader == "overwritten_then_read":
        e.add_layernorm(Y, -1, X, one, zero, 1e-5)  # writes at X: FFN1's output is gone
        e.add_layernorm(X, -1, Z, one, zero, 1e-5)
        out = Z
    elif reader == "overwritten_output":
        e.add_layernorm(Y, -1, X, one, zero, 1e-5)  # writes the run's output at FFN1's bytes
        out = X
    elif reader == "output":
        out = X
    e.set_output(out, H, True)
    return e


@pytest.mark.parametrize(
    "reader", ["none", "layernorm", "overwritten_then_read", "overwritten_output", "output"]
)
def test_engine_realises_y_dead_and_refuses_it_where_the_float_output_is_read(reader, monkeypatch):
    """The plan's y_dead (zoi.graph.fusion quant_out_only) on hand-built plans: realised (that
    GEMM's rows in scratch, steps_info y_scratch) where nothing reads its float output; refused at
    finalize, naming the reader, where a later step reads it (a LayerNorm on it) or it is the run's
    output; a later step that first overwrites that buffer (another LayerNorm writing at its start)
    makes a read after it, or the output there, harmless. Without y_dead the engine decides
    nothing (no scratch anywhere): the switch is the plan's business, not the engine's."""
    ok = reader in ("none", "overwritten_then_read", "overwritten_output")
    e = _hand_plan(reader, True)
    if not ok:
        why = "step 4 \\(layernorm\\) reads it" if reader == "layernorm" else "the run's output"
        with pytest.raises(ValueError, match=f"quant_out_only.*{why}"):
            e.finalize()
    else:
        e.finalize()
        info = e.steps_info()
        assert [s["kind"] for s in info[:4]] == ["quantize", "gemm_i8", "quantize", "gemm_i8"]
        assert info[1]["writes_copy"] and info[2]["fused"]
        assert info[1]["y_scratch"], info
        assert not any(s.get("y_scratch") for i, s in enumerate(info) if i != 1)
        assert e.scratch_bytes > 0
    e = _hand_plan(reader, ok)
    e.finalize()
    assert e.steps_info()[1]["y_scratch"] == ok
    e = _hand_plan(reader, False)
    e.finalize()
    assert not any(s["y_scratch"] for s in e.steps_info())


def test_engine_refuses_y_dead_on_a_gemm_that_writes_no_copy():
    """y_dead on a GEMM whose output the next linear's quantise step reads (no fused copy), or on
    the last GEMM: refused at finalize with the reason."""
    e = _hand_plan("none", True, copy=False)
    with pytest.raises(ValueError, match="writes no int8 copy of its output"):
        e.finalize()
    from zoi import _cpu

    e = _cpu.Engine(1 << 20, 8, 2, "", 1)
    wq, ws = np.ones((8, 8), np.int8), np.ones(8, np.float32)
    e.add_linear_i8(0, 4096, wq, ws, None, "none", q_from=0, y_dead=True)
    e.set_output(4096, 8, True)
    with pytest.raises(ValueError, match="writes no int8 copy of its output"):
        e.finalize()


def test_a_tap_of_a_scratch_output_is_refused(monkeypatch):
    """A tap (run_outputs) of an FFN1 output whose rows went to scratch would read stale arena
    bytes: refused with the fix in the message; with quant_out_only off the tap reads the rows."""
    m = make_model(small_spec(intermediate=300), "int8", max_tokens=400, max_batch=8)
    ids, pos, cu = batch(LENGTHS, m.spec.vocab_size, 5)
    be = CpuBackend(m, nthreads=1)
    lin = {o.output: o for o in m.graph.ops if o.kind == "linear"}
    name = next(n for n, o in lin.items() if o.attrs.get("quant_out"))
    with pytest.raises(ValueError, match=r"FusionPolicy\(quant_out_only=False\)"):
        be.run_outputs(ids, pos, cu, taps=(name,))
    off = FusionPolicy(quant_out_only=False)
    out = CpuBackend(m, nthreads=1, fusion=off).run_outputs(ids, pos, cu, taps=(name,))
    assert np.isfinite(out[name]).all()
