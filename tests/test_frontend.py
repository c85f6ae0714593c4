"""Each architecture loads and matches transformers' own forward (max abs error <= 1e-4, float32)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import zoi
from conftest import ARCH_CONFIGS, build_hf_model, save_checkpoint
from zoi.backends.reference import run_graph
from zoi.frontend import load_checkpoint
from zoi.frontend.tokenizer import pack

TEXTS = [
    "Hello world!",
    "",
    "a b c d e f g h i j k l m n o p q r s t u v w x y z " * 4,
    "The quick brown fox.",
]


def hf_hidden(model, ids: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        x = torch.from_numpy(ids.astype(np.int64))[None]
        return model(input_ids=x, attention_mask=torch.ones_like(x)).last_hidden_state[0].numpy()


@pytest.mark.parametrize("arch", list(ARCH_CONFIGS))
@pytest.mark.parametrize("variant", ["f32", "f16", "bf16", "sharded"])
def test_architecture_matches_transformers(arch, variant, tmp_path):
    model = build_hf_model(arch, seed=hash((arch, variant)) % 1000)
    dtype = {"f16": torch.float16, "bf16": torch.bfloat16}.get(variant)
    folder = save_checkpoint(
        model, tmp_path / arch, dtype=dtype, max_shard_size="50KB" if variant == "sharded" else None
    )
    if variant == "sharded":
        assert (folder / "model.safetensors.index.json").exists()
    if dtype is not None:  # compare against the model holding the same rounded weights
        model = model.to(dtype).to(torch.float32)
    eng = zoi.compile(folder, device="reference", max_tokens=256)
    seqs = eng.tokenize(TEXTS)
    ids, pos, cu = pack(seqs, eng.spec.position_offset)
    env = run_graph(eng.model, ids, pos, cu)
    last = env[eng.model.graph.ops[-1].inputs[0]]
    for s, seq in enumerate(seqs):
        ref = hf_hidden(model, seq)
        got = last[cu[s] : cu[s + 1]]
        assert np.isfinite(got).all()
        np.testing.assert_allclose(got, ref, atol=1e-4, rtol=0)
    pooled = eng.encode(TEXTS, normalize_embeddings=False)
    for s, seq in enumerate(seqs):
        np.testing.assert_allclose(pooled[s], hf_hidden(model, seq).mean(0), atol=1e-4, rtol=0)


def test_roberta_position_offset(tmp_path):
    folder = save_checkpoint(build_hf_model("roberta"), tmp_path / "r")
    spec, w, _ = load_checkpoint(folder)
    assert (
        spec.position_offset == 2
        and spec.max_positions == ARCH_CONFIGS["roberta"]["max_position_embeddings"] - 2
    )
    assert spec.arch == "roberta" and "embed.type" in w
    eng = zoi.compile(folder, device="reference")
    ids = eng.tokenize(["x " * 500])[0]
    assert len(ids) == spec.max_positions  # truncated to what the position table can hold


def test_distilbert_has_no_token_types(tmp_path):
    spec, w, _ = load_checkpoint(save_checkpoint(build_hf_model("distilbert"), tmp_path / "d"))
    assert spec.arch == "distilbert" and spec.type_vocab_size == 0 and "embed.type" not in w


@pytest.mark.parametrize("pooling", ["mean", "cls", "max"])
def test_sentence_transformers_pooling(pooling, tmp_path):
    model = build_hf_model("bert", seed=3)
    folder = save_checkpoint(model, tmp_path / pooling, pooling=pooling, normalize=pooling == "cls")
    eng = zoi.compile(folder, device="reference")
    assert eng.spec.pooling == pooling and eng.spec.normalize == (pooling == "cls")
    texts = ["some words here", "x"]
    got = eng.encode(texts)
    for i, seq in enumerate(eng.tokenize(texts)):
        h = hf_hidden(model, seq)
        ref = {"mean": h.mean(0), "cls": h[0], "max": h.max(0)}[pooling]
        if pooling == "cls":
            ref = ref / np.linalg.norm(ref)
        np.testing.assert_allclose(got[i], ref, atol=1e-4, rtol=0)
