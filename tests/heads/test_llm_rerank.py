"""LLM rerankers (a causal LM scored by logit["yes"] - logit["no"] of the last token) against
sentence-transformers' CrossEncoder of the same folder: random-init Qwen3ForCausalLM of awkward
sizes (6 query heads over 2 KV heads, head_dim 12, hidden 40, 256 positions so that long pairs
are cut; Qwen3-Reranker's template alone takes 105 of them in WordPiece tokens), the BERT WordPiece tokenizer of the other tests (it has "yes" and "no")."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
from tests.conftest import random_hf_model, real_sentences, save_checkpoint, small_vocab_tokenizer
from tests.fixtures import supported_isas
from tests.heads.helpers import spearman

import zoi
from zoi.errors import HeadError, UnsupportedModelError

VOCAB = 30529  # the tokenizer's 30522 ids + 7 rows no id reaches
QWEN3 = dict(
    hidden_size=40,
    num_hidden_layers=2,
    num_attention_heads=6,
    num_key_value_heads=2,
    head_dim=12,
    intermediate_size=37,
    max_position_embeddings=256,
)
TOK_CFG = {
    "tokenizer_class": "BertTokenizerFast",
    "pad_token": "[PAD]",
    "unk_token": "[UNK]",
    "cls_token": "[CLS]",
    "sep_token": "[SEP]",
    "mask_token": "[MASK]",
}
# Qwen3-Reranker's published prompt, with the query / document roles sentence-transformers
# maps a pair to (the system message: the instruction, a default prompt when there is one)
QWEN3_RERANKER_TEMPLATE = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query "
    'and the Instruct provided. Note that the answer can only be "yes" or "no".<|im_end|>\n'
    "<|im_start|>user\n<Instruct>: {{ messages | selectattr('role', 'eq', 'system') | "
    "map(attribute='content') | first | default('Given a web search query, retrieve relevant "
    "passages that answer the query') }}\n<Query>: {{ messages | selectattr('role', 'eq', "
    "'query') | map(attribute='content') | first }}\n<Document>: {{ messages | "
    "selectattr('role', 'eq', 'document') | map(attribute='content') | first }}<|im_end|>\n"
    "<|im_start|>assistant\n<think>\n\n</think>\n\n"
)


def _pairs(n: int = 20, seed: int = 0) -> list[tuple[str, str]]:
    """Short and long pairs; the long ones are cut at the 256 positions."""
    s = real_sentences()
    r = np.random.default_rng(seed)
    out = [
        ("what is the capital of france", "paris is the capital of france"),
        ("yes", "no no no"),
        ("a", " ".join(s[:30])),  # cut: the document runs past the length limit
        (" ".join(s[30:60]), "b"),  # cut: the query alone does
    ]
    for _ in range(n - len(out)):
        a, b = r.integers(0, len(s), 2)
        out.append((s[a], " ".join(s[b : b + int(r.integers(1, 4))])))
    return out


def _plain(folder: Path, seed: int = 0, tie: bool = False, chat: str | None = None, tok=None):
    """A Qwen3ForCausalLM saved with save_pretrained beside the test tokenizer."""
    model = random_hf_model(
        "Qwen3Config", "Qwen3ForCausalLM", seed, vocab_size=VOCAB, tie_word_embeddings=tie, **QWEN3
    )
    save_checkpoint(model, folder, tokenizer_json=tok)
    cfg = dict(TOK_CFG, chat_template=chat) if chat else TOK_CFG
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    return folder


def _cross_encoder(path: Path):
    from sentence_transformers import CrossEncoder

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return CrossEncoder(str(path), device="cpu")


def _saved(plain: Path, dest: Path) -> Path:
    """The plain folder loaded by CrossEncoder (Transformer + LogitScore on "yes" / "no") and
    saved with its own save_pretrained: a CrossEncoder folder."""
    _cross_encoder(plain).save_pretrained(str(dest))
    return dest


@pytest.fixture(scope="session")
def llm(tmp_path_factory):
    """kind -> folder, built once: "plain" (save_pretrained only), "ce" (CrossEncoder folder,
    the tokenizer's pair encoding), "chat" (CrossEncoder folder with Qwen3-Reranker's chat
    template), "tied" (tie_word_embeddings, no lm_head tensor)."""
    cache: dict = {}

    def get(kind: str) -> Path:
        if kind not in cache:
            d = tmp_path_factory.mktemp(f"llm-{kind}")
            if kind == "plain":
                cache[kind] = _plain(d / "m")
            elif kind == "ce":
                cache[kind] = _saved(_plain(d / "m"), d / "ce")
            elif kind == "chat":
                cache[kind] = _saved(_plain(d / "m", chat=QWEN3_RERANKER_TEMPLATE), d / "ce")
            elif kind == "tied":
                cache[kind] = _saved(_plain(d / "m", seed=1, tie=True), d / "ce")
        return cache[kind]

    return get


_ENGINES: dict = {}


def _engine(folder: Path, device: str = "cpu", **kw):
    key = (str(folder), device, tuple(sorted(kw.items())))
    if key not in _ENGINES:
        _ENGINES[key] = zoi.compile(folder, device=device, **kw)
    return _ENGINES[key]


def _check(eng, ce, pairs, atol: float = 1e-4) -> float:
    """zoi's predict (default activation, raw scores) and rerank order against CrossEncoder's."""
    import torch

    got, ref = eng.predict(pairs), ce.predict(pairs)
    assert got.shape == ref.shape == (len(pairs),)
    assert np.ptp(ref) > 1e-3  # the pairs' scores differ: the content reaches the last token
    err = float(np.abs(got - ref).max())
    assert err < atol, f"max |zoi - sentence-transformers| {err:.2e}"
    raw = eng.predict(pairs, activation_fn="identity")
    raw_ref = ce.predict(pairs, activation_fn=torch.nn.Identity())
    err = max(err, float(np.abs(raw - raw_ref).max()))
    assert err < atol, f"max |zoi - sentence-transformers| (raw scores) {err:.2e}"
    q, docs = pairs[0][0], [p[1] for p in pairs]
    want = ce.rank(q, docs)
    assert [r["corpus_id"] for r in eng.rerank(q, docs)] == [r["corpus_id"] for r in want]
    return err


@pytest.mark.parametrize("device", ["reference", "cpu"])
@pytest.mark.parametrize("kind", ["ce", "chat"])
def test_scores_match_cross_encoder(llm, kind, device):
    folder = llm(kind)
    mods = [m["type"] for m in json.loads((folder / "modules.json").read_text())]
    assert mods[-1].endswith("LogitScore")
    eng = _engine(folder, device)
    ce = _cross_encoder(folder)
    lsc = json.loads((folder / "1_LogitScore" / "config.json").read_text())
    assert eng.head == "seq_cls" and eng.labels == ("LABEL_0",)
    assert eng.spec.score_tokens == (lsc["true_token_id"], lsc["false_token_id"])
    assert eng.model.meta["pair_format"]["kind"] == ("chat" if kind == "chat" else "pairs")
    _check(eng, ce, _pairs())
    one = eng.predict(list(_pairs()[0]))
    assert np.ndim(one) == 0 and abs(float(one) - float(ce.predict(_pairs()[0]))) < 1e-4


def test_chat_template_tokens_match(llm):
    """The rendered-template tokens are sentence-transformers' own, cut rows included (their
    tail restored)."""
    folder = llm("chat")
    ce = _cross_encoder(folder)
    eng = _engine(folder, "reference")
    pairs = _pairs()
    ids, _, _, cu = eng._pairs().encode(pairs, eng.max_seq_tokens)
    for i, p in enumerate(pairs):
        feats = ce[0].preprocess([p])
        want = feats["input_ids"][0][feats["attention_mask"][0].bool()].tolist()
        assert ids[cu[i] : cu[i + 1]].tolist() == want, p
    assert (np.diff(cu) == eng.max_seq_tokens).sum() >= 2  # the long pairs were cut


@pytest.mark.parametrize("isa", supported_isas())
def test_cpu_fp32_every_isa(llm, isa, monkeypatch):
    monkeypatch.setenv("ZOI_CPU_ISA", isa)
    folder = llm("chat")
    eng = zoi.compile(folder, device="cpu")
    assert eng.backend.isa == isa
    pairs = _pairs(24, seed=2)
    _check(eng, _cross_encoder(folder), pairs)
    one = np.array([eng.predict(list(p)) for p in pairs[:6]])  # batched == one at a time
    np.testing.assert_allclose(one, eng.predict(pairs[:6]), atol=2e-6, rtol=0)


def test_only_the_score_rows_are_loaded(llm):
    eng = _engine(llm("ce"), "cpu")
    W, H = eng.model.weights, eng.spec.hidden
    assert W["head.out.w"].shape == (2, H)
    big = [k for k, v in W.items() if v.ndim == 2 and v.shape[0] >= VOCAB]
    assert big == ["embed.word"]  # the input embeddings; never the [vocab, hidden] LM head
    from safetensors.numpy import load_file

    lm = load_file(str(llm("ce") / "model.safetensors"))["lm_head.weight"]
    np.testing.assert_array_equal(W["head.out.w"], lm[list(eng.spec.score_tokens)])
    g = eng.model.graph
    assert g.buffers[g.output].cols == 2 and eng.head_cols == 1
    assert [o.attrs.get("mode") for o in g.ops if o.kind == "pool"] == ["last"]


def test_tied_embeddings(llm):
    folder = llm("tied")
    from safetensors.numpy import load_file

    assert "lm_head.weight" not in load_file(str(folder / "model.safetensors"))
    eng = _engine(folder, "cpu")
    word = eng.model.weights["embed.word"]
    np.testing.assert_array_equal(
        eng.model.weights["head.out.w"], word[list(eng.spec.score_tokens)]
    )
    _check(eng, _cross_encoder(folder), _pairs(12, seed=5))


def test_int8_keeps_the_order_and_round_trips(llm, tmp_path):
    folder = llm("chat")
    s = real_sentences()
    query = "what is the capital of france"
    docs = [" ".join(s[i : i + 2]) for i in range(0, 48, 2)]
    pairs = [(query, d) for d in docs]
    ref = _cross_encoder(folder).predict(pairs)
    eng = zoi.compile(folder, device="cpu", precision="int8")
    assert any(k.startswith("int8") for k in eng.backend.linear_kinds.values())
    got = eng.predict(pairs, activation_fn="identity")
    assert np.isfinite(got).all()
    assert spearman(got, ref) >= 0.9
    back = zoi.load(eng.save(tmp_path / "art"), device="cpu")
    assert back.spec == eng.spec and back.model.meta["pair_format"] == eng.model.meta["pair_format"]
    np.testing.assert_array_equal(back.predict(pairs, activation_fn="identity"), got)
    assert back.rerank(query, docs) == eng.rerank(query, docs)


def test_fp32_round_trips(llm, tmp_path):
    eng = _engine(llm("ce"), "cpu")
    back = zoi.load(eng.save(tmp_path / "art"), device="reference")
    pairs = _pairs(8)
    np.testing.assert_allclose(back.predict(pairs), eng.predict(pairs), atol=1e-6, rtol=0)


def test_task_rerank_on_a_plain_folder(llm, tmp_path):
    folder = llm("plain")
    assert not (folder / "modules.json").exists()
    from zoi.decoder.generator import Generator

    assert isinstance(zoi.compile(folder, device="cpu"), Generator)  # no task: generation
    eng = zoi.compile(folder, device="cpu", task="rerank")
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    assert eng.spec.score_tokens == (tok.token_to_id("yes"), tok.token_to_id("no"))
    _check(eng, _cross_encoder(folder), _pairs(12, seed=7))  # CrossEncoder's own "yes" / "no"
    # the CLI's --task, then the artifact
    from zoi.cli import main

    assert main(["compile", str(folder), "--task", "rerank", "-o", str(tmp_path / "a")]) == 0
    back = zoi.load(tmp_path / "a")
    np.testing.assert_allclose(back.predict(_pairs(6)), eng.predict(_pairs(6)), atol=1e-6)
    with pytest.raises(ValueError, match="task must be one of"):
        zoi.compile(folder, device="cpu", task="classify")


def test_refusals(llm, tmp_path):
    # a tokenizer without "yes" / "no"
    bare = _plain(tmp_path / "bare", tok=small_vocab_tokenizer())
    with pytest.raises(UnsupportedModelError, match="no 'yes' / 'no' token"):
        zoi.compile(bare, device="cpu", task="rerank")
    # task="rerank" on an embedding folder (sentence-transformers modules with a Pooling)
    from tests.archs.decoder_helpers import decoder_checkpoint

    _, emb = decoder_checkpoint("qwen3", tmp_path / "emb", pooling="lasttoken")
    with pytest.raises(UnsupportedModelError, match="task='rerank'"):
        zoi.compile(emb, device="cpu", task="rerank")
    # a chat template that has no query / document roles (a plain chat model's)
    chat = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    )
    ce = llm("ce")
    odd = tmp_path / "odd"
    import shutil

    shutil.copytree(ce, odd)
    (odd / "chat_template.jinja").write_text("<|im_start|>user\n{{ messages[0].content }}")
    cfg = json.loads((odd / "sentence_bert_config.json").read_text())
    cfg["modality_config"]["message"] = dict(cfg["modality_config"]["text"], format="flat")
    (odd / "sentence_bert_config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedModelError, match="document of a pair"):
        zoi.compile(odd, device="reference")
    # a template that edits the texts (trim)
    (odd / "chat_template.jinja").write_text(chat.replace("m.content", "m.content | trim"))
    with pytest.raises(UnsupportedModelError, match="changes the query or document"):
        zoi.compile(odd, device="reference")
    # single texts through a chat template
    eng = _engine(llm("chat"), "reference")
    with pytest.raises(HeadError, match="takes pairs"):
        eng.predict(["one text", "another", "a third"])


def test_true_token_alone(llm, tmp_path):
    """LogitScore with false_token_id null scores logit[true] alone."""
    import shutil

    folder = tmp_path / "one"
    shutil.copytree(llm("ce"), folder)
    p = folder / "1_LogitScore" / "config.json"
    cfg = json.loads(p.read_text())
    cfg["false_token_id"] = None
    p.write_text(json.dumps(cfg))
    eng = zoi.compile(folder, device="cpu")
    assert eng.spec.score_tokens == (cfg["true_token_id"],)
    _check(eng, _cross_encoder(folder), _pairs(10))


def test_rerank_routes(llm):
    pytest.importorskip("httpx")
    pytest.importorskip("starlette")
    import asyncio

    from tests.heads.test_routes import client

    eng = _engine(llm("chat"), "cpu")
    query, docs = "capital of France", [p[1] for p in _pairs(8)]

    async def go():
        async with client(eng, max_queue_delay_us=20000) as c:
            r = await c.post("/rerank", json={"query": query, "texts": docs})
            assert r.status_code == 200, r.text
            want = eng.rerank(query, docs)
            got = r.json()
            assert [x["index"] for x in got] == [w["corpus_id"] for w in want]
            np.testing.assert_allclose(
                [x["score"] for x in got], [w["score"] for w in want], atol=1e-6
            )
            r = await c.post("/v1/rerank", json={"query": query, "documents": docs, "top_n": 3})
            assert r.status_code == 200, r.text
            assert [x["index"] for x in r.json()["results"]] == [w["corpus_id"] for w in want[:3]]

    asyncio.run(go())


@pytest.mark.parametrize("kind", ["ce", "chat"])
def test_default_prompt(llm, kind, tmp_path):
    """config_sentence_transformers.json's default prompt: a system message through the chat
    template (its <Instruct>), before the query in the tokenizer's pairs, as CrossEncoder."""
    import shutil

    folder = tmp_path / kind
    shutil.copytree(llm(kind), folder)
    p = folder / "config_sentence_transformers.json"
    cfg = json.loads(p.read_text())
    cfg["prompts"] = {"web": "Given a question, find the passage that answers it: "}
    cfg["default_prompt_name"] = "web"
    p.write_text(json.dumps(cfg))
    eng = zoi.compile(folder, device="cpu")
    fmt = eng.model.meta["pair_format"]
    assert "find the passage" in (fmt["pieces"][0] if kind == "chat" else fmt["prompt"])
    _check(eng, _cross_encoder(folder), _pairs(10, seed=4))


