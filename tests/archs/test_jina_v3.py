"""jina-embeddings-v3 (XLM-RoBERTa with RoPE, zoi.frontend.archs_rotary) and its task LoRA adapters
chosen per request (zoi.frontend.adapters, zoi.adapters): random-init checkpoints of awkward
sizes (tests/archs/jina_helpers.py) written as the hub ships them (parametrized weights, stacked
lora_A / lora_B, a `roberta.` prefix), as save_pretrained writes the base model, and with
transformers' module names.

- the base model (no task) against transformers, the reference and the CPU engine on every ISA;
- every task against transformers with that task's adapters merged into its weights (the hub's
  W + s B_t A_t / E + s A_t B_t), FP32 on every ISA (forced) and the reference;
- a batch mixing tasks (and no task) equal, bit for bit, to each task run alone, on every ISA,
  FP32 and INT8; INT8 close to FP32 and to its emulation per task;
- unknown tasks refused listing the model's, NaN never an answer, the GPU refused by name."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from tests.archs import jina_helpers as J
from tests.archs.helpers import cosine
from tests.fixtures import supported_isas

import zoi
from zoi.errors import CheckpointError, InputError, NumericalError, UnsupportedModelError
from zoi.frontend.tokenizer import pack

TEXTS = [
    "Hello world!",
    "The quick brown fox jumps over the lazy dog.",
    "a b c d e f g h i j k l m n o p q r s t u v w x y z " * 3,
    "x",
    "Ünïcödé tèxt, with punctuation; and numbers 12345 6789.",
    " ".join(f"w{i}" for i in range(40)),
]
# one task per text, the base weights (None) among them
MIXED = [
    "retrieval.query",
    "separation",
    None,
    "retrieval.passage",
    "text-matching",
    "classification",
]


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """(transformers model, hub folder with adapters, adapters, scaling)."""
    return J.checkpoint(tmp_path_factory.mktemp("jina") / "jina-v3")


@pytest.fixture(scope="module")
def oracles(hub):
    """task index -> transformers with that task's adapters merged."""
    model, _, ad, s = hub
    return {t: J.merged(model, ad, t, s) for t in range(len(J.TASKS))}


def _want(hub, oracles, eng, texts, task):
    model = hub[0] if task is None else oracles[J.TASKS.index(task)]
    return J.mean_pooled(model, eng.tokenize(texts))


def test_reads_the_hub_layout(hub):
    model, folder, _, _ = hub
    eng = zoi.compile(folder, device="reference", max_tokens=512)
    spec = eng.spec
    assert spec.arch == "jina_v3" and spec.adapters == tuple(J.TASKS)
    assert spec.adapter_rank == 4 and spec.pooling == "mean" and spec.normalize
    assert eng.tasks == J.TASKS
    assert eng.task_instructions == {k: v for k, v in J.INSTRUCTIONS.items() if v}
    assert spec.rope_theta == 20000.0 and spec.eps == 1e-5
    W = eng.model.weights
    assert W["l0.qkv.lora_a"].shape == (5, 4, 84) and W["l0.qkv.lora_b"].shape == (5, 252, 4)
    assert W["embed.lora_a"].shape == (5, 30522, 4) and W["embed.lora_type"].shape == (5, 84)
    assert W["l1.ffn1.w"].shape == (75, 84)  # BERT's MLP, not gated
    # s = alpha / rank folded into B
    _, ad, s = hub[1], hub[2], hub[3]
    np.testing.assert_array_equal(
        W["l1.o.lora_b"], (ad["encoder.layers.1.mixer.out_proj"][1] * np.float32(s))
    )


@pytest.mark.parametrize("device", ["reference", "cpu"])
def test_base_matches_transformers(device, hub):
    model, folder, _, _ = hub
    eng = zoi.compile(folder, device=device, max_tokens=512)
    got = eng.encode(TEXTS, normalize_embeddings=False)
    assert np.isfinite(got).all()
    assert cosine(got, J.mean_pooled(model, eng.tokenize(TEXTS))).min() >= 0.99999


