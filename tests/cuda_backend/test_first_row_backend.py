"""The first row of each sequence quantised twice (LinearQuant.first_row) on the cuda backend:
the plan's launches (the row map once, a "first_row" launch before each such INT8 linear),
every linear against zoi.numerics.reference.linear_apply with the batch's cu_seqlens on the
very fp16 input it read (and visibly apart from the single-quantisation numerics on the
first rows), and the whole CudaBackend against the ReferenceBackend. Every INT8 scheme, with
and without SmoothQuant transforms, in the unfused (quantize launches / quantise-while-loading
/ folded quantisation) and the fused plans (LN epilogues, ROWQ). Interpreter in CI (small
shapes: it is slow), compiled on the GPU."""

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
LENS = ([1], [5, 1, 9, 1], [20, 20, 3]) if not COMPILED else ([1], [5, 1, 9, 40], [2] * 64)
SIZE = dict(max_tokens=64) if not COMPILED else dict(max_tokens=512, max_batch=64)
PLAN = dict(buckets=[16, 64], fuse_min_tokens=64) if not COMPILED else dict(fuse_min_tokens=128)


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
        assert la.ln is None, "compares the linear's own output (an unfused bucket)"
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
@pytest.mark.parametrize("fold", [False, True])
def test_each_linear_matches_the_emulation(name, fold):
    model = _models()[name]()
    be = _backend(model, opts=dict(fold_quant=fold), **PLAN)
    small = be.plans[False]["launches"]
    n_fr = sum(bool(q.first_row) for q in model.quant.values())
    assert [la.kind for la in small].count("first_row") == n_fr
    assert [la.kind for la in small].count("first_row_map") == 1
    assert not any(n.endswith("#q2") for pl in be.plans.values() for n in pl["fallbacks"])
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


@pytest.mark.parametrize("name", ["mixed", "default"])
@pytest.mark.parametrize("fused", ["rowq", "ln"])
def test_backend_matches_reference(name, fused):
    """ROWQ (ffn1 writes ffn2's int8 copy) or LN epilogues (linear + LN writes the next one's)."""
    model = _models()[name]()
    opts = dict(rowq=True) if fused == "rowq" else dict(fuse_ln=True, fuse_ln_small=True)
    be = _backend(model, opts=opts, **PLAN)
    if fused == "ln":
        assert any(la.ln is not None for la in be.plans[True]["launches"])
    ref = ReferenceBackend(model, dtype=np.float64)
    rng = np.random.default_rng(5)
    for lens in LENS:
        ids, pos, cu = batch(lens, model.spec.vocab_size, rng)
        for norm in (False, True):
            got, want = be.run(ids, pos, cu, norm), ref.run(ids, pos, cu, norm)
            assert got.shape == want.shape and np.isfinite(got).all()
            assert rel(got, want) < 3e-2 and min_cosine(got, want) > 0.99, (lens, norm)
