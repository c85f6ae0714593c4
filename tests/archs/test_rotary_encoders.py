"""NomicBERT and GTE (zoi.frontend.archs_rotary: BERT's post-norm layers, RoPE, a gated MLP)
against transformers and sentence-transformers: the reference per token, the CPU engine on every
ISA (FP32) against transformers' padded batches, INT8 against FP32 and its emulation, the
folders as save_pretrained writes them (the hub's tensor names) and as transformers' modules
name them, NomicBERT's and GTE's original configs (GPT2-style keys; model_type "new" with fixed
NTK RoPE), and the variants zoi does not run refused by name. Random-init models of awkward
sizes (hidden 90 / 70, heads of 18 / 14, an explicit head_dim that does not split hidden)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from tests.archs.helpers import TEXTS, cosine, hf_hidden
from tests.fixtures import supported_isas

import zoi
from zoi.backends.reference import run_graph
from zoi.errors import CheckpointError, NumericalError, UnsupportedModelError
from zoi.frontend import load_checkpoint
from zoi.frontend.tokenizer import pack

# texts of 2 to ~110 tokens, one empty, one non-ASCII: batches pad the short ones a lot
TEXTS_R = [
    *TEXTS,
    "Ünïcödé tèxt, with punctuation; and numbers 12345 6789.",
    " ".join(f"w{i}" for i in range(40)),
]

# name -> (arch, arch_ckpts arguments): the sentence-transformers folders pool as the real
# models do (nomic-embed: mean; gte-*-v1.5 / multilingual: CLS)
VARIANTS = {
    "nomic_bert": ("nomic_bert", dict(seed=1, pooling="mean")),
    "gte": ("gte", dict(seed=2, pooling="cls")),
    # head_dim 16 x 3 heads = 48 != hidden 70 (q / k / v / o are [48, 70] / [70, 48])
    "nomic_bert-head_dim": (
        "nomic_bert",
        dict(seed=3, pooling="mean", hidden_size=70, num_attention_heads=3, head_dim=16),
    ),
    # gte-base-en-v1.5's layout: no token-type table; dynamic NTK RoPE, another base
    "gte-dynamic": (
        "gte",
        dict(
            seed=4,
            pooling="cls",
            type_vocab_size=0,
            rope_parameters={"rope_type": "dynamic", "factor": 3.0, "rope_theta": 700.0},
        ),
    ),
}


@pytest.fixture(scope="module")
def ckpt(arch_ckpts):
    def get(name):
        arch, kw = VARIANTS[name]
        return arch_ckpts(arch, **kw)

    return get


def hf_batch(model, seqs) -> list[np.ndarray]:
    """transformers' hidden states of `seqs` run as one right-padded batch (attention mask)."""
    import torch

    n = max(len(s) for s in seqs)
    ids = np.zeros((len(seqs), n), np.int64)
    mask = np.zeros_like(ids)
    for i, s in enumerate(seqs):
        ids[i, : len(s)], mask[i, : len(s)] = s, 1
    with torch.no_grad():
        out = model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask))
    h = out.last_hidden_state.numpy()
    return [h[i, : len(s)] for i, s in enumerate(seqs)]


def pooled(hidden: list[np.ndarray], mode: str) -> np.ndarray:
    return np.stack([h.mean(0) if mode == "mean" else h[0] for h in hidden])


@pytest.mark.parametrize("name", list(VARIANTS))
def test_reference_matches_transformers_per_token(name, ckpt):
    model, folder = ckpt(name)
    eng = zoi.compile(folder, device="reference", max_tokens=512)
    assert eng.spec.arch == VARIANTS[name][0]
    seqs = eng.tokenize(TEXTS_R)
    ids, pos, cu = pack(seqs, eng.spec.position_offset)
    env = run_graph(eng.model, ids, pos, cu)  # all texts in one packed batch
    last = env[[o for o in eng.model.graph.ops if o.kind == "pool"][0].inputs[0]]
    for s, seq in enumerate(seqs):
        got = last[cu[s] : cu[s + 1]]
        assert np.isfinite(got).all()
        np.testing.assert_allclose(got, hf_hidden(model, seq), atol=1e-4, rtol=0)
    got = eng.encode(TEXTS_R, normalize_embeddings=False)
    want = pooled(hf_batch(model, seqs), eng.spec.pooling)
    assert cosine(got, want).min() >= 0.99999


