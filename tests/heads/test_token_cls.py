"""Token classification against transformers (logits) and its TokenClassificationPipeline
(entities: entity_group / score / word / start / end into the original text)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from tests.conftest import real_sentences
from tests.fixtures import supported_isas
from tests.heads.helpers import close, hf_logits, hf_tokenizer, max_len

import zoi

TEXTS = [
    "John Smith lives in New York and works for Acme Corporation.",
    "Ünïcödé names like Zürich, São Paulo and Kraków are unbelievably tokenised.",
    "a",
    "   leading spaces, then words",
    "The quick brown fox " * 8,
] + real_sentences(6)


@pytest.mark.parametrize("device", ["reference", "cpu"])
@pytest.mark.parametrize("arch", ["bert", "roberta", "distilbert"])
def test_token_logits_match_transformers(head_ckpts, arch, device):
    folder, model = head_ckpts(arch, "tok", 7)
    eng = zoi.compile(folder, device=device)
    assert eng.head == "token_cls" and eng.labels[0] == "O"
    got = eng.predict_tokens(TEXTS)
    ref = hf_logits(model, hf_tokenizer(folder, max_len(model)), TEXTS)
    assert len(got) == len(ref)
    for g, r in zip(got, ref, strict=True):
        close(g, r)
    assert eng.predict_tokens("a").shape == (3, 7)


@pytest.mark.parametrize("strategy", ["simple", "first", "max", "average", "none"])
def test_entities_match_the_pipeline(head_ckpts, strategy):
    from transformers import AutoTokenizer, pipeline

    folder, model = head_ckpts("bert", "tok", 7)
    tok = AutoTokenizer.from_pretrained(str(folder), model_max_length=max_len(model))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pipe = pipeline(
            "token-classification",
            model=model,
            tokenizer=tok,
            aggregation_strategy=strategy,
            device="cpu",
        )
        refs = [pipe(t) for t in TEXTS[:4] + TEXTS[5:]]
    eng = zoi.compile(folder, device="cpu")
    gots = eng.ner(TEXTS[:4] + TEXTS[5:], aggregation_strategy=strategy)
    n = 0
    for got, ref in zip(gots, refs, strict=True):
        assert len(got) == len(ref)
        for g, r in zip(got, ref, strict=True):
            key = "entity_group" if strategy != "none" else "entity"
            assert g[key] == r[key]
            assert (g["word"], g["start"], g["end"]) == (r["word"], r["start"], r["end"])
            assert abs(g["score"] - float(r["score"])) < 1e-5
            n += 1
    assert n > 5  # the random model tags something
    one = eng.ner(TEXTS[0], aggregation_strategy=strategy)
    assert one == gots[0] or all(
        a["start"] == b["start"] for a, b in zip(one, gots[0], strict=True)
    )


def test_offsets_point_into_the_text(head_ckpts):
    folder, _ = head_ckpts("bert", "tok", 7)
    eng = zoi.compile(folder, device="cpu")
    for text, ents in zip(TEXTS, eng.ner(TEXTS, aggregation_strategy="first"), strict=True):
        for e in ents:
            assert 0 <= e["start"] < e["end"] <= len(text)


def test_every_isa_and_int8(head_ckpts):
    from zoi.backends.cpu import CpuBackend

    folder, _ = head_ckpts("bert", "tok", 7)
    f32 = zoi.compile(folder, device="cpu")
    ref = np.concatenate(zoi.Engine(f32.model, f32.tokenizer, "reference").predict_tokens(TEXTS))
    for isa in supported_isas():
        f32.backend = CpuBackend(f32.model, isa=isa)
        close(np.concatenate(f32.predict_tokens(TEXTS)), ref)
    q = zoi.compile(folder, device="cpu", precision="int8")
    got = np.concatenate(q.predict_tokens(TEXTS))
    assert (got.argmax(1) == ref.argmax(1)).mean() > 0.9
    # batched == one at a time
    one = np.concatenate([q.predict_tokens(t) for t in TEXTS])
    np.testing.assert_allclose(
        np.concatenate(q.predict_tokens(TEXTS, batch_size=2)), one, rtol=1e-5, atol=1e-6
    )


def test_artifact_and_bad_strategy(head_ckpts, tmp_path):
    folder, _ = head_ckpts("bert", "tok", 7)
    eng = zoi.compile(folder, device="cpu")
    eng.save(tmp_path / "a")
    back = zoi.load(tmp_path / "a")
    assert back.ner(TEXTS[0]) == eng.ner(TEXTS[0])
    with pytest.raises(ValueError, match="aggregation_strategy"):
        eng.ner("x", aggregation_strategy="longest")
