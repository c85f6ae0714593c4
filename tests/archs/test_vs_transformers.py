"""MPNet, ModernBERT, Electra, ALBERT against transformers: the reference per token, the CPU
engine on every ISA (FP32), INT8 against FP32, batched == one at a time, save / load."""

from __future__ import annotations

import numpy as np
import pytest
from tests.archs.helpers import ARCHS, TEXTS, checkpoint, cosine, hf_hidden
from tests.fixtures import supported_isas

import zoi
from zoi.backends.reference import run_graph
from zoi.frontend.tokenizer import pack


@pytest.fixture(scope="module", params=ARCHS)
def arch_ckpt(request, arch_ckpts):
    arch = request.param
    model, folder = arch_ckpts(arch, seed=ARCHS.index(arch))
    return arch, model, folder


def test_reference_matches_transformers_per_token(arch_ckpt):
    arch, model, folder = arch_ckpt
    eng = zoi.compile(folder, device="reference", max_tokens=512)
    assert eng.spec.arch == arch
    seqs = eng.tokenize(TEXTS)
    assert max(len(s) for s in seqs) > 2 * 8 + 1  # longer than ModernBERT's local window
    ids, pos, cu = pack(seqs, eng.spec.position_offset)
    env = run_graph(eng.model, ids, pos, cu)  # all texts in one packed batch
    last = env[eng.model.graph.ops[-1].inputs[0]]
    for s, seq in enumerate(seqs):
        ref = hf_hidden(model, seq)
        got = last[cu[s] : cu[s + 1]]
        assert np.isfinite(got).all()
        np.testing.assert_allclose(got, ref, atol=1e-4, rtol=0)
    pooled = eng.encode(TEXTS, normalize_embeddings=False)
    want = np.stack([hf_hidden(model, s).mean(0) for s in seqs])
    assert cosine(pooled, want).min() >= 0.99999


@pytest.mark.parametrize("isa", supported_isas())
def test_cpu_fp32_every_isa(arch_ckpt, isa, monkeypatch):
    arch, model, folder = arch_ckpt
    monkeypatch.setenv("ZOI_CPU_ISA", isa)
    eng = zoi.compile(folder, device="cpu", max_tokens=512)
    assert eng.backend.isa == isa
    got = eng.encode(TEXTS, normalize_embeddings=False)
    want = np.stack([hf_hidden(model, s).mean(0) for s in eng.tokenize(TEXTS)])
    assert np.isfinite(got).all()
    assert cosine(got, want).min() >= 0.99999
    one = np.stack([eng.encode([t], normalize_embeddings=False)[0] for t in TEXTS])
    np.testing.assert_allclose(one, got, atol=2e-6, rtol=0)  # batched == one at a time


def test_int8_tracks_fp32_and_round_trips(arch_ckpt, tmp_path):
    from tests.conftest import real_sentences

    arch, model, folder = arch_ckpt
    texts = real_sentences(40) + TEXTS
    f32 = zoi.compile(folder, device="cpu", max_tokens=512).encode(texts)
    eng = zoi.compile(folder, device="cpu", precision="int8", max_tokens=512)
    q = eng.encode(texts)
    assert np.isfinite(q).all()
    assert cosine(q, f32).min() > 0.99  # tests/quant/test_archs.py's bound
    assert any(k.startswith("int8") for k in eng.backend.linear_kinds.values())
    back = zoi.load(eng.save(tmp_path / "art"), device="cpu")
    assert back.spec == eng.spec
    np.testing.assert_array_equal(back.encode(texts), q)
    ref = zoi.load(tmp_path / "art", device="reference").encode(texts)
    assert cosine(ref, q).min() > 0.9999  # the emulation the kernels reproduce


def test_graph_shapes(arch_ckpt):
    arch, _, folder = arch_ckpt
    eng = zoi.compile(folder, device="reference", max_tokens=512)
    g = eng.model.graph
    kinds = {o.kind for o in g.ops}
    att = [o for o in g.ops if o.kind == "attention"]
    if arch == "modernbert":
        assert "glu" in kinds and "rope.g.cos" in eng.model.weights
        windows = [o.attrs.get("window", 0) for o in att]
        assert windows == [0, 8, 8, 0]  # global every 3rd layer from 0, local_attention 16 // 2
        assert "embed.pos" not in eng.model.weights
    if arch == "mpnet":
        assert all(o.weights == {"rel_bias": "rel_bias"} for o in att)
        assert eng.spec.position_offset == 2
    if arch in ("electra", "albert"):
        assert eng.spec.embed_size == 24 and "embed.proj.w" in eng.model.weights
        assert g.buffers["x0"].cols == 24


def test_modernbert_cls_pooling_from_config(tmp_path):
    """No sentence-transformers folder: ModernBERT pools as sentence-transformers would (mean);
    pooling="cls" (its classifier_pooling) is an explicit choice."""
    model, folder = checkpoint("modernbert", tmp_path / "m", seed=7, pooling=None)
    assert zoi.compile(folder, device="reference", max_tokens=512).spec.pooling == "mean"
    eng = zoi.compile(folder, device="cpu", max_tokens=512, pooling="cls")
    assert eng.spec.pooling == "cls"
    got = eng.encode(TEXTS[:3], normalize_embeddings=False)
    want = np.stack([hf_hidden(model, s)[0] for s in eng.tokenize(TEXTS[:3])])
    assert cosine(got, want).min() >= 0.99999


def test_modernbert_biases_and_all_global(tmp_path):
    """norm_bias / attention_bias / mlp_bias true, every layer global, another RoPE base."""
    model, folder = checkpoint(
        "modernbert",
        tmp_path / "b",
        seed=3,
        norm_bias=True,
        attention_bias=True,
        mlp_bias=True,
        global_attn_every_n_layers=1,
        global_rope_theta=5000.0,
    )
    eng = zoi.compile(folder, device="cpu", max_tokens=512)
    assert eng.spec.global_every == 1 and eng.spec.rope_theta == 5000.0
    assert np.abs(eng.model.weights["l1.qkv.b"]).max() > 0
    got = eng.encode(TEXTS, normalize_embeddings=False)
    want = np.stack([hf_hidden(model, s).mean(0) for s in eng.tokenize(TEXTS)])
    assert cosine(got, want).min() >= 0.99999


def test_electra_without_projection(tmp_path):
    model, folder = checkpoint("electra", tmp_path / "e", seed=5, embedding_size=40)
    eng = zoi.compile(folder, device="cpu", max_tokens=512)
    assert eng.spec.embed_size == 0 and "embed.proj.w" not in eng.model.weights
    got = eng.encode(TEXTS, normalize_embeddings=False)
    want = np.stack([hf_hidden(model, s).mean(0) for s in eng.tokenize(TEXTS)])
    assert cosine(got, want).min() >= 0.99999


def test_sequence_longer_than_the_tables_is_refused(arch_ckpt):
    arch, _, folder = arch_ckpt
    if arch not in ("mpnet", "modernbert"):
        pytest.skip("only the tables of MPNet / ModernBERT bound the attention")
    eng = zoi.compile(folder, device="cpu", max_tokens=1024)
    P = eng.spec.max_positions
    ids = np.full(P + 1, 5, np.int32)
    with pytest.raises(Exception, match="position|longer"):
        eng.backend.run(ids, np.zeros(P + 1, np.int32), np.array([0, P + 1], np.int32), False)