@pytest.mark.parametrize("isa", supported_isas())
@pytest.mark.parametrize("name", list(VARIANTS))
def test_cpu_fp32_every_isa(name, isa, ckpt, monkeypatch):
    model, folder = ckpt(name)
    monkeypatch.setenv("ZOI_CPU_ISA", isa)
    eng = zoi.compile(folder, device="cpu", max_tokens=512)
    assert eng.backend.isa == isa
    got = eng.encode(TEXTS_R, normalize_embeddings=False)
    assert np.isfinite(got).all()
    want = pooled(hf_batch(model, eng.tokenize(TEXTS_R)), eng.spec.pooling)
    assert cosine(got, want).min() >= 0.99999
    one = np.stack([eng.encode([t], normalize_embeddings=False)[0] for t in TEXTS_R])
    np.testing.assert_allclose(one, got, atol=2e-6, rtol=0)  # batched == one at a time


def _st_encode(folder, texts, **kw):
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(folder), device="cpu")
    return st.encode(texts, convert_to_numpy=True, normalize_embeddings=False, **kw)


def test_nomic_prompts_and_truncation_match_sentence_transformers(ckpt, tmp_path):
    """nomic-embed's folder: mean pooling, the search_query / search_document prompts of
    config_sentence_transformers.json, a max_seq_length shorter than some texts."""
    _, src = ckpt("nomic_bert")
    folder = tmp_path / "nomic-st"
    shutil.copytree(src, folder)
    prompts = {"query": "search_query: ", "document": "search_document: "}
    (folder / "config_sentence_transformers.json").write_text(
        json.dumps({"prompts": prompts, "default_prompt_name": None})
    )
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 24}))
    eng = zoi.compile(folder, device="cpu", max_tokens=512)
    assert eng.spec.max_positions == 24 and eng.prompts == prompts
    texts = [t for t in TEXTS_R if t]
    assert max(len(s) for s in eng.tokenize(texts)) == 24  # some texts cut
    for name in ("query", "document"):
        got = eng.encode(texts, prompt_name=name, normalize_embeddings=False)
        want = _st_encode(folder, texts, prompt_name=name)
        assert np.isfinite(got).all()
        assert cosine(got, want).min() >= 0.99999
    plain = eng.encode(texts, normalize_embeddings=False)
    assert cosine(plain, got).min() < 0.9999  # the prompt is not silently dropped


def test_gte_cls_pooling_matches_sentence_transformers(ckpt):
    _, folder = ckpt("gte")
    eng = zoi.compile(folder, device="cpu", max_tokens=512)
    assert eng.spec.pooling == "cls" and eng.spec.type_vocab_size == 2
    texts = [t for t in TEXTS_R if t]
    got = eng.encode(texts, normalize_embeddings=False)
    assert cosine(got, _st_encode(folder, texts)).min() >= 0.99999


@pytest.mark.parametrize("name", ["nomic_bert", "gte"])
def test_int8_tracks_fp32_saves_and_loads(name, ckpt, tmp_path):
    from tests.conftest import real_sentences

    _, folder = ckpt(name)
    texts = real_sentences(40) + TEXTS_R
    f32 = zoi.compile(folder, device="cpu", max_tokens=512).encode(texts)
    eng = zoi.compile(folder, device="cpu", precision="int8", max_tokens=512)
    q = eng.encode(texts)
    assert np.isfinite(q).all()
    assert cosine(q, f32).min() > 0.99  # tests/archs/test_vs_transformers.py's bound
    assert any(k.startswith("int8") for k in eng.backend.linear_kinds.values())
    back = zoi.load(eng.save(tmp_path / "art"), device="cpu")
    assert back.spec == eng.spec
    np.testing.assert_array_equal(back.encode(texts), q)
    emu = zoi.load(tmp_path / "art", device="reference").encode(texts)
    assert cosine(emu, q).min() > 0.9999  # the emulation the kernels reproduce