@pytest.mark.parametrize(
    "arch, lm", [("gemma3", "Gemma3ForCausalLM"), ("llama", "LlamaForCausalLM")]
)
def test_other_architectures(arch, lm, tmp_path):
    """Gemma3's tied LM head reads the unscaled embedding table (zoi's embed.word is scaled by
    sqrt(hidden)); Llama: MHA, no q / k norm. Plain folders with task="rerank"."""
    from tests.archs.decoder_helpers import DECODER_CONFIGS

    c, _, kw = DECODER_CONFIGS[arch]
    kw = dict(kw, max_position_embeddings=256)
    kw.pop("use_bidirectional_attention", None)  # a causal LM
    model = random_hf_model(c, lm, 0, vocab_size=VOCAB, **kw)
    folder = tmp_path / arch
    save_checkpoint(model, folder)
    (folder / "tokenizer_config.json").write_text(json.dumps(TOK_CFG))
    eng = zoi.compile(folder, device="cpu", task="rerank")
    if arch == "gemma3":
        assert model.config.tie_word_embeddings
        emb = model.get_input_embeddings().weight.detach().numpy()
        np.testing.assert_array_equal(
            eng.model.weights["head.out.w"], emb[list(eng.spec.score_tokens)]
        )
    _check(eng, _cross_encoder(folder), _pairs(12, seed=3))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_checkpoint(tmp_path, dtype):
    """The score rows of a BF16 / FP16 file, read from the mapped table row by row, widened
    exactly."""
    import torch

    model = random_hf_model("Qwen3Config", "Qwen3ForCausalLM", 3, vocab_size=VOCAB, **QWEN3)
    folder = save_checkpoint(model, tmp_path / "m", dtype=getattr(torch, dtype))
    (folder / "tokenizer_config.json").write_text(json.dumps(TOK_CFG))
    eng = zoi.compile(folder, device="reference", task="rerank")
    lm = model.lm_head.weight.detach().to(getattr(torch, dtype)).float().numpy()
    np.testing.assert_array_equal(eng.model.weights["head.out.w"], lm[list(eng.spec.score_tokens)])
    assert np.isfinite(eng.predict(_pairs(4))).all()
