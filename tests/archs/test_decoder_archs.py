"""Decoder architectures as encoders (Qwen3, Gemma3, Llama, Qwen2, Mistral) through the one IR:
the reference per token against transformers, the CPU engine on every ISA (FP32), INT8 against
FP32, sentence-transformers' own encode (last-token pooling, Dense modules, Normalize), the
kernels' new attention / norm modes against the reference on awkward shapes, save / load."""

from __future__ import annotations

import numpy as np
import pytest
from tests.archs.decoder_helpers import DECODER_ARCHS, add_dense, decoder_checkpoint
from tests.archs.helpers import TEXTS, cosine, hf_hidden
from tests.fixtures import supported_isas

import zoi
from zoi import _cpu
from zoi.backends.reference import run_graph
from zoi.frontend.archs import rope_tables
from zoi.frontend.tokenizer import pack
from zoi.numerics import reference as ref


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    cache: dict = {}

    def get(arch: str, pooling: str | None = "mean"):
        if (arch, pooling) not in cache:
            d = tmp_path_factory.mktemp(f"dec-{arch}")
            seed = DECODER_ARCHS.index(arch)
            cache[arch, pooling] = decoder_checkpoint(arch, d, seed=seed, pooling=pooling)
        return cache[arch, pooling]

    return get


@pytest.mark.parametrize("arch", DECODER_ARCHS)
def test_reference_matches_transformers_per_token(arch, ckpts):
    model, folder = ckpts(arch)
    eng = zoi.compile(folder, device="reference", max_tokens=512)
    assert eng.spec.arch == arch
    seqs = eng.tokenize(TEXTS)
    assert max(len(s) for s in seqs) > 20  # longer than the sliding windows
    ids, pos, cu = pack(seqs, eng.spec.position_offset)
    env = run_graph(eng.model, ids, pos, cu)  # all texts in one packed batch
    last = env[[o for o in eng.model.graph.ops if o.kind == "pool"][0].inputs[0]]
    for s, seq in enumerate(seqs):
        want = hf_hidden(model, seq)
        got = last[cu[s] : cu[s + 1]]
        assert np.isfinite(got).all()
        np.testing.assert_allclose(got, want, atol=2e-5, rtol=0)


@pytest.mark.parametrize("isa", supported_isas())
@pytest.mark.parametrize("arch", DECODER_ARCHS)
def test_cpu_fp32_every_isa(arch, isa, ckpts, monkeypatch):
    model, folder = ckpts(arch)
    monkeypatch.setenv("ZOI_CPU_ISA", isa)
    eng = zoi.compile(folder, device="cpu", max_tokens=512)
    assert eng.backend.isa == isa
    got = eng.encode(TEXTS, normalize_embeddings=False)
    want = np.stack([hf_hidden(model, s).mean(0) for s in eng.tokenize(TEXTS)])
    assert np.isfinite(got).all()
    assert cosine(got, want).min() >= 0.99999
    one = np.stack([eng.encode([t], normalize_embeddings=False)[0] for t in TEXTS])
    np.testing.assert_allclose(one, got, atol=2e-6, rtol=0)  # batched == one at a time


@pytest.mark.parametrize("arch", ["qwen3", "gemma3"])
def test_int8_tracks_fp32_and_round_trips(arch, ckpts, tmp_path):
    from tests.conftest import real_sentences

    _, folder = ckpts(arch)
    texts = real_sentences(40) + TEXTS
    f32 = zoi.compile(folder, device="cpu", max_tokens=512).encode(texts)
    eng = zoi.compile(folder, device="cpu", precision="int8", max_tokens=512)
    q = eng.encode(texts)
    assert np.isfinite(q).all()
    assert cosine(q, f32).min() > 0.995  # random-init 40-wide models; real ones in zoi eval
    assert any(k.startswith("int8") for k in eng.backend.linear_kinds.values())
    back = zoi.load(eng.save(tmp_path / "art"), device="cpu")
    assert back.spec == eng.spec
    np.testing.assert_array_equal(back.encode(texts), q)
    emu = zoi.load(tmp_path / "art", device="reference").encode(texts)
    assert cosine(emu, q).min() > 0.9999  # the emulation the kernels reproduce