# ---- namings and original configs ----------------------------------------------------------
def _module_names(src, dst, arch: str):
    """The folder with transformers' module names (a bare state_dict) instead of the hub's
    names save_pretrained writes; transformers loads both (conversion_mapping.py)."""
    from safetensors.numpy import load_file, save_file

    shutil.copytree(src, dst)
    w = load_file(str(dst / "model.safetensors"))
    out = {}
    nomic = arch == "nomic_bert"
    for k, v in w.items():
        k = k.replace("emb_ln.", "embeddings.LayerNorm.")
        k = k.replace("encoder.layers." if nomic else "encoder.layer.", "layers.")
        for a, b in (("norm1", "post_attention_layernorm"), ("norm2", "post_mlp_layernorm"),
                     ("attn_ln", "post_attention_layernorm"), ("mlp_ln", "post_mlp_layernorm"),
                     ("attn.out_proj", "self_attn.o_proj"), ("attention.o_proj", "self_attn.o_proj"),
                     ("mlp.fc11", "mlp.up_proj"), ("mlp.fc12", "mlp.gate_proj"),
                     ("mlp.fc2", "mlp.down_proj")):  # fmt: skip
            k = k.replace(a, b)
        if "Wqkv" in k or "qkv_proj" in k:  # [q; k; v]
            k = k.replace("attn.Wqkv", "self_attn.qkv").replace(
                "attention.qkv_proj", "self_attn.qkv"
            )
            for x, part in zip("qkv", np.split(v, 3), strict=True):
                out[k.replace("self_attn.qkv", f"self_attn.{x}_proj")] = part
        elif "up_gate_proj" in k:  # [up; gate]
            up, gate = np.split(v, 2)
            out[k.replace("up_gate_proj", "up_proj")] = up
            out[k.replace("up_gate_proj", "gate_proj")] = gate
        else:
            out[k] = v
    assert not any(k.startswith("encoder.") for k in out)
    save_file(out, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


@pytest.mark.parametrize("name", ["nomic_bert", "gte"])
def test_module_names_load_as_transformers_loads_them(name, ckpt, tmp_path):
    import transformers as tf

    model, src = ckpt(name)
    folder = _module_names(src, tmp_path / "mod", VARIANTS[name][0])
    cls = {"nomic_bert": tf.NomicBertModel, "gte": tf.GteModel}[VARIANTS[name][0]]
    again = cls.from_pretrained(str(folder)).eval()
    seqs = zoi.compile(src, device="reference", max_tokens=512).tokenize(TEXTS_R[:4])
    for s in seqs:  # transformers reads the renamed folder as the one it saved
        np.testing.assert_array_equal(hf_hidden(again, s), hf_hidden(model, s))
    want = zoi.compile(src, device="cpu", max_tokens=512).encode(TEXTS_R)
    got = zoi.compile(folder, device="cpu", max_tokens=512).encode(TEXTS_R)
    np.testing.assert_array_equal(got, want)


def _edit(folder, drop=(), **kw):
    cfg = json.loads((folder / "config.json").read_text())
    for k in drop:
        cfg.pop(k, None)
    cfg.update(kw)
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def _nomic_original_config(folder, **extra):
    """nomic-ai's own config.json (configuration_hf_nomic_bert: a GPT2Config) of the model."""
    cfg = json.loads((folder / "config.json").read_text())
    orig = {
        "model_type": "nomic_bert",
        "architectures": ["NomicBertModel"],
        "activation_function": "swiglu",
        "n_embd": cfg["hidden_size"],
        "n_head": cfg["num_attention_heads"],
        "n_layer": cfg["num_hidden_layers"],
        "n_inner": cfg["intermediate_size"],
        "n_positions": cfg["max_position_embeddings"],
        "layer_norm_epsilon": cfg["layer_norm_eps"],
        "rotary_emb_base": cfg["rope_parameters"]["rope_theta"],
        "rotary_emb_fraction": 1.0,
        "rotary_emb_interleaved": False,
        "rotary_emb_scale_base": None,
        "rotary_scaling_factor": None,
        "max_trained_positions": 2048,
        "qkv_proj_bias": False,
        "mlp_fc1_bias": False,
        "mlp_fc2_bias": False,
        "prenorm": False,
        "parallel_block": False,
        "use_rms_norm": False,
        "causal": False,
        "type_vocab_size": cfg["type_vocab_size"],
        "vocab_size": cfg["vocab_size"] - 1,  # padded back up by pad_vocab_size_multiple
        "pad_vocab_size_multiple": 2,
        "use_flash_attn": True,
        **extra,
    }
    (folder / "config.json").write_text(json.dumps(orig))
    return folder


def test_nomic_original_config_matches(arch_ckpts, tmp_path):
    """nomic-ai's own config (n_embd, rotary_emb_base, swiglu ...): the same model. Its gated
    MLP widens n_inner up to a multiple of 256, so this model has 256."""
    model, src = arch_ckpts("nomic_bert", seed=5, intermediate_size=256)
    folder = tmp_path / "orig"
    shutil.copytree(src, folder)
    _nomic_original_config(folder)
    eng = zoi.compile(folder, device="cpu", max_tokens=512)
    native = zoi.compile(src, device="cpu", max_tokens=512)
    assert eng.spec == native.spec.replace(name="orig")
    np.testing.assert_array_equal(eng.encode(TEXTS_R), native.encode(TEXTS_R))
    want = pooled(hf_batch(model, eng.tokenize(TEXTS_R)), "mean")
    got = eng.encode(TEXTS_R, normalize_embeddings=False)
    assert cosine(got, want).min() >= 0.99999


def test_nomic_hub_config_for_transformers_5(ckpt, tmp_path):
    """The hub's nomic-embed config as rewritten for transformers 5: transformers' keys beside
    nomic-ai's (n_positions past max_position_embeddings, as 8192 beside 2048). RoPE runs at
    any position: texts run up to the longer limit, as transformers runs them; RoPE is
    rope_parameters' (transformers does not read rotary_scaling_factor, which nomic-ai's code
    applies only past max_trained_positions)."""
    model, src = ckpt("nomic_bert")
    folder = tmp_path / "hub"
    shutil.copytree(src, folder)
    native = json.loads((folder / "config.json").read_text())
    _nomic_original_config(folder, n_positions=400, rotary_scaling_factor=2.0)
    orig = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**orig, **native}))
    eng = zoi.compile(folder, device="cpu", max_tokens=512)
    assert eng.spec.max_positions == 400 and native["max_position_embeddings"] == 300
    assert eng.spec == zoi.compile(src, device="reference").spec.replace(
        name="hub", max_positions=400
    )
    texts = [" ".join(["tokens"] * 175), " ".join(["tokens"] * 250), *TEXTS_R[:3]]
    seqs = eng.tokenize(texts)
    assert [len(s) for s in seqs[:2]] == [352, 400]  # past max_position_embeddings; cut
    got = eng.encode(texts, normalize_embeddings=False)
    want = np.stack([hf_hidden(model, s).mean(0) for s in seqs])
    assert cosine(got, want).min() >= 0.99999


