"""One plan: the CUDA plan and the CPU engine built from the same model read the
same IR decisions (zoi.graph.fusion): the same int8 copy names for every INT8 linear, and the
same writer wherever both backends realise it; where one does not, its plan says why."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from tests import triton_mode  # noqa: E402
from tests.cuda_backend.cuda_helpers import MIXED, tiny_model  # noqa: E402

from zoi.graph import fusion  # noqa: E402

COMPILED = not triton_mode.interpreted()
pytestmark = pytest.mark.skipif(
    COMPILED and not torch.cuda.is_available(), reason="compiled Triton needs a CUDA GPU"
)

CASES = {
    "dynamic": dict(),
    "asym": dict(default="dynamic_asym", transforms={"l0.ffn2": "mul"}),
    "mixed": MIXED,
}


def _cuda(model, **opts):
    from zoi.backends.cuda.backend import CudaBackend
    from zoi.backends.cuda.options import CudaOptions

    return CudaBackend(
        model,
        interpret=None if COMPILED else True,
        options=CudaOptions(**opts),
        buckets=[16, 64],
        fuse_min_tokens=64,
    )


@pytest.mark.parametrize("rowq", [False, True])
@pytest.mark.parametrize("case", list(CASES))
def test_cuda_and_cpu_plans_agree_with_the_ir(case, rowq):
    pytest.importorskip("zoi._cpu")
    from zoi.backends.cpu import CpuBackend
    from zoi.backends.cuda.plan import describe

    model = tiny_model("int8", max_tokens=64, **CASES[case])
    gpu = _cuda(model, rowq=rowq)
    cpu = CpuBackend(model, nthreads=1)
    g = model.graph
    for tb in gpu.buckets:
        ir = fusion.decisions(g, tb)
        cu = describe(gpu.plan_for(tb))
        # the same copies, in the same order, on both backends and in the IR
        assert [c for _, c, _ in cu] == [c for _, c, _ in ir] == [c for _, c, _ in cpu.describe(tb)]
        plan = gpu.plan_for(tb)
        for (p, c, want), (_, _, got) in zip(ir, cu, strict=True):
            if want in ("embed", "add_layernorm"):  # whole-row epilogues: every backend writes
                assert got == want
            elif got != want:  # a fallback or another threshold, and the plan says so
                assert c in plan["fallbacks"] or c in plan["notes"], (p, c, want, got)
    # where the IR asks ffn1 to write ffn2's copy, the GPU's ROWQ does it when switched on
    for (p, c, want), (_, _, got) in zip(
        fusion.decisions(g, 4096), describe(gpu.plans[True]), strict=True
    ):
        if want == "linear":
            fb = gpu.plans[True]["fallbacks"].get(c, "")
            if rowq:
                assert got == "linear" or "ROWQ needs" in fb, (p, got, fb)
            else:
                assert got in ("loop", "quantize") and "ROWQ off" in fb, (p, got, fb)


def test_cuda_records_declined_ln_fusion():
    model = tiny_model("fp16", max_tokens=64)
    be = _cuda(model)  # fuse_ln off by default: every IR LN fusion is a recorded fallback
    ln = {o.attrs["fuse_ln"] for o in model.graph.linears() if o.attrs.get("fuse_ln")}
    assert ln and set(be.plans[True]["fallbacks"]) == ln
    assert all("fuse_ln off" in r for r in be.plans[True]["fallbacks"].values())
    be2 = _cuda(model, fuse_ln=True)
    assert not be2.plans[True]["fallbacks"]
    assert sum(la.ln is not None for la in be2.plans[True]["launches"]) == len(ln)