def _st_model(folder):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(folder), device="cpu")


def _st_encode(folder, texts):
    return _st_model(folder).encode(texts, convert_to_numpy=True, normalize_embeddings=False)


def test_qwen3_last_token_pooling_matches_sentence_transformers(ckpts):
    """Qwen3-Embedding's layout: a causal Qwen3 with sentence-transformers' lasttoken pooling."""
    _, folder = ckpts("qwen3", pooling="lasttoken")
    eng = zoi.compile(folder, device="cpu", max_tokens=512)
    assert eng.spec.pooling == "last" and eng.spec.causal
    texts = [t for t in TEXTS if t]
    got = eng.encode(texts, normalize_embeddings=False)
    want = _st_encode(folder, texts)
    assert cosine(got, want).min() >= 0.99999


def test_gemma3_dense_modules_match_sentence_transformers(ckpts, tmp_path):
    """EmbeddingGemma's layout: bidirectional Gemma3, mean pooling, two Dense modules
    (Identity, no bias), Normalize."""
    import shutil

    _, src = ckpts("gemma3")
    folder = tmp_path / "gemma-st"
    shutil.copytree(src, folder)
    add_dense(folder, [42, 70, 33], seed=3)
    texts = [t for t in TEXTS if t]
    for device in ("reference", "cpu"):
        eng = zoi.compile(folder, device=device, max_tokens=512)
        assert eng.spec.dense == ((42, 70, False, "none"), (70, 33, False, "none"))
        got = eng.encode(texts)
        assert got.shape == (len(texts), 33)
        want = _st_encode(folder, texts)
        want = want / np.linalg.norm(want, axis=1, keepdims=True)
        assert cosine(got, want).min() >= 0.99999
        np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
        # token embeddings are the transformer's last hidden state, before pool and Dense
        tok = eng.encode(texts, output_value="token_embeddings")
        st_tok = _st_model(folder).encode(texts, output_value="token_embeddings")
        for g, w in zip(tok, st_tok, strict=True):
            w = w.detach().cpu().numpy() if hasattr(w, "detach") else np.asarray(w)
            assert g.shape == w.shape == (len(g), 42)
            assert cosine(g, w).min() >= 0.99999


def test_a_dense_module_with_a_pickle_only_is_refused(ckpts, tmp_path):
    import shutil

    from zoi.errors import ZoiError

    _, src = ckpts("gemma3")
    folder = tmp_path / "gemma-pickle"
    shutil.copytree(src, folder)
    add_dense(folder, [42, 8])
    (folder / "2_Dense" / "model.safetensors").rename(folder / "2_Dense" / "pytorch_model.bin")
    with pytest.raises(ZoiError, match="pickle is never loaded"):
        zoi.compile(folder, device="reference")


def test_a_causal_lm_folder_still_generates_and_a_base_model_embeds(tmp_path):
    """Routing: a *ForCausalLM folder without sentence-transformers modules is a decoder for
    generation; the same architecture as a base model (or with modules.json) is an encoder."""
    from tests.archs.decoder_helpers import build_decoder
    from tests.conftest import save_checkpoint

    from zoi.decoder.compile import decoder_folder

    base = save_checkpoint(build_decoder("qwen3"), tmp_path / "base")
    assert decoder_folder(base) is None
    from tests.conftest import random_hf_model

    lm = random_hf_model(
        "Qwen3Config",
        "Qwen3ForCausalLM",
        0,
        vocab_size=30522,
        hidden_size=40,
        num_hidden_layers=1,
        num_attention_heads=6,
        num_key_value_heads=2,
        head_dim=12,
        intermediate_size=37,
        max_position_embeddings=64,
    )
    lmdir = save_checkpoint(lm, tmp_path / "lm")
    assert decoder_folder(lmdir) is not None
    st = save_checkpoint(lm, tmp_path / "lm-st", pooling="mean")
    assert decoder_folder(st) is None
    eng = zoi.compile(st, device="reference", max_tokens=128)
    assert eng.encode(["hello"]).shape == (1, 40)


