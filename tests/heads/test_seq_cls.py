"""Cross-encoders / sequence classifiers against transformers and sentence-transformers."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
from tests.conftest import real_sentences, save_checkpoint
from tests.fixtures import supported_isas
from tests.heads.builders import PAIRS, build_head_model, head_checkpoint
from tests.heads.helpers import close, hf_logits, hf_tokenizer, max_len, spearman

import zoi
from zoi.errors import HeadError, NumericalError, UnsupportedModelError

ARCHS = ("bert", "roberta", "xlm-roberta", "distilbert")


def _pairs(n=24, seed=0):
    s = real_sentences()
    r = np.random.default_rng(seed)
    out = list(PAIRS)
    for _ in range(n):
        a, b = r.integers(0, len(s), 2)
        out.append((s[a], " ".join(s[b : b + int(r.integers(1, 4))])))
    return out


@pytest.mark.parametrize("device", ["reference", "cpu"])
@pytest.mark.parametrize("labels", [1, 3])
@pytest.mark.parametrize("arch", ARCHS)
def test_logits_match_transformers(head_ckpts, arch, labels, device):
    folder, model = head_ckpts(arch, "seq", labels)
    pairs = _pairs()
    eng = zoi.compile(folder, device=device, max_tokens=300)
    assert eng.head == "seq_cls" and len(eng.labels) == labels
    got = eng.predict(pairs, activation_fn="identity")
    ref = np.stack(hf_logits(model, hf_tokenizer(folder, max_len(model)), pairs))
    close(got.reshape(ref.shape), ref)
    # single texts classify alone (types 0)
    texts = [p[1] for p in pairs[:6]]
    close(
        eng.predict(texts, activation_fn="identity").reshape(6, labels),
        np.stack(hf_logits(model, hf_tokenizer(folder, max_len(model)), texts)),
    )


def test_cross_encoder_predict_and_rank(head_ckpts):
    from sentence_transformers import CrossEncoder

    folder, model = head_ckpts("bert", "seq", 1)
    pairs = _pairs(40, seed=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ce = CrossEncoder(str(folder), max_length=max_len(model), device="cpu")
        ref = ce.predict(pairs)
        docs = [p[1] for p in pairs]
        ref_rank = ce.rank(pairs[0][0], docs, top_k=7, return_documents=True)
    eng = zoi.compile(folder, device="cpu")
    got = eng.predict(pairs)  # default activation: sigmoid for one label, as CrossEncoder
    assert got.shape == ref.shape == (len(pairs),)
    close(got, ref)
    one = eng.predict(list(pairs[3]))
    assert np.ndim(one) == 0 and abs(float(one) - float(ref[3])) < 1e-6
    rank = eng.rerank(pairs[0][0], docs, top_k=7, return_documents=True)
    assert [r["corpus_id"] for r in rank] == [r["corpus_id"] for r in ref_rank]
    assert [r["text"] for r in rank] == [r["text"] for r in ref_rank]
    np.testing.assert_allclose(
        [r["score"] for r in rank], [r["score"] for r in ref_rank], atol=1e-6
    )
    assert set(eng.rerank("q", ["a", "b"])[0]) == {"corpus_id", "score"}
    assert eng.rerank("q", []) == []


def test_activation_options(head_ckpts):
    folder, _ = head_ckpts("bert", "seq", 3)
    eng = zoi.compile(folder, device="cpu")
    pairs = _pairs(5)
    raw = eng.predict(pairs)  # 3 labels: identity by default
    np.testing.assert_allclose(eng.predict(pairs, activation_fn="identity"), raw)
    sm = eng.predict(pairs, activation_fn="softmax")
    np.testing.assert_allclose(sm.sum(1), 1, atol=1e-6)
    np.testing.assert_allclose(
        eng.predict(pairs, activation_fn="sigmoid"), 1 / (1 + np.exp(-raw)), atol=1e-6
    )
    np.testing.assert_allclose(eng.predict(pairs, activation_fn=lambda x: 2 * x), 2 * raw)
    np.testing.assert_allclose(eng.predict(pairs, apply_softmax=True).sum(1), 1, atol=1e-6)
    with pytest.raises(ValueError, match="activation_fn"):
        eng.predict(pairs, activation_fn="tanh")
    with pytest.raises(HeadError, match="one label"):
        eng.rerank("q", ["d"])
    with pytest.raises(TypeError, match="pair"):
        eng.predict([("a", "b"), "c"])


def test_config_activation_is_the_default(tmp_path):
    folder, _ = head_checkpoint(tmp_path / "ce", "bert", "seq", 1)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["sentence_transformers"] = {"activation_fn": "torch.nn.modules.linear.Identity"}
    (folder / "config.json").write_text(json.dumps(cfg))
    eng = zoi.compile(folder, device="reference")
    raw = eng.predict(PAIRS, activation_fn="identity")
    np.testing.assert_allclose(eng.predict(PAIRS), raw)


def test_batched_equals_one_at_a_time(head_ckpts):
    folder, _ = head_ckpts("bert", "seq", 3)
    pairs = _pairs(30, seed=5)
    for precision in ("fp32", "int8"):
        eng = zoi.compile(folder, device="cpu", precision=precision, max_tokens=120)
        batched = eng.predict(pairs)  # several chunks of at most 120 tokens
        small = eng.predict(pairs, batch_size=3)
        single = np.stack([eng.predict(list(p)) for p in pairs])
        np.testing.assert_allclose(batched, single, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(small, single, rtol=1e-5, atol=1e-6)


def test_every_isa_matches_reference(head_ckpts):
    from zoi.backends.cpu import CpuBackend

    folder, _ = head_ckpts("bert", "seq", 3)
    pairs = _pairs(12, seed=7)
    for precision in ("fp32", "int8"):
        eng = zoi.compile(folder, device="cpu", precision=precision)
        ref = zoi.Engine(eng.model, eng.tokenizer, "reference").predict(pairs)
        for isa in supported_isas():
            eng.backend = CpuBackend(eng.model, isa=isa)
            assert eng.backend.isa == isa
            got = eng.predict(pairs)
            tol = 2e-5 if precision == "fp32" else 2e-3
            close(got, ref, tol)


def test_int8_agrees_with_fp32(head_ckpts):
    folder, _ = head_ckpts("bert", "seq", 1)
    pairs = _pairs(120, seed=11)
    f = zoi.compile(folder, device="cpu").predict(pairs, activation_fn="identity")
    q = zoi.compile(folder, device="cpu", precision="int8").predict(pairs, activation_fn="identity")
    assert spearman(q, f) > 0.98
    assert np.abs(q - f).max() < 0.05 * (f.max() - f.min())


def test_artifact_keeps_the_head(head_ckpts, tmp_path):
    folder, _ = head_ckpts("roberta", "seq", 3)
    for precision in ("fp32", "int8"):
        eng = zoi.compile(folder, device="cpu", precision=precision)
        ref = eng.predict(PAIRS)
        eng.save(tmp_path / precision)
        back = zoi.load(tmp_path / precision)
        assert back.head == "seq_cls" and back.labels == eng.labels
        np.testing.assert_array_equal(back.predict(PAIRS), ref)


def test_nan_never_leaves(head_ckpts):
    from zoi.backends.cpu import CpuBackend

    folder, _ = head_ckpts("bert", "seq", 3)
    eng = zoi.compile(folder, device="cpu")
    eng.model.weights["head.out.b"] = eng.model.weights["head.out.b"].copy()
    eng.model.weights["head.out.b"][1] = np.nan
    eng.backend = CpuBackend(eng.model)
    with pytest.raises(NumericalError, match="NaN"):
        eng.predict(PAIRS)


@pytest.mark.parametrize(
    "arch", ["BertForQuestionAnswering", "BertForMultipleChoice", "BertForPreTraining"]
)
def test_unsupported_heads_are_refused(tmp_path, arch):
    folder, _ = head_checkpoint(tmp_path / "m", "bert", "seq", 2)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["architectures"] = [arch]
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedModelError, match=f"architectures.*{arch}"):
        zoi.compile(folder, device="reference")


def test_missing_head_weights_named(tmp_path):
    from safetensors.numpy import load_file, save_file

    folder, _ = head_checkpoint(tmp_path / "m", "bert", "seq", 2)
    w = load_file(str(folder / "model.safetensors"))
    del w["classifier.weight"]
    save_file(w, str(folder / "model.safetensors"))
    with pytest.raises(zoi.errors.CheckpointError, match="classifier.weight"):
        zoi.compile(folder, device="reference")


def test_wrong_head_calls_name_the_head(head_ckpts, small_bert_path):
    folder, _ = head_ckpts("bert", "seq", 1)
    ce = zoi.compile(folder, device="reference")
    with pytest.raises(HeadError, match="sequence classification"):
        ce.encode_sparse(["x"])
    with pytest.raises(HeadError, match="sequence classification"):
        ce.ner("x")
    with pytest.raises(HeadError, match="use predict / rerank"):
        ce.encode(["x"])
    emb = zoi.compile(small_bert_path, device="reference")
    with pytest.raises(HeadError, match="embedding"):
        emb.predict([("a", "b")])
    with pytest.raises(HeadError, match="embedding"):
        emb.rerank("a", ["b"])


def test_labels_from_config(tmp_path):
    model = build_head_model("bert", "seq", 3)
    model.config.id2label = {0: "neg", 1: "neu", 2: "pos"}
    model.config.label2id = {"neg": 0, "neu": 1, "pos": 2}
    save_checkpoint(model, tmp_path / "m")
    assert zoi.compile(tmp_path / "m", device="reference").labels == ("neg", "neu", "pos")


def test_gpu_takes_every_head(head_ckpts):
    """Every head runs on cuda (tests/heads/cuda): seq_cls through zoi.heads.hybrid, the
    per-token heads on the CUDA backend; a device without heads would be refused by name."""
    from zoi.backends.arch_support import cuda_missing
    from zoi.errors import BackendUnavailableError
    from zoi.heads import check_head_device

    for task in ("tok", "mlm", "seq"):
        folder, _ = head_ckpts("bert", task, 3)
        eng = zoi.compile(folder, device="reference")
        check_head_device(eng.spec, "cuda")
        if task != "seq":
            assert cuda_missing(eng.model.graph) == []
    with pytest.raises(BackendUnavailableError, match="token classification.*device='tpu'"):
        check_head_device(
            zoi.compile(head_ckpts("bert", "tok", 3)[0], device="reference").spec, "tpu"
        )
