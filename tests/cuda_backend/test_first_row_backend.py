"""The first row of each sequence quantised twice (LinearQuant.first_row) on the cuda backend:
the plan's launches (none of its own: the embedding kernel writes the row map, each such INT8
linear computes its first rows' second quantisation in its K loop), every linear against zoi.numerics.reference.linear_apply with the batch's cu_seqlens on the
very fp16 input it read (and visibly apart from the single-quantisation numerics on the
first rows), and the whole CudaBackend against the ReferenceBackend. Every INT8 scheme, with
and without SmoothQuant transforms (quantize launches and quantise-while-loading). Interpreter
in CI (small shapes: it is slow), compiled on the GPU."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from tests import triton_mode  # noqa: E402
from tests.cuda_backend.cuda_helpers import (  # noqa: E402
    MIXED,
    batch,
    default_quant_model,
    min_cosine,
    rel,
    run_ahead_of_time,
    tiny_model,
)

from zoi.backends.reference import ReferenceBackend  # noqa: E402
from zoi.graph.compiled import CompiledModel  # noqa: E402
from zoi.numerics.reference import activation, linear_apply  # noqa: E402

COMPILED = not triton_mode.interpreted()
pytestmark = pytest.mark.skipif(
    COMPILED and not torch.cuda.is_available(), reason="compiled Triton needs a CUDA GPU"
)
# (lens): one sequence of one row, length-1 sequences among longer ones, many sequences
LENS = ([1], [5, 1, 9, 1], [20, 20, 3]) if not COMPILED else ([1], [5, 1, 9, 30], [2] * 64)
SIZE = dict(max_tokens=64) if not COMPILED else dict(max_tokens=512, max_batch=64)
PLAN = dict(buckets=[16, 64]) if not COMPILED else {}


def _on(model: CompiledModel) -> CompiledModel:
    """The same artifact with the first-row residual on every INT8 linear."""
    quant = {
        p: dataclasses.replace(q, first_row=q.scheme in ("dynamic", "static", "dynamic_asym"))
        for p, q in model.quant.items()
    }
    m = CompiledModel.build(
        model.spec, model.weights, "int8", model.plan.max_tokens, model.plan.max_batch, quant
    )
    assert any(q.first_row for q in m.quant.values())
    return m


def _off(model: CompiledModel) -> CompiledModel:
    """The same artifact without the first-row residual."""
    quant = {p: dataclasses.replace(q, first_row=False) for p, q in model.quant.items()}
    return CompiledModel.build(
        model.spec, model.weights, "int8", model.plan.max_tokens, model.plan.max_batch, quant
    )


def _backend(model, opts=None, **kw):
    from zoi.backends.cuda.backend import CudaBackend
    from zoi.backends.cuda.options import CudaOptions

    return CudaBackend(
        model, interpret=None if COMPILED else True, options=CudaOptions(**(opts or {})), **kw
    )


def _models():
    return {
        "mixed": lambda: _on(tiny_model("int8", **SIZE, **MIXED)),
        "default": lambda: default_quant_model(**SIZE, first_row_residual=True),
    }


def _per_linear(be, model, lens, seed=0):
    """Run the bucket's launches one by one; every INT8 first-row linear against the emulation
    on the fp16 input it read: {prefix: (rel error, rel distance of the first rows from the
    single-quantisation numerics, rel error on those rows)}."""
    ids, pos, cu = batch(lens, model.spec.vocab_size, np.random.default_rng(seed))
    T = len(ids)
    tb = next(b for b in be.buckets if b >= T)
    plan = be.plan_for(tb)
    n, _ = be._stage(ids, pos, cu, False, tb)
    be.d_in[:n] = torch.from_numpy(be.h_in[:n].copy()).to(be.d_in.device)
    steps = be._steps_for(tb, persistent=False)  # the closures, not run yet
    rows = cu[:-1]
    out = {}
    for step, la in zip(steps, plan["launches"], strict=True):
        x = None
        if la.kind == "linear" and la.extra.get("first_row"):
            x = be._act(plan, la.ins[0], tb)[:T].float().cpu().numpy()
        step()
        if COMPILED:
            torch.cuda.synchronize()
        if x is None:
            continue
        p = la.extra["prefix"]
        got = be._act(plan, la.out, tb)[:T].float().cpu().numpy()
        res = be._act(plan, la.res, tb)[:T].float().cpu().numpy() if la.res else 0.0
        a = la.op.attrs.get("act", "none")
        lq = model.quant[p]
        want = activation(linear_apply(x, model.weights, p, lq, cu_seqlens=cu), a) + res
        want0 = activation(linear_apply(x, model.weights, p, lq), a) + res
        out[p] = (rel(got, want), rel(want0[rows], want[rows]), rel(got[rows], want[rows]))
    return out


@pytest.mark.parametrize("name", ["mixed", "default"])
def test_each_linear_matches_the_emulation(name):
    model = _models()[name]()
    be = _backend(model, **PLAN)
    n_fr = sum(bool(q.first_row) for q in model.quant.values())
    off = _backend(_off(model), **PLAN)
    la = be.plan["launches"]  # no launch of its own: the same kinds as without it
    assert [x.kind for x in la] == [x.kind for x in off.plan["launches"]]
    assert la[0].kind == "embed" and la[0].extra.get("first_row_map")
    assert sum(bool(x.extra.get("first_row")) for x in la) == n_fr
    assert not any(n.endswith("#q2") for n in be.plan["fallbacks"])
    # the one-launch forwards (persistent, megakernel) have no first-row term: they refuse
    from zoi.backends.cuda.persistent import PersistentUnsupported, _layers

    with pytest.raises(PersistentUnsupported):
        _layers(be)
    seen = 0
    for lens in LENS:
        for p, (e, apart, e_rows) in _per_linear(be, model, lens).items():
            # fp16 output rounding only; the first rows: far closer to the two-quantisation
            # numerics than the single-quantisation ones are
            assert e < 2e-3 and e_rows < 2e-3, (p, lens, e, e_rows)
            assert e_rows < 0.25 * apart or apart < 4e-3, (p, lens, e_rows, apart)
            seen += apart > 4e-3
            print(f"{p} {lens}: rel {e:.2e}, first rows {e_rows:.2e} (apart {apart:.2e})")
    assert seen > 0, "the second quantisation changed no first row visibly"


# the default artifact: the slow tier (~28 s in the interpreter); the default tier runs the
# whole backend with the first-row term on every INT8 scheme ("mixed") and each linear of the
# default artifact against the emulation (test_each_linear_matches_the_emulation[default]);
# scripts/gpu_check.sh runs it compiled
@pytest.mark.parametrize("name", ["mixed", pytest.param("default", marks=pytest.mark.slow)])
def test_backend_matches_reference(name):
    model = _models()[name]()
    be = _backend(model, **PLAN)
    ref = ReferenceBackend(model, dtype=np.float64)
    rng = np.random.default_rng(5)
    for lens in LENS:
        ids, pos, cu = batch(lens, model.spec.vocab_size, rng)
        for norm in (False, True):
            got, want = be.run(ids, pos, cu, norm), ref.run(ids, pos, cu, norm)
            assert got.shape == want.shape and np.isfinite(got).all()
            assert rel(got, want) < 3e-2 and min_cosine(got, want) > 0.99, (lens, norm)


def test_plan_marks_and_fallbacks(caplog):
    """first_row.first_rows on a launch list: the embedding writes the row map, each first-row
    INT8 linear is marked (no launch added); SPLADE's fused decoder and the pooled rows' linears
    run without the term: listed in the fallbacks and warned of once."""
    from types import SimpleNamespace as NS

    from zoi.backends.cuda.first_row import FIRST_ROW_MAP, first_rows
    from zoi.graph.quantmode import QuantMode

    def la(kind, prefix=None, mode=QuantMode.DYNAMIC, **extra):
        return NS(kind=kind, mode=mode, extra=dict(prefix=prefix, **extra))

    on = NS(first_row=True)
    model = NS(
        quant={"a": on, "b": on, "dec": on, "dense": on, "f": on, "off": NS(first_row=False)}
    )
    launches = [
        la("embed"), la("linear", "a"), la("attention"), la("linear", "b", QuantMode.STATIC),
        la("linear", "f", QuantMode.FLOAT), la("linear", "off"), la("linear", "dec", splade=True),
        la("linear", "dense", rows="B"),
    ]  # fmt: skip
    fallbacks: dict = {}
    with caplog.at_level("WARNING", logger="zoi"):
        out = first_rows(model, list(launches), fallbacks, warn=True)
    assert [id(x) for x in out] == [id(x) for x in launches]  # no launch of its own
    assert out[0].extra["first_row_map"] == FIRST_ROW_MAP
    marked = [x.extra["prefix"] for x in out if x.extra.get("first_row")]
    assert marked == ["a", "b"]
    assert sorted(fallbacks) == ["dec#q2", "dense#q2"]
    assert "2 INT8 linears without their first-row" in caplog.text and "dec, dense" in caplog.text
    with pytest.raises(ValueError, match="row map"):  # no embedding kernel to write the map
        first_rows(model, [la("linear", "a")], {}, warn=False)


_PTR = {"a_zp_ptr": "*i32", "colsum_ptr": "*i32", "w_ptr": "*i8", "fr_ptr": "*i32",
        "x_ptr": "*fp16", "r_ptr": "*fp16", "y_ptr": "*fp16"}  # fmt: skip


def compile_linear_ahead(cases: list) -> list:
    """linear_kernel compiled for sm_90 without a GPU (TRITON_INTERPRET unset; ptxas runs), at
    the backend's pick_config: [{regs, stack (spilled bytes), shared}] per case (kw of
    pick_config + the kernel's constexprs)."""
    from tests.cuda_backend.ptx_helpers import _resource_usage
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, compile

    from zoi.backends.cuda.kernels import linear as kl

    names, out = kl.linear_kernel.arg_names, []
    for c in cases:
        c = dict(c)
        M, N, K = c.pop("M"), c.pop("N"), c.pop("K")
        cfg = kl.pick_config(M, N, K, True, prequant=c["QUANT"] == 4)
        opts = {k: cfg.pop(k) for k in ("num_warps", "num_stages")}
        meta = {**c, **cfg}
        sig = {
            n: "constexpr" if n in meta
            else ("*i8" if c["QUANT"] == 4 else "*fp16") if n == "a_ptr"
            else _PTR.get(n, "*fp32") if n.endswith("_ptr")
            else "fp32" if n == "static_amax"
            else "i32"
            for n in names
        }  # fmt: skip
        # as the launcher specialises them: pointers 16-byte aligned, and the sizes / strides
        # of these shapes (multiples of 16)
        attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names) if sig[n][0] in "*i"}
        const = {(names.index(k),): v for k, v in meta.items()}
        src = ASTSource(fn=kl.linear_kernel, signature=sig, constexprs=const, attrs=attrs)
        k = compile(src, target=GPUTarget("cuda", 90, 32), options=opts)
        out.append({**_resource_usage(k.asm["cubin"]), "shared": int(k.metadata.shared)})
    return out