# ---------------------------------------------------------------- kernels against the reference
def _rand(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("isa", supported_isas())
@pytest.mark.parametrize(
    "heads,kv,d,window,causal,qk,rope",
    [
        (6, 2, 12, 0, True, True, True),  # Qwen3: GQA, causal, q/k norm, RoPE
        (3, 1, 16, 4, False, True, True),  # Gemma3 sliding layer, bidirectional
        (4, 4, 10, 5, True, False, True),  # Mistral: causal sliding window
        (5, 1, 7, 0, True, False, False),  # odd head dim, MQA, no RoPE
        (2, 2, 33, 3, False, True, False),  # q/k norm without RoPE
    ],
)
def test_attention_kernel_modes(isa, heads, kv, d, window, causal, qk, rope):
    lens = [1, 17, 5, 40, 2]
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    T = int(cu[-1])
    qkv = _rand((T, (heads + 2 * kv) * d), 1)
    qn = (1 + 0.2 * _rand((d,), 2)) if qk else None
    kn = (1 + 0.2 * _rand((d,), 3)) if qk else None
    cs = rope_tables(10000.0, d, 64) if rope else (None, None)
    want = ref.attention(
        qkv.astype(np.float64),
        cu,
        heads,
        d,
        d**-0.5,
        window=window,
        rope_cs=None if not rope else (cs[0].astype(np.float64), cs[1].astype(np.float64)),
        kv_heads=kv,
        causal=causal,
        qk_norm=None if not qk else (qn.astype(np.float64), kn.astype(np.float64), 1e-6),
    )
    out = np.full((T, heads * d), np.nan, np.float32)  # poisoned
    _cpu.k_attention_ext(
        qkv,
        cu,
        heads,
        d,
        d**-0.5,
        out,
        None,
        window,
        cs[0],
        cs[1],
        isa=isa,
        nt=2,
        kv_heads=kv,
        causal=causal,
        q_norm=qn,
        k_norm=kn,
        qk_eps=1e-6,
    )
    assert np.isfinite(out).all()
    f32 = ref.attention(
        qkv,
        cu,
        heads,
        d,
        d**-0.5,
        window=window,
        rope_cs=None if not rope else cs,
        kv_heads=kv,
        causal=causal,
        qk_norm=None if not qk else (qn, kn, 1e-6),
    )
    # a kernel's error at most a few times the float32 reference's own against float64
    bound = max(4 * np.abs(f32 - want).max(), 1e-6)
    assert np.abs(out - want).max() <= bound


@pytest.mark.parametrize("isa", supported_isas())
@pytest.mark.parametrize("H", [1, 7, 42, 129, 384])
@pytest.mark.parametrize("mode", ["rms", "rms_pre_res", "rms_post_res", "ln_post_res"])
def test_norm_kernel_modes(isa, H, mode):
    M = 9
    x, r = _rand((M, H), 4) * 3, _rand((M, H), 5)
    w, b = 1 + 0.3 * _rand((H,), 6), 0.1 * _rand((H,), 7)
    rms = mode.startswith("rms")
    post = mode.endswith("post_res")
    res = None if mode == "rms" else r
    y = np.full((M, H), np.nan, np.float32)
    _cpu.k_layernorm(x, res, w, b, 1e-6, y, isa=isa, nt=2, rms=rms, post=post)
    want = ref.add_layernorm(
        x.astype(np.float64),
        None if res is None else res.astype(np.float64),
        w.astype(np.float64),
        b.astype(np.float64),
        1e-6,
        rms=rms,
        post=post,
    )
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)