def test_gte_original_new_config_with_ntk_matches(ckpt, tmp_path):
    """Alibaba-NLP's own config (model_type "new", rope_theta 10000, rope_scaling ntk x 2) is
    the model transformers runs with RoPE base 20000 and a linear factor 2^(2/d) (the
    helpers' gte config): NTKScalingRotaryEmbedding's inv_freq, step by step."""
    model, src = ckpt("gte")
    folder = tmp_path / "new"
    shutil.copytree(src, folder)
    _edit(
        folder,
        drop=("rope_parameters",),
        model_type="new",
        architectures=["NewModel"],
        rope_theta=10000.0,
        rope_scaling={"type": "ntk", "factor": 2.0},
        position_embedding_type="rope",
        layer_norm_type="layer_norm",
        logn_attention_scale=False,
        pack_qkv=True,
    )
    eng = zoi.compile(folder, device="cpu", max_tokens=512)
    native = zoi.compile(src, device="cpu", max_tokens=512)
    assert eng.spec.arch == "gte"
    assert (eng.spec.rope_theta, eng.spec.rope_factor) == (20000.0, 2 ** (2 / 14))
    np.testing.assert_array_equal(eng.encode(TEXTS_R), native.encode(TEXTS_R))
    got = eng.encode(TEXTS_R, normalize_embeddings=False)
    want = pooled(hf_batch(model, eng.tokenize(TEXTS_R)), "cls")
    assert cosine(got, want).min() >= 0.99999