def fma_in_q2() -> int:
    """fma.rn.f32 in the PTX (sm_90) of act_tf (act_shift, act_mul) + quantize.first_row_q2:
    0, or the residual is not the emulation's x' - d with both rounded on their own."""
    import triton
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, compile

    from zoi.backends.cuda.kernels.quantize import act_tf, first_row_q2

    @triton.jit
    def probe(x_ptr, t_ptr, s1_ptr, q1_ptr, q2_ptr, R: tl.constexpr, C: tl.constexpr):
        rows, cols = tl.arange(0, R), tl.arange(0, C)
        offs = rows[:, None] * C + cols[None, :]
        x = act_tf(tl.load(x_ptr + offs).to(tl.float32), cols, cols < C, t_ptr, t_ptr + C, 1, 1)
        s1, ok = tl.load(s1_ptr + rows), (offs >= 0)
        tl.store(q2_ptr + offs, first_row_q2(x, tl.load(q1_ptr + offs), s1, s1 * 0.00390625, ok))

    sig = dict(x_ptr="*fp16", t_ptr="*fp32", s1_ptr="*fp32", q1_ptr="*fp32", q2_ptr="*i8")
    src = ASTSource(fn=probe, signature={**sig, "R": "constexpr", "C": "constexpr"},
                    constexprs={(5,): 4, (6,): 64})  # fmt: skip
    return compile(src, target=GPUTarget("cuda", 90, 32)).asm["ptx"].count("fma.rn.f32")