def test_reference_tokens_match_transformers(hub):
    """Per token, every task: the reference's last hidden states against the merged model."""
    from zoi.backends.reference import run_graph

    model, folder, _, _ = hub
    eng = zoi.compile(folder, device="reference", max_tokens=512)
    seqs = eng.tokenize(TEXTS)
    ids, pos, cu = pack(seqs, 0)
    for t in range(len(J.TASKS)):
        oracle = J.merged(model, hub[2], t, hub[3])
        tasks = np.full(len(seqs), t, np.int32)
        env = run_graph(eng.model, ids, pos, cu, tasks=tasks)
        last = env[[o for o in eng.model.graph.ops if o.kind == "pool"][0].inputs[0]]
        import torch

        for s, seq in enumerate(seqs):
            with torch.no_grad():
                x = torch.from_numpy(seq.astype(np.int64))[None]
                want = oracle(input_ids=x).last_hidden_state[0].numpy()
            np.testing.assert_allclose(last[cu[s] : cu[s + 1]], want, atol=1e-4, rtol=0)


@pytest.mark.parametrize("device", ["reference", *[f"cpu-{i}" for i in supported_isas()]])
def test_every_task_matches_the_merged_weights(device, hub, oracles, monkeypatch):
    _, folder, _, _ = hub
    if device.startswith("cpu-"):
        monkeypatch.setenv("ZOI_CPU_ISA", device[4:])
    eng = zoi.compile(folder, device=device.split("-")[0], max_tokens=512)
    if device.startswith("cpu-"):
        assert eng.backend.isa == device[4:]
    base = eng.encode(TEXTS, normalize_embeddings=False)
    for task in J.TASKS:
        # prompt="": the texts as they are (the oracle gets the same tokens)
        got = eng.encode(TEXTS, normalize_embeddings=False, task=task, prompt="")
        assert np.isfinite(got).all()
        assert cosine(got, _want(hub, oracles, eng, TEXTS, task)).min() >= 0.99999, task
        assert cosine(got, base).min() < 0.9999  # the adapter is not silently dropped


@pytest.mark.parametrize("precision", ["fp32", "int8"])
@pytest.mark.parametrize("isa", supported_isas())
def test_mixed_batch_is_bit_identical_to_each_task_alone(isa, precision, hub, monkeypatch):
    _, folder, _, _ = hub
    monkeypatch.setenv("ZOI_CPU_ISA", isa)
    eng = zoi.compile(folder, device="cpu", max_tokens=512, precision=precision)
    assert eng.backend.isa == isa
    mixed = eng.encode(TEXTS, task=MIXED)
    assert np.isfinite(mixed).all()
    for task in set(MIXED):
        idx = [i for i, t in enumerate(MIXED) if t == task]
        sub = [TEXTS[i] for i in idx]
        alone = eng.encode(sub, task=task) if task else eng.encode(sub)
        np.testing.assert_array_equal(mixed[idx], alone)
    # one text per call, and the mix through run_packed (the server's path): the same rows
    one = np.stack(
        [eng.encode(t, task=k) if k else eng.encode(t) for t, k in zip(TEXTS, MIXED, strict=True)]
    )
    np.testing.assert_array_equal(one, mixed)


def test_mixed_batch_on_the_reference(hub):
    """The reference groups a batch's rows by task: each row equals its task run alone."""
    _, folder, _, _ = hub
    eng = zoi.compile(folder, device="reference", max_tokens=512)
    mixed = eng.encode(TEXTS, task=MIXED, prompt="")
    for i, (t, k) in enumerate(zip(TEXTS, MIXED, strict=True)):
        alone = eng.encode([t], task=k, prompt="") if k else eng.encode([t])
        np.testing.assert_allclose(mixed[i], alone[0], atol=1e-6, rtol=0)


def test_run_packed_tasks_and_the_chunk_loop(hub):
    """Per-sequence task ids through run_packed, over chunks smaller than the batch: each
    chunk gets its own slice of the ids."""
    _, folder, _, _ = hub
    eng = zoi.compile(folder, device="cpu", max_tokens=512, max_batch=2)
    seqs = eng.tokenize(TEXTS)
    ids, pos, cu = pack(seqs, 0)
    tasks = eng.task_ids(MIXED)
    got = eng.run_packed(ids, pos, cu, tasks=tasks)
    for i, (s, t) in enumerate(zip(seqs, tasks, strict=True)):
        a, p, c = pack([s], 0)
        np.testing.assert_array_equal(got[i], eng.run_packed(a, p, c, tasks=[t])[0])
    with pytest.raises(InputError, match="in \\[0, 5\\)"):
        eng.run_packed(ids, pos, cu, tasks=np.full(len(seqs), 5))
    with pytest.raises(InputError, match="one task id per sequence"):
        eng.run_packed(ids, pos, cu, tasks=[0])