def test_spec_refuses_bad_decoder_fields(ckpts, tmp_path):
    import json
    import shutil

    from zoi.errors import ZoiError

    _, src = ckpts("qwen3")
    for field, value, match in [
        ("num_key_value_heads", 4, "multiple of kv_heads"),
        ("rope_theta", 0, "rope_theta"),
        ("rope_scaling", {"rope_type": "yarn", "factor": 4.0}, "rope_scaling"),
    ]:
        folder = tmp_path / f"bad-{field}"
        shutil.copytree(src, folder)
        cfg = json.loads((folder / "config.json").read_text())
        cfg[field] = value
        if field == "rope_theta":
            cfg["rope_parameters"] = {"rope_type": "default", "rope_theta": 0}
        (folder / "config.json").write_text(json.dumps(cfg))
        with pytest.raises(ZoiError, match=match):
            zoi.compile(folder, device="reference")


@pytest.mark.parametrize("arch", DECODER_ARCHS)
def test_cuda_refusal_names_what_it_lacks_or_runs(arch, ckpts):
    """Until the CUDA kernels carry a decoder op, the backend refuses the graph up front,
    naming the piece (never a plausible wrong vector)."""
    from zoi.backends.arch_support import cuda_missing

    _, folder = ckpts(arch)
    g = zoi.compile(folder, device="reference", max_tokens=512).model.graph
    missing = cuda_missing(g)
    kinds = {o.kind for o in g.ops}
    assert "attention" in kinds
    for piece in missing:
        assert isinstance(piece, str) and piece
    if missing:
        assert any("RMSNorm" in m or "causal" in m or "grouped" in m for m in missing)


def test_a_longer_model_limit_than_the_default_arena_truncates_and_says_so(tmp_path, caplog):
    """Qwen3-Embedding allows 32768 positions; the CPU's default arena holds 4096 tokens: the
    compile truncates texts at max_tokens and logs it; an explicit smaller max_tokens is an
    error naming both numbers."""
    import logging

    from tests.archs.decoder_helpers import decoder_checkpoint

    model, folder = decoder_checkpoint(
        "qwen3", tmp_path / "long", pooling="lasttoken", max_position_embeddings=6000
    )
    with caplog.at_level(logging.INFO, logger="zoi"):
        eng = zoi.compile(folder, device="cpu")
    assert eng.spec.max_positions == eng.max_tokens == 4096
    assert any("truncated at 4096" in r.getMessage() for r in caplog.records)
    got = eng.encode(["Hello world!"], normalize_embeddings=False)
    want = hf_hidden(model, eng.tokenize(["Hello world!"])[0])[-1]
    assert cosine(got, want[None]).min() >= 0.99999
    long = eng.tokenize(["word " * 5000])[0]
    assert len(long) == 4096
    with pytest.raises(ValueError, match=r"max_tokens \(512\) must be at least .* \(6000\)"):
        zoi.compile(folder, device="cpu", max_tokens=512)


def test_gemma3_dense_modules_int8_track_fp32(ckpts, tmp_path):
    """INT8 through the Dense modules: their calibration rows are pooled rows (one per text)."""
    import shutil

    from tests.conftest import real_sentences

    _, src = ckpts("gemma3")
    folder = tmp_path / "gemma-st-int8"
    shutil.copytree(src, folder)
    add_dense(folder, [42, 70, 33], seed=3)
    texts = real_sentences(30) + [t for t in TEXTS if t]
    f32 = zoi.compile(folder, device="cpu", max_tokens=512).encode(texts)
    eng = zoi.compile(folder, device="cpu", precision="int8", max_tokens=512)
    q = eng.encode(texts)
    assert q.shape == f32.shape == (len(texts), 33)
    assert np.isfinite(q).all()
    assert cosine(q, f32).min() > 0.995  # random-init 42-wide model
