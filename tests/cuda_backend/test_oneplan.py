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
    )


@pytest.mark.parametrize("case", list(CASES))
def test_cuda_and_cpu_plans_agree_with_the_ir(case):
    pytest.importorskip("zoi._cpu")
    from zoi.backends.cpu import CpuBackend
    from zoi.backends.cuda.plan import describe

    model = tiny_model("int8", max_tokens=64, **CASES[case])
    gpu = _cuda(model)
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
            elif got != want:  # a fallback, and the plan says so
                assert c in plan["fallbacks"], (p, c, want, got)
    # where the IR asks ffn1 to write ffn2's copy, the GPU makes it at the consumer (a linear
    # tile sees part of a row) and says so
    asked = 0
    for (p, c, want), (_, _, got) in zip(
        fusion.decisions(g, 4096), describe(gpu.plan), strict=True
    ):
        if want == "linear":
            asked += 1
            fb = gpu.plan["fallbacks"].get(c, "")
            assert got in ("loop", "quantize") and "writes no int8 copy" in fb, (p, got, fb)
    assert asked, "no copy the IR gives a linear to write: the check above checked nothing"