def test_int8_per_task(hub, tmp_path):
    from tests.conftest import real_sentences

    _, folder, _, _ = hub
    texts = real_sentences(30) + TEXTS
    f32 = zoi.compile(folder, device="cpu", max_tokens=512)
    q = zoi.compile(folder, device="cpu", precision="int8", max_tokens=512)
    assert all(k.startswith("int8") for k in q.backend.linear_kinds.values())
    back = zoi.load(q.save(tmp_path / "art"), device="cpu")
    assert back.spec == q.spec and back.task_instructions == q.task_instructions
    emu = zoi.load(tmp_path / "art", device="reference")
    for task in [None, *J.TASKS]:
        got = q.encode(texts, task=task)
        assert np.isfinite(got).all()
        assert cosine(got, f32.encode(texts, task=task)).min() > 0.99  # test_rotary_encoders'
        np.testing.assert_array_equal(back.encode(texts, task=task), got)
        assert cosine(emu.encode(texts[:12], task=task), got[:12]).min() > 0.9999


def test_follow_smoothing_keeps_each_task(hub):
    """SmoothQuant's v_fold divides qkv's V rows by s and multiplies o's input columns by s:
    the adapters' factors follow (zoi.adapters.follow_smoothing), every task unchanged."""
    from zoi.adapters import follow_smoothing
    from zoi.backends.reference import run_graph
    from zoi.graph.compiled import CompiledModel, LinearQuant
    from zoi.quant.smoothquant import apply_smoothing

    _, folder, _, _ = hub
    eng = zoi.compile(folder, device="reference", max_tokens=512)
    spec, W = eng.spec, eng.model.weights
    base_spec = spec.replace(adapters=(), adapter_rank=0)
    base_graph = CompiledModel.build(base_spec, W, "fp32", 512).graph
    s = np.random.default_rng(0).uniform(0.3, 3.0, spec.hidden).astype(np.float32)
    lora = {k: v for k, v in W.items() if ".lora_" in k}
    sw, used = apply_smoothing(
        base_graph, {k: v for k, v in W.items() if k not in lora}, {"l1.o": s}
    )
    assert used == {"l1.o": "v_fold"}
    quant = {"l1.o": LinearQuant("fp32", info={"in_scale": s.tolist()})}
    seqs = eng.tokenize(TEXTS)
    ids, pos, cu = pack(seqs, 0)
    tasks = eng.task_ids(MIXED)

    def run(weights):
        m = CompiledModel.build(spec, weights, "fp32", 512)
        return run_graph(m, ids, pos, cu, tasks=tasks)[m.graph.output]

    want = run(W)
    np.testing.assert_allclose(
        run({**sw, **follow_smoothing(base_graph, lora, quant)}), want, atol=2e-5, rtol=0
    )
    assert np.abs(run({**sw, **lora}) - want).max() > 1e-3  # unfollowed, the tasks drift


def test_instructions_and_prompts(hub):
    """encode(task=...) puts the task's instruction (config.json task_instructions) before each
    text, as the hub's encode does; prompt / prompt_name replace it."""
    _, folder, _, _ = hub
    eng = zoi.compile(folder, device="cpu", max_tokens=512)
    ins = J.INSTRUCTIONS["retrieval.query"]
    got = eng.encode(TEXTS, task="retrieval.query")
    np.testing.assert_array_equal(
        got, eng.encode([ins + t for t in TEXTS], task="retrieval.query", prompt="")
    )
    np.testing.assert_array_equal(
        got, eng.encode(TEXTS, task="retrieval.query", prompt_name="retrieval.query")
    )
    plain = eng.encode(TEXTS, task="separation")  # an empty instruction: the texts as they are
    np.testing.assert_array_equal(plain, eng.encode(TEXTS, task="separation", prompt=""))
    one = eng.encode(TEXTS[0], task="retrieval.query")
    assert one.shape == (84,)
    np.testing.assert_array_equal(one, got[0])
    trunc = eng.encode(TEXTS, task=MIXED, truncate_dim=16)
    full = eng.encode(TEXTS, task=MIXED, normalize_embeddings=False)[:, :16]
    np.testing.assert_allclose(trunc, full / np.linalg.norm(full, axis=1, keepdims=True), atol=1e-6)


