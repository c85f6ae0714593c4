"""The IR and ModelSpec name what zoi runs, and refuse anything else."""

from __future__ import annotations

import pytest

from zoi.frontend.spec import SUPPORTED_ACTS, SUPPORTED_POOLING, ModelSpec
from zoi.graph.build import build_graph
from zoi.graph.ir import ACTS, OP_KINDS, Op
from zoi.graph.synthetic import synthetic_spec


@pytest.mark.parametrize("act", SUPPORTED_ACTS)
@pytest.mark.parametrize("pooling", SUPPORTED_POOLING)
def test_the_builder_emits_only_ir_ops(act, pooling):
    g = build_graph(synthetic_spec(act=act, pooling=pooling))
    # glu: ModernBERT and the decoders (tests/archs); sample: generation (below)
    assert {o.kind for o in g.ops} == set(OP_KINDS) - {"glu", "sample"}
    assert {o.attrs["act"] for o in g.linears()} <= set(ACTS)


def test_the_generation_graph_is_the_decoder_graph_with_a_cache_and_a_sampler():
    from zoi.graph.build_decoder import build_decoder, build_generate

    spec = synthetic_spec().replace(
        arch="qwen3", norm="rmsnorm", causal=True, act="silu", pooling="last", kv_heads=2
    )
    enc, gen = build_decoder(spec), build_generate(spec)
    assert [o.kind for o in gen.ops][-3:] == ["pool", "linear", "sample"]
    assert gen.ops[-2].weights["w"] == "lm_head.w" and gen.output == "tokens"
    n = len(enc.ops) - 1  # the stack and its final norm: the same ops, the attention paged
    for a, b in zip(enc.ops[:n], gen.ops[:n], strict=True):
        assert (a.kind, a.inputs, a.output, a.weights) == (b.kind, b.inputs, b.output, b.weights)
        assert b.attrs.get("paged", False) == (a.kind == "attention")
    with pytest.raises(ValueError, match="causal"):
        build_generate(spec.replace(causal=False))


@pytest.mark.parametrize("kind", ["normalize", "layernorm", "Linear", ""])
def test_an_op_outside_the_ir_is_refused(kind):
    with pytest.raises(ValueError, match="unknown op kind"):
        Op(kind, ["x"], "y")


def test_a_linear_with_an_unknown_activation_is_refused():
    Op("linear", ["x"], "y", {"w": "l0.o.w"}, {"act": "sigmoid"})
    with pytest.raises(ValueError, match="unknown activation 'swish'"):
        Op("linear", ["x"], "y", {"w": "l0.o.w"}, {"act": "swish"})


@pytest.mark.parametrize("field, value", [("act", "swish"), ("pooling", "weightedmean")])
def test_a_spec_zoi_cannot_run_is_refused(field, value):
    ok = synthetic_spec()
    with pytest.raises(ValueError, match=f"ModelSpec.{field} {value!r} is not supported"):
        ok.replace(**{field: value})
    with pytest.raises(ValueError, match="is not supported"):
        ModelSpec.from_dict({**ok.to_dict(), field: value})


# ---------------------------------------------------------------- the fusion pass (one plan)
import numpy as np  # noqa: E402

from zoi.graph import fusion  # noqa: E402
from zoi.graph.compiled import CompiledModel  # noqa: E402
from zoi.graph.planner import plan_memory  # noqa: E402
from zoi.graph.quantmode import QuantMode  # noqa: E402
from zoi.graph.synthetic import random_weights  # noqa: E402

MINILM = dict(hidden=384, heads=12, layers=2, inter=1536)


def _model(precision="int8", default="dynamic", schemes=None, static=None, transforms=None, **kw):
    from tests.fixtures import quantize_linears

    spec = synthetic_spec(**{**MINILM, **kw})
    w, quant = random_weights(spec, 0), {}
    if precision == "int8":
        w, quant = quantize_linears(w, static, schemes, transforms, default)
    return CompiledModel.build(spec, w, precision, 512, 64, quant)


def _by_prefix(g):
    return {o.weights["w"].rsplit(".", 1)[0]: o for o in g.linears()}


