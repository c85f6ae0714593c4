"""Electra / ALBERT (narrower embeddings + a projection) on the CUDA backend, FP16 and INT8,
against the reference engine (Triton interpreter on the CPU, compiled on a GPU:
scripts/gpu_check.sh). MPNet / ModernBERT are refused there (tests/archs/test_refusals.py)."""

from __future__ import annotations

import numpy as np
import pytest
from tests.archs.helpers import TEXTS, checkpoint, cosine

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from tests import triton_mode  # noqa: E402

import zoi  # noqa: E402
from zoi.backends.reference import ReferenceBackend  # noqa: E402
from zoi.frontend.tokenizer import pack  # noqa: E402
from zoi.graph.compiled import CompiledModel  # noqa: E402

pytestmark = pytest.mark.skipif(
    not triton_mode.interpreted() and not torch.cuda.is_available(),
    reason="compiled Triton needs a CUDA GPU",
)


@pytest.mark.parametrize("arch", ["electra", "albert"])
@pytest.mark.parametrize("precision", ["fp16", "int8"])
def test_projected_embeddings_on_cuda(arch, precision, tmp_path):
    from zoi.backends.cuda import CudaBackend

    _, folder = checkpoint(arch, tmp_path / arch, seed=11)
    if precision == "int8":
        model = zoi.compile(folder, device="cpu", precision="int8", max_tokens=512).model
    else:
        ref_eng = zoi.compile(folder, device="reference", max_tokens=512)
        model = CompiledModel.build(ref_eng.spec, ref_eng.model.weights, "fp16", 512, 64)
    eng = zoi.compile(folder, device="reference", max_tokens=512)
    ids, pos, cu = pack(eng.tokenize(TEXTS), eng.spec.position_offset)
    want = ReferenceBackend(model).run(ids, pos, cu, True)  # INT8: the emulation
    got = CudaBackend(model).run(ids, pos, cu, True)
    assert np.isfinite(got).all()
    assert cosine(got, want).min() > 0.999