def test_unknown_tasks_are_refused(hub, tmp_path):
    _, folder, _, _ = hub
    eng = zoi.compile(folder, device="cpu", max_tokens=512)
    for bad in ("retrieval", "query", ""):
        with pytest.raises(InputError, match="retrieval.query, retrieval.passage, separation"):
            eng.encode(TEXTS, task=bad)
    with pytest.raises(InputError, match="one name for all of them or one per text"):
        eng.encode(TEXTS, task=["separation"])
    with pytest.raises(ValueError, match="output_value"):
        eng.encode(TEXTS, task="separation", output_value="token_embeddings")
    plain = zoi.compile(_save_pretrained(hub, tmp_path), device="cpu", max_tokens=512)
    assert plain.tasks == []
    with pytest.raises(InputError, match="no task adapters"):
        plain.encode(TEXTS, task="retrieval.query")


def _save_pretrained(hub, tmp_path):
    """The base model as transformers' save_pretrained writes it (no adapters, no prefix)."""
    from tests.conftest import save_checkpoint

    folder = tmp_path / "plain"
    save_checkpoint(hub[0], folder, pooling="mean")
    return folder


def test_save_pretrained_and_module_names_are_the_base_model(hub, tmp_path):
    from safetensors.numpy import load_file, save_file

    model, folder, _, _ = hub
    want = zoi.compile(folder, device="cpu", max_tokens=512).encode(TEXTS)
    plain = _save_pretrained(hub, tmp_path)
    got = zoi.compile(plain, device="cpu", max_tokens=512).encode(TEXTS, normalize_embeddings=True)
    np.testing.assert_array_equal(got, want)
    # transformers' module names (a bare state_dict), q / k / v split
    mods = tmp_path / "modules"
    shutil.copytree(plain, mods)
    out = {}
    for k, v in load_file(str(mods / "model.safetensors")).items():
        k = k.replace("emb_ln.", "embeddings.LayerNorm.").replace("encoder.layers.", "layers.")
        k = k.replace("norm1", "post_attention_layernorm").replace("norm2", "post_mlp_layernorm")
        k = k.replace("mixer.out_proj", "self_attn.o_proj")
        if "mixer.Wqkv" in k:
            for x, part in zip("qkv", np.split(v, 3), strict=True):
                out[k.replace("mixer.Wqkv", f"self_attn.{x}_proj")] = part
        else:
            out[k] = v
    save_file(out, str(mods / "model.safetensors"), metadata={"format": "pt"})
    got = zoi.compile(mods, device="cpu", max_tokens=512).encode(TEXTS, normalize_embeddings=True)
    np.testing.assert_array_equal(got, want)


def test_the_hubs_original_config(tmp_path):
    """jinaai/jina-embeddings-v3's own config.json: model_type xlm-roberta with rotary
    positions (rotary_emb_base), tensors under roberta."""
    model, folder, ad, s = J.checkpoint(tmp_path / "orig", seed=3, original_config=True)
    eng = zoi.compile(folder, device="cpu", max_tokens=512)
    assert eng.spec.arch == "jina_v3" and eng.tasks == J.TASKS
    got = eng.encode(TEXTS, normalize_embeddings=False, task="text-matching")
    want = J.mean_pooled(J.merged(model, ad, 4, s), eng.tokenize(TEXTS))
    assert cosine(got, want).min() >= 0.99999
    cfg = json.loads((folder / "config.json").read_text())
    cfg["rotary_emb_interleaved"] = True
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedModelError, match="rotary_emb_interleaved"):
        zoi.compile(folder, device="cpu", max_tokens=512)