def test_fp32_minilm_has_no_int8_copies():
    m = _model("fp32")
    g = fusion.annotate(m)
    lin = _by_prefix(g)
    assert all(o.attrs["quant"] is QuantMode.FLOAT for o in g.linears())
    assert not any("quant_in" in o.attrs or "quant_out" in o.attrs for o in g.ops)
    assert not any(b.dtype == "i8" for b in g.buffers.values())
    assert len(lin) == 8
    assert fusion.decisions(g, 16) == []


def test_int8_dynamic_minilm_copies_and_writers():
    m = _model(default="dynamic")
    g = fusion.annotate(m)
    lin = _by_prefix(g)
    for i in range(2):
        x_in = "x0" if i == 0 else f"l{i - 1}.x2"
        qkv, o, f1, f2 = (lin[f"l{i}.{r}"] for r in ("qkv", "o", "ffn1", "ffn2"))
        assert qkv.attrs["quant_in"] == f"{x_in}@dynamic#q"
        assert qkv.attrs["quant_in_by"] == x_in  # the embed / the LayerNorm right before
        assert o.attrs["quant_in_by"] is None and o.attrs["quant_in_loop"]  # after attention
        assert f1.attrs["quant_in_by"] == f"l{i}.x1"
        assert f2.attrs["quant_in_by"] == f"l{i}.ffn_h" and f2.attrs["quant_in_loop"]
        assert f1.attrs["quant_out"] == f2.attrs["quant_in"]
        assert f1.attrs["quant_out_min_tokens"] == fusion.LINEAR_QUANT_MIN_TOKENS
    writer = {o.output: o for o in g.ops}
    assert writer["x0"].attrs["quant_out_min_tokens"] == 0
    small = [who for _, _, who in fusion.decisions(g, 255)]
    big = [who for _, _, who in fusion.decisions(g, 256)]
    assert small == [
        "embed",
        "loop",
        "add_layernorm",
        "loop",
        "add_layernorm",
        "loop",
        "add_layernorm",
        "loop",
    ]
    assert big == [
        "embed",
        "loop",
        "add_layernorm",
        "linear",
        "add_layernorm",
        "loop",
        "add_layernorm",
        "linear",
    ]
    c = g.buffers["l0.ffn_h@dynamic#q"]
    assert (c.dtype, c.cols, c.rows) == ("i8", 1536, "T") and c.nbytes(10, 2) == 15360
    # the copies are not activations of the float arena
    assert plan_memory(g, 512, 64).arena_bytes == m.plan.arena_bytes


@pytest.mark.parametrize("default", ["dynamic_asym", "static"])
def test_asym_and_static_copies_and_transforms(default):
    static = {"l0.o": 3.5} if default == "static" else None
    m = _model(default=default, static=static, transforms={"l1.o": "mul", "l1.ffn2": "shift+mul"})
    g = fusion.annotate(m)
    lin = _by_prefix(g)
    o0 = lin["l0.o"].attrs
    if default == "static":
        assert o0["quant"] is QuantMode.STATIC and o0["quant_static_amax"] == 3.5
        assert o0["quant_in"] == "l0.ctx@static3.5#q" and o0["quant_in_loop"]
    else:
        assert o0["quant_in"] == "l0.ctx@dynamic_asym#q" and not o0["quant_in_loop"]
    for p in ("l1.o", "l1.ffn2"):  # a transformed copy is its consumer's alone, never in-loop
        a = lin[p].attrs
        assert a["quant_transform"] and not a["quant_in_loop"] and a["quant_in"].endswith(f"@{p}#q")
    want_small = [
        "embed", "quantize" if default == "dynamic_asym" else "loop", "add_layernorm",
        "quantize" if default == "dynamic_asym" else "loop",
        "add_layernorm", "quantize", "add_layernorm", "quantize",
    ]  # fmt: skip
    assert [w for *_, w in fusion.decisions(g, 64)] == want_small
    assert [w for *_, w in fusion.decisions(g, 4096)][3::4] == ["linear", "linear"]