def test_graph_is_bert_with_attributes(ckpt):
    """No new op: BERT's post-norm layer with RoPE on attention, no position table, a gated
    MLP (linear 2I -> glu -> linear); the CUDA backend runs every piece of it."""
    from zoi.backends.arch_support import cuda_missing

    for name, act in (("nomic_bert", "silu"), ("gte", "gelu"), ("nomic_bert-head_dim", "silu")):
        _, folder = ckpt(name)
        eng = zoi.compile(folder, device="reference", max_tokens=512)
        g, sp = eng.model.graph, eng.spec
        kinds = [o.kind for o in g.ops]
        layer = ["linear", "attention", "linear", "add_layernorm", "linear", "glu", "linear"]
        assert kinds == ["embed", *(layer + ["add_layernorm"]) * sp.layers, "pool"]
        assert "pos" not in g.ops[0].weights and "embed.pos" not in eng.model.weights
        att = [o for o in g.ops if o.kind == "attention"]
        assert all(o.weights == {"rope_cos": "rope.g.cos", "rope_sin": "rope.g.sin"} for o in att)
        assert {o.attrs["act"] for o in g.ops if o.kind == "glu"} == {act}
        A = sp.heads * sp.head_dim
        assert g.buffers["l0.qkv_out"].cols == 3 * A and g.buffers["l0.ctx"].cols == A
        assert eng.model.weights["rope.g.cos"].shape == (sp.max_positions, sp.head_dim // 2)
        assert cuda_missing(g) == []
        if name == "nomic_bert":  # no linear biases (zeros), LayerNorm biases kept
            assert not np.any(eng.model.weights["l1.qkv.b"])
            assert np.any(eng.model.weights["l1.ln1.b"])
        if name == "gte":
            assert np.any(eng.model.weights["l1.qkv.b"]) and np.any(eng.model.weights["l1.ffn2.b"])
            assert not np.any(eng.model.weights["l1.ffn1.b"])  # gate / up have none


def test_nan_never_passes(ckpt, tmp_path):
    from safetensors.numpy import load_file, save_file

    _, src = ckpt("gte")
    folder = tmp_path / "nan"
    shutil.copytree(src, folder)
    w = {k: v.copy() for k, v in load_file(str(folder / "model.safetensors")).items()}
    w["encoder.layer.1.mlp.up_gate_proj.weight"][3, 5] = np.nan
    save_file(w, str(folder / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match="NaN"):
        zoi.compile(folder, device="cpu", max_tokens=512)
    eng = zoi.compile(src, device="reference", max_tokens=512)
    eng.model.weights["rope.g.sin"] = eng.model.weights["rope.g.sin"].copy()
    eng.model.weights["rope.g.sin"][3, 1] = np.inf  # a table gone bad after loading
    with pytest.raises(NumericalError), np.errstate(invalid="ignore", over="ignore"):
        eng.encode(TEXTS_R)


# ---- refusals --------------------------------------------------------------------------------
REFUSED = [
    ("nomic_bert", dict(rope_parameters={"rope_type": "yarn", "factor": 2.0, "rope_theta": 1e3}),
     "rope_parameters.rope_type 'yarn'.*default, linear, dynamic, ntk"),
    ("nomic_bert", dict(rope_parameters={"rope_type": "default", "rope_theta": 1e3,
                                         "partial_rotary_factor": 0.5}), "partial_rotary_factor"),
    ("nomic_bert", dict(hidden_act="tanh"), "hidden_act 'tanh'"),
    ("gte", dict(rope_parameters={"rope_type": "longrope", "rope_theta": 1e4}), "'longrope'"),
    ("gte", dict(rope_scaling={"type": "ntk", "factor": 2.0, "mixed_b": 0.6}), "mixed_b"),
    ("gte", dict(rope_parameters={"full_attention": {"rope_type": "default"}}), "per layer kind"),
    ("gte", dict(logn_attention_scale=True), "logn_attention_scale"),
    ("gte", dict(layer_norm_type="rms_norm"), "layer_norm_type 'rms_norm'"),
    ("gte", dict(position_embedding_type="absolute"), "position_embedding_type 'absolute'"),
    ("gte", dict(model_type="new", rope_scaling={"type": "dynamic", "factor": 2.0}),
     "rope_scaling.type 'dynamic'.*'ntk'"),
    ("gte", dict(architectures=["GteForMaskedLM"]), "task heads on gte"),
]  # fmt: skip


@pytest.mark.parametrize("arch, edit, message", REFUSED)
def test_unsupported_variant_names_the_field(arch, edit, message, arch_ckpts, tmp_path):
    _, src = arch_ckpts(arch, seed=0, pooling=None)
    folder = tmp_path / arch
    shutil.copytree(src, folder)
    _edit(folder, **edit)
    with pytest.raises(UnsupportedModelError, match=message):
        load_checkpoint(folder)


NOMIC_ORIGINAL_REFUSED = [
    ("activation_function", "gelu"),  # a plain (not gated) MLP: fc1 / fc2
    ("activation_function", "glu"),
    ("rotary_emb_fraction", 0.5),
    ("rotary_emb_interleaved", True),
    ("rotary_scaling_factor", 2.0),
    ("prenorm", True),
    ("qkv_proj_bias", True),
    ("mlp_fc1_bias", True),
    ("num_experts", 8),  # nomic-embed-text-v2-moe
]


@pytest.mark.parametrize("field, value", NOMIC_ORIGINAL_REFUSED)
def test_nomic_original_config_refusals(field, value, arch_ckpts, tmp_path):
    _, src = arch_ckpts("nomic_bert", seed=0, pooling=None)
    folder = tmp_path / "n"
    shutil.copytree(src, folder)
    _nomic_original_config(folder, **{field: value})
    with pytest.raises(UnsupportedModelError, match=f"{field} {value!r}"):
        load_checkpoint(folder)


def test_nomic_original_defaults_are_the_original_class(arch_ckpts, tmp_path):
    """A key left out takes configuration_hf_nomic_bert's default, not what zoi runs:
    rotary_emb_fraction 0.0 (learned positions), biases on."""
    _, src = arch_ckpts("nomic_bert", seed=5, intermediate_size=256)
    folder = tmp_path / "n"
    shutil.copytree(src, folder)
    _nomic_original_config(folder)
    for key, message in (("rotary_emb_fraction", "rotary_emb_fraction 0.0"),
                         ("mlp_fc2_bias", "mlp_fc2_bias True")):  # fmt: skip
        cfg = json.loads((folder / "config.json").read_text())
        good = cfg.pop(key)
        (folder / "config.json").write_text(json.dumps(cfg))
        with pytest.raises(UnsupportedModelError, match=message):
            load_checkpoint(folder)
        (folder / "config.json").write_text(json.dumps({**cfg, key: good}))
    assert load_checkpoint(folder)[0].arch == "nomic_bert"


@pytest.mark.parametrize(
    "edit, message",
    [
        (dict(head_dim=17), "even head_dim"),  # RoPE rotates pairs
        (dict(num_attention_heads=4, drop=("head_dim",)), "not a multiple of"),
        (dict(rope_parameters={"rope_type": "linear", "rope_theta": 1e3}), "factor"),
        (dict(rope_parameters={"rope_type": "default", "rope_theta": -5.0}), "rope_theta"),
    ],
)
def test_bad_config_values_are_refused(edit, message, arch_ckpts, tmp_path):
    _, src = arch_ckpts("nomic_bert", seed=0, pooling=None)
    folder = tmp_path / "bad"
    shutil.copytree(src, folder)
    _edit(folder, **edit)
    with pytest.raises(CheckpointError, match=message):
        load_checkpoint(folder)


def test_supported_list_names_the_archs(tmp_path):
    from zoi.frontend.checkpoint import SUPPORTED_TEXT

    assert "NomicBertModel" in SUPPORTED_TEXT and "GteModel" in SUPPORTED_TEXT
    folder = tmp_path / "x"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "jina_bert"}))
    with pytest.raises(UnsupportedModelError, match="nomic_bert, gte, new"):
        load_checkpoint(folder)