def _edit_tensors(src, dst, edit):
    from safetensors.numpy import load_file, save_file

    shutil.copytree(src, dst)
    w = load_file(str(dst / "model.safetensors"))
    edit(w)
    save_file(w, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


def test_broken_adapters_are_refused(hub, tmp_path):
    _, folder, _, _ = hub
    a = "roberta.encoder.layers.1.mlp.fc2.parametrizations.weight.0.lora_A"

    def drop(w):
        del w[a]

    with pytest.raises(CheckpointError, match="no lora_A of layer 1's ffn2"):
        zoi.compile(_edit_tensors(folder, tmp_path / "drop", drop), device="reference")

    def nan(w):
        w[a] = w[a].copy()
        w[a][2, 1, 3] = np.nan

    with pytest.raises(CheckpointError, match="NaN"):
        zoi.compile(_edit_tensors(folder, tmp_path / "nan", nan), device="reference")

    def rank(w):
        w[a] = w[a][:, :3]

    with pytest.raises(CheckpointError, match="lora_rank 4"):
        zoi.compile(_edit_tensors(folder, tmp_path / "rank", rank), device="reference")
    nocfg = tmp_path / "nocfg"
    shutil.copytree(folder, nocfg)
    cfg = json.loads((nocfg / "config.json").read_text())
    del cfg["lora_adaptations"]
    (nocfg / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="lora_adaptations"):
        zoi.compile(nocfg, device="reference")


@pytest.mark.filterwarnings("ignore:overflow:RuntimeWarning", "ignore:invalid value:RuntimeWarning")
def test_nan_never_passes(hub, tmp_path):
    """An adapter whose numbers overflow float32 answers NumericalError for its task's texts;
    the other tasks (and the base weights) still answer."""
    _, folder, _, _ = hub
    a = "roberta.encoder.layers.0.mlp.fc1.parametrizations.weight.0.lora_A"

    def huge(w):  # x A^T overflows to +-inf, then inf - inf in B's products: NaN
        w[a] = w[a].copy()
        w[a][1] = np.float32(3e38)

    bad = _edit_tensors(folder, tmp_path / "huge", huge)
    for device in ("cpu", "reference"):
        eng = zoi.compile(bad, device=device, max_tokens=512)
        with pytest.raises(NumericalError):
            eng.encode(TEXTS, task=MIXED)  # retrieval.passage is task 1
        assert np.isfinite(eng.encode(TEXTS, task="separation")).all()
        assert np.isfinite(eng.encode(TEXTS)).all()


def test_gpu_refuses_per_request_lora(hub):
    from zoi.backends.arch_support import check_cuda, cuda_missing

    _, folder, _, _ = hub
    eng = zoi.compile(folder, device="reference", max_tokens=512)
    assert "per-request LoRA on the GPU (the task adapters)" in cuda_missing(eng.model.graph)
    with pytest.raises(UnsupportedModelError, match="per-request LoRA on the GPU"):
        check_cuda(eng.model)


def test_base_model_on_the_cuda_backend(hub, tmp_path):
    """A folder without adapter tensors is the base model: the CUDA backend runs it (FP16, the
    Triton interpreter on the CPU: tests/archs/conftest.py), as NomicBERT / GTE."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("triton")
    from tests import triton_mode

    if not triton_mode.interpreted() and not torch.cuda.is_available():
        pytest.skip("compiled Triton needs a CUDA GPU")
    from zoi.backends.arch_support import cuda_missing
    from zoi.backends.cuda import CudaBackend
    from zoi.backends.reference import ReferenceBackend
    from zoi.graph.compiled import CompiledModel

    eng = zoi.compile(_save_pretrained(hub, tmp_path), device="reference", max_tokens=512)
    model = CompiledModel.build(eng.spec, eng.model.weights, "fp16", 512, 8)
    assert cuda_missing(model.graph) == []
    ids, pos, cu = pack(eng.tokenize(["x", "Hello world!", "a b c d e f g h i j k l m n"]), 0)
    want = ReferenceBackend(model).run(ids, pos, cu, True)
    got = CudaBackend(model, buckets=[16, 32]).run(ids, pos, cu, True)
    assert np.isfinite(got).all()
    assert cosine(got, want).min() > 0.999