def test_mixed_precision_weight_only_and_chains():
    m = _model(schemes={"l0.ffn1": "fp32", "l1.ffn1": "weight_only", "l1.qkv": "dynamic_asym"})
    g = fusion.annotate(m)
    lin = _by_prefix(g)
    assert (
        lin["l0.ffn1"].attrs["quant"] is QuantMode.FLOAT and "quant_in" not in lin["l0.ffn1"].attrs
    )
    assert lin["l1.ffn1"].attrs["quant"] is QuantMode.FLOAT  # weight-only: dequantised
    # a float ffn1 may still write ffn2's copy (the IR allows it; the GPU makes that copy at the
    # consumer, the CPU falls back)
    assert lin["l0.ffn2"].attrs["quant_in_by"] == "l0.ffn_h"
    assert lin["l1.qkv"].attrs["quant_in"] == "l0.x2@dynamic_asym#q"


def test_the_pass_is_idempotent_and_follows_the_quantisation():
    m = _model(default="dynamic")
    d0 = [dict(o.attrs) for o in fusion.annotate(m).ops]
    assert [dict(o.attrs) for o in fusion.annotate(m).ops] == d0
    m.quant["l0.o"].scheme = QuantMode.DYNAMIC_ASYM
    g = fusion.annotate(m)
    assert _by_prefix(g)["l0.o"].attrs["quant_in"] == "l0.ctx@dynamic_asym#q"
    assert "l0.ctx@dynamic#q" not in g.buffers  # stale copies go
    m.quant["l0.o"].scheme = "int4"
    with pytest.raises(ValueError, match="l0.o: unknown INT8 scheme 'int4'"):
        fusion.annotate(m)


def test_policy_sets_the_linear_threshold_and_head_rows():
    m = _model(default="dynamic")
    g = fusion.annotate(m, fusion.FusionPolicy(linear_quant_min_tokens=32))
    assert [w for *_, w in fusion.decisions(g, 32)][3] == "linear"
    assert [w for *_, w in fusion.decisions(g, 31)][3] == "loop"


def test_quant_out_only_marks_the_linears_whose_float_output_only_the_copy_reads():
    """quant_out_only: on the linear writers of a copy (the FFN1s) whose float output nothing
    else reads; never on the other writers (embed / LayerNorm) or non-writers; off everywhere by
    FusionPolicy(quant_out_only=False); annotate without a policy takes the defaults (the pass
    reads no environment)."""
    m = _model(default="dynamic")
    g = fusion.annotate(m)
    lin = _by_prefix(g)
    assert {p for p, o in lin.items() if o.attrs.get("quant_out_only")} == {"l0.ffn1", "l1.ffn1"}
    assert all(lin[f"l{i}.ffn1"].attrs["quant_out_only"] is True for i in range(2))
    assert not any("quant_out_only" in o.attrs for o in g.ops if "quant_out" not in o.attrs)
    assert not any("quant_out_only" in o.attrs for o in g.ops if o.kind != "linear")
    writers = [o for o in g.linears() if "quant_out" in o.attrs]
    for policy, want in [
        (fusion.FusionPolicy(quant_out_only=False), False),
        (fusion.FusionPolicy(), True),
        (None, True),
    ]:
        fusion.annotate(m, policy)
        assert [o.attrs["quant_out_only"] for o in writers] == [want, want], policy
    assert not hasattr(fusion.FusionPolicy, "from_env")


@pytest.mark.parametrize("other", ["residual", "output"])
def test_quant_out_only_is_off_where_something_else_reads_the_float_output(other, monkeypatch):
    """The FFN1 still writes FFN2's copy, but its float output is read by more than the copy's
    quantisation: as FFN2's residual too, or as the graph's output (the host reads it)."""
    m = _model(default="dynamic")
    lin = _by_prefix(m.graph)
    if other == "residual":
        f2 = lin["l0.ffn2"]
        f2.inputs = [f2.inputs[0], f2.inputs[0]]
    else:
        m.graph.output = lin["l0.ffn1"].output
    g = fusion.annotate(m)
    lin = _by_prefix(g)
    assert lin["l0.ffn1"].attrs["quant_out"] == lin["l0.ffn2"].attrs["quant_in"]
    assert lin["l0.ffn1"].attrs["quant_out_only"] is False
    assert lin["l1.ffn1"].attrs["quant_out_only"] is True


