"""Cross-encoders on device="cuda" (zoi.heads.hybrid): the encoder on the CUDA backend, the
head's B rows on the host; token types through the per-type word rows."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("triton")
pytest.importorskip("transformers")  # the random checkpoints

from tests import triton_mode  # noqa: E402
from tests.conftest import compile_int8_for_kernels, int8_features  # noqa: E402
from tests.heads.builders import PAIRS  # noqa: E402
from tests.heads.helpers import hf_logits, hf_tokenizer, max_len  # noqa: E402

import zoi  # noqa: E402
from zoi.heads.hybrid import HybridHeadRunner, body_model  # noqa: E402

if not triton_mode.interpreted():
    CASES, MAX_BATCH = PAIRS[:5], None  # 149 tokens: bucket 256
else:  # the interpreter's cost is its programs: 60 tokens (bucket 64), max_batch 8 (attention)
    CASES, MAX_BATCH = [PAIRS[i] for i in (0, 1, 2, 5)], 8


def _cuda(model, tok):
    return zoi.Engine(model, tok, "cuda")


def test_body_word_rows_carry_the_types(head_ckpts):
    folder, _ = head_ckpts("bert", "seq", 3)
    ref = zoi.compile(folder, device="reference")
    body = body_model(ref.model)
    V, W = ref.spec.vocab_size, ref.model.weights
    assert body.spec.vocab_size == 2 * V and body.spec.pooling == "cls" and not body.spec.head
    np.testing.assert_allclose(
        body.weights["embed.word"][V + 7],
        W["embed.word"][7] + W["embed.type"][1] - W["embed.type"][0],
        atol=1e-7,
    )


# FP16 in the slow tier (~9 s in the interpreter): the hybrid runner (body on cuda, head on the
# host) is the same at either precision and runs here in INT8; FP16 bodies on cuda run in
# test_heads_gpu.py (SPLADE, token embeddings)
@pytest.mark.parametrize("precision", [pytest.param("fp16", marks=pytest.mark.slow), "int8"])
def test_cross_encoder_on_cuda(head_ckpts, precision):
    folder, model = head_ckpts("bert", "seq", 3)
    size = dict(max_tokens=256, max_batch=MAX_BATCH)
    if precision == "int8":  # zoi.quant's, small calibration (tests.conftest)
        base = compile_int8_for_kernels(folder, **size)
        assert {"dynamic_asym", "act_mul"} <= int8_features(base.model)
    else:
        base = zoi.compile(folder, device="reference", **size)
        base.model = dataclasses.replace(base.model, precision="fp16")
    eng = _cuda(base.model, base.tokenizer)
    assert isinstance(eng.backend, HybridHeadRunner) and eng.backend.name == "cuda"
    pairs = CASES
    got = eng.predict(pairs, activation_fn="identity")
    ref = zoi.Engine(base.model, base.tokenizer, "reference").predict(
        pairs, activation_fn="identity"
    )
    hf = np.stack(hf_logits(model, hf_tokenizer(folder, max_len(model)), pairs))
    scale = np.abs(hf).max()
    assert np.isfinite(got).all()
    assert np.abs(got - ref).max() < 0.03 * scale, (got, ref)
    assert np.abs(got - hf).max() < 0.05 * scale
    assert eng.memory()["head_bytes"] > 0
