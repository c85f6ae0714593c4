"""encode(output_value="token_embeddings") on an INT8 CPU engine, every ISA: the last hidden
state is read back although the planner gave its arena slot to a GEMM output that never reaches
the arena (a fused quantise); a tap on such an output itself is refused by name."""

from __future__ import annotations

import numpy as np
import pytest
from tests.fixtures import supported_isas

import zoi
from zoi.backends.cpu import CpuBackend

TEXTS = ["hello world", "a longer sentence, with punctuation and more words in it", "x"]


@pytest.fixture(scope="module")
def engines():
    # the "fast" calibration budget: the same fused-quantise plan in half the compile time (the
    # default budget's accuracy is tests/quant/test_minilm_int8.py's)
    return zoi.compile(precision="int8", calibration="fast"), zoi.compile()


@pytest.mark.parametrize("isa", supported_isas())
def test_int8_token_states_on_every_isa(engines, isa):
    i8, f32 = engines
    i8.backend = CpuBackend(i8.model, isa=isa)
    got = i8.encode(TEXTS, output_value="token_embeddings")
    want = f32.encode(TEXTS, output_value="token_embeddings")
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and np.isfinite(g).all()
        cos = (g * w).sum(1) / np.linalg.norm(g, axis=1) / np.linalg.norm(w, axis=1)
        assert cos.min() >= 0.99, cos.min()
    # the same rows as the sentence embedding the engine pools from them (mean, normalised)
    pooled = np.stack([g.mean(0) / np.linalg.norm(g.mean(0)) for g in got])
    np.testing.assert_allclose(pooled, i8.encode(TEXTS), atol=2e-5)


def test_a_tap_on_a_fused_quantise_output_is_refused(engines):
    i8, _ = engines
    fused = [op.output for op in i8.model.graph.ops if op.attrs.get("quant_out_only")]
    assert fused, "the INT8 MiniLM plan fuses its quantise steps into GEMMs"
    b = CpuBackend(i8.model)
    ids, pos, cu = i8.tokenizer.encode_packed(TEXTS)
    with pytest.raises(
        ValueError, match=r"only quantises it.*FusionPolicy\(quant_out_only=False\)"
    ):
        b.run_outputs(ids, pos, cu, taps=(fused[0],))