def test_the_threshold_is_the_cpu_cores():
    cpu = pytest.importorskip("zoi._cpu")
    assert fusion.LINEAR_QUANT_MIN_TOKENS == cpu.I8_FUSE_QUANT_MIN_M


CPU_CASES = [
    dict(default="dynamic"),
    dict(default="dynamic_asym", transforms={"l0.ffn2": "mul", "l1.o": "shift+mul"}),
    dict(default="static"),
    dict(schemes={"l0.ffn1": "fp32", "l1.o": "static"}, default="dynamic_asym"),
]


@pytest.mark.parametrize("case", range(len(CPU_CASES)))
def test_the_cpu_engine_runs_the_irs_decisions(case, monkeypatch):
    """The native plan, read back from the engine's steps, is the IR's: the writer of every
    copy, by bucket; what the CPU cannot do (quantise while loading, an FP32 GEMM's int8
    epilogue, LN epilogues) is a quantise step / its own step, listed in its fallbacks."""
    pytest.importorskip("zoi._cpu")
    from zoi.backends.cpu import CpuBackend

    m = _model(**CPU_CASES[case], hidden=48, heads=3, inter=80)
    be = CpuBackend(m, nthreads=1)
    g = m.graph
    for T in (1, 255, 256, 512):
        want = [
            (p, c, "quantize" if w == "loop" or (be.fallbacks.get(c, "") and w == "linear") else w)
            for p, c, w in fusion.decisions(g, T)
        ]
        assert be.describe(T) == want, T
    # the float rows kept in scratch: exactly the INT8 linears the IR marks quant_out_only
    gemms = [s for s in be.engine.steps_info() if s["kind"] in ("gemm_i8", "gemm_f32")]
    want = [bool(o.attrs.get("quant_out_only")) and o.attrs["quant"].is_int8 for o in g.linears()]
    assert [s["y_scratch"] for s in gemms] == want
    assert any(want)  # an INT8 FFN1 in every case
    for o in g.linears():
        a = o.attrs
        if a.get("quant_in_loop") and a["quant_in_by"] is None:
            assert "no quantisation while loading" in be.fallbacks[a["quant_in"]]
    if case == 3:  # l0.ffn1 is FP32: no int8 epilogue for l0.ffn2's copy
        assert "FP32 GEMM" in be.fallbacks["l0.ffn_h@dynamic_asym#q"]


def test_the_cpu_engine_refuses_a_decision_it_cannot_carry_out():
    cpu = pytest.importorskip("zoi._cpu")
    e = cpu.Engine(1 << 20, 8, 2, "", 1)
    H = 8
    e.add_attention(0, 4096, 2, 4, 0.5)
    wq = np.ones((H, H), np.int8)
    ws = np.ones(H, np.float32)
    with pytest.raises(
        ValueError, match=r"the plan asks the step before this INT8 linear \(attention\)"
    ):
        e.add_linear_i8(4096, 8192, wq, ws, None, "none", q_from=1)
    with pytest.raises(ValueError, match="q_from must be 0"):
        e.add_linear_i8(4096, 8192, wq, ws, None, "none", q_from=2)
    e.add_linear_i8(4096, 8192, wq, ws, None, "none", q_from=0)
    with pytest.raises(ValueError, match=r"q_min_m >= 1"):
        e.add_linear_i8(8192, 12288, wq, ws, None, "none", q_from=1, q_min_m=0)
    e.add_linear_i8(8192, 12288, wq, ws, None, "none", q_from=1, q_min_m=64)
    info = e.steps_info()
    assert [s["kind"] for s in info] == ["attention", "quantize", "gemm_i8", "quantize", "gemm_i8"]
    assert (
        info[2]["writes_copy"]
        and info[2]["min_m"] == 64
        and info[3]["fused"]
        and info[3]["slot"] == 1
    )