@pytest.mark.skipif(COMPILED, reason="the GPU run compiles them for real")
def test_first_row_kernels_compile_for_sm90():
    """What the interpreter cannot see: every INT8 QUANT mode's FIRST_ROW kernel (both K
    loops behind the tile's runtime test) goes through Triton's sm_90 codegen and ptxas at the
    MiniLM shapes the backend picks for 16 and 128 tokens, without spilling; and q2's residual
    has no FMA (the emulation rounds x' and d before the subtract)."""
    base = dict(ACT=0, HAS_RES=False, AMAX_OUT=False, PDL=True, IN_SHIFT=False, IN_MUL=False,
                ASYM=False, FIRST_ROW=True)  # fmt: skip
    modes = [
        dict(QUANT=1),
        dict(QUANT=2),
        dict(QUANT=4, IN_MUL=True),
        dict(QUANT=4, ASYM=True, IN_SHIFT=True, IN_MUL=True),
        dict(QUANT=4, ASYM=True, IN_MUL=True, HAS_RES=True),  # a residual
    ]
    cases = [{**base, "N": 1536, "K": 384, **m, "M": M} for m in modes for M in (16, 128)]
    code = (
        "import json, sys; from tests.cuda_backend.test_first_row_backend import "
        "compile_linear_ahead as f, fma_in_q2 as g; "
        "print(json.dumps([g(), f(json.loads(sys.argv[1]))]))"
    )
    n_fma, out = run_ahead_of_time(code, cases)
    assert n_fma == 0, "act_mul's or q1 * s1's multiply contracted with the residual's subtract"
    for c, o in zip(cases, out, strict=True):
        print(c["QUANT"], c["M"], c["N"], c["K"], o)
        assert o.get("stack", 0) == 0 and o["shared"] <= 227 * 1024, (c, o)
