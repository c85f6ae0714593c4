"""The gemma-embed / qwen3-embed workloads (decoder architectures run as encoders: the
EmbeddingGemma-300m and Qwen3-Embedding-0.6B shapes, random init) on tiny stand-ins of the same
architectures: the sentence-transformers folder, random ids of the whole vocabulary, every
peer's head (pooling, Dense, Normalize) against sentence-transformers' own, the ONNX export
(no token types, bidirectional sliding-window masks, last-token pooling, weights outside a
2 GiB graph), OpenVINO INT8, CTranslate2's refusal, and a harness run."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from zoi.bench import convert as C
from zoi.bench import harness
from zoi.bench import models as M
from zoi.bench import workloads as W
from zoi.bench.head import Head, bidirectional_masks, head_module, read_head
from zoi.bench.providers import BY_NAME, instantiate, missing

from .bench_helpers import quick_config, run_harness

pytest.importorskip("rich")
pytest.importorskip("transformers")

ARCHS = ("gemma-embed", "qwen3-embed")
# tiny versions of the same architectures: Gemma3 keeps its five-sliding-one-full pattern,
# with a window (16 -> |i - j| < 9, bidirectional) shorter than the texts, GQA 3 heads over 1,
# and two Dense modules (48 -> 192 -> 48); Qwen3 keeps GQA (4 over 2) and q / k norms. The
# vocabulary stays at MiniLM's 30522 (the folder's tokenizer must fit it).
TINY = {
    "gemma-embed": dict(
        kw=dict(
            vocab_size=30522,
            hidden_size=48,
            num_hidden_layers=6,
            num_attention_heads=3,
            num_key_value_heads=1,
            head_dim=16,
            intermediate_size=64,
            sliding_window=16,
            layer_types=["sliding_attention"] * 5 + ["full_attention"],
        ),
        dense=(192, 48),
    ),
    "qwen3-embed": dict(
        kw=dict(
            vocab_size=30522,
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            intermediate_size=96,
        ),
    ),
}


def _tiny_table() -> dict:
    out = {}
    for a, o in TINY.items():
        d = dict(M.DECODER_EMBEDDERS[a])
        d.update({k: v for k, v in o.items() if k != "kw"})
        d["kw"] = {**d["kw"], **o["kw"]}
        out[a] = d
    return out


@pytest.fixture(scope="module")
def tiny_cache(tmp_path_factory, model_dir):
    """The bench cache with the tiny stand-ins under the workloads' names (their tokenizer is
    MiniLM's: `model_dir` skips without it)."""
    mp = pytest.MonkeyPatch()
    for a, d in _tiny_table().items():
        mp.setitem(M.DECODER_EMBEDDERS, a, d)
    cache = tmp_path_factory.mktemp("cache")
    refs = {a: M.get_model(a, cache) for a in ARCHS}
    yield cache, refs
    mp.undo()


def _padded(vocab: int, lengths: list[int], seed: int = 3):
    """Right-padded random ids (never 0 inside a row) and their mask, int64 [B, max]."""
    rng = np.random.default_rng(seed)
    n = max(lengths)
    ids = np.zeros((len(lengths), n), np.int64)
    mask = np.zeros_like(ids)
    for r, k in enumerate(lengths):
        ids[r, :k] = rng.integers(1, vocab, k)
        mask[r, :k] = 1
    return ids, mask


def _st_reference(folder, ids, mask) -> np.ndarray:
    """sentence-transformers' own pipeline (Transformer, Pooling, Dense, Normalize) on ids."""
    import torch

    st = pytest.importorskip("sentence_transformers")
    m = st.SentenceTransformer(str(folder), device="cpu").eval()
    with torch.no_grad():
        out = m({"input_ids": torch.from_numpy(ids), "attention_mask": torch.from_numpy(mask)})
    return out["sentence_embedding"].numpy()


def _cos(a, b) -> np.ndarray:
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def test_real_shapes_and_workloads():
    """The configs are the real models' (EmbeddingGemma-300m, Qwen3-Embedding-0.6B) and their
    heads; four workloads of random ids, CPU and CUDA."""
    g = M.DECODER_EMBEDDERS["gemma-embed"]
    kw = g["kw"]
    assert (g["config"], g["model"]) == ("Gemma3TextConfig", "Gemma3TextModel")
    assert (kw["vocab_size"], kw["hidden_size"], kw["num_hidden_layers"]) == (262144, 768, 24)
    assert (kw["num_attention_heads"], kw["num_key_value_heads"], kw["head_dim"]) == (3, 1, 256)
    assert (kw["intermediate_size"], kw["max_position_embeddings"]) == (1152, 2048)
    assert kw["sliding_window"] == 512 and kw["use_bidirectional_attention"] is True
    assert kw["query_pre_attn_scalar"] == 256
    assert kw["layer_types"] == (["sliding_attention"] * 5 + ["full_attention"]) * 4
    rp = kw["rope_parameters"]
    assert (rp["full_attention"]["rope_theta"], rp["sliding_attention"]["rope_theta"]) == (1e6, 1e4)
    assert (g["pooling"], g["dense"], g["normalize"]) == ("mean", (3072, 768), True)
    q = M.DECODER_EMBEDDERS["qwen3-embed"]
    kw = q["kw"]
    assert (q["config"], q["model"]) == ("Qwen3Config", "Qwen3Model")
    assert (kw["vocab_size"], kw["hidden_size"], kw["num_hidden_layers"]) == (151669, 1024, 28)
    assert (kw["num_attention_heads"], kw["num_key_value_heads"], kw["head_dim"]) == (16, 8, 128)
    assert (kw["intermediate_size"], kw["max_position_embeddings"]) == (3072, 32768)
    assert kw["rope_parameters"]["rope_theta"] == 1e6 and kw["tie_word_embeddings"] is True
    assert (q["pooling"], q["dense"], q["normalize"]) == ("lasttoken", (), True)
    names = {w.name: w for w in W.ALL}
    for a in ARCHS:
        assert a in M.MODELS
        for b in (1, 32):
            w = names[f"{a}-{b}x128"]
            assert (w.model, w.kind, w.ids, w.batch, w.seq) == (a, "fixed", "random", b, 128)
            assert set(w.devices) == {"cpu", "cuda"}
    named = [f"{a}-1x128" for a in ARCHS]
    assert {w.name for w in W.select(named, False, {"cuda"})} == set(named)
    # opt-in: the default set (no --workloads) leaves these long rows out
    assert not {w.name for w in W.select(None, False, {"cpu", "cuda"})} & set(named)
    assert not set(W.QUICK) & {w.name for w in W.ALL if w.ids == "random"}


def test_random_ids_of_the_whole_vocabulary(model_dir):
    from zoi.bench.text import Tok

    tok = Tok(model_dir)
    w = next(x for x in W.ALL if x.name == "qwen3-embed-32x128")
    i = W.ALL.index(w)
    rows = W.inputs(w, tok, i, vocab=151669)
    assert len(rows) == 32 and all(r.shape == (128,) and r.dtype == np.int32 for r in rows)
    ids = np.stack(rows)
    assert ids.min() >= 1 and ids.max() < 151669  # never zeros, never outside the table
    assert ids.max() > 30522  # beyond what the folder's tokenizer could give
    assert len({r.tobytes() for r in rows}) == 32  # rows differ
    assert all(np.array_equal(a, b) for a, b in zip(rows, W.inputs(w, tok, i, 151669), strict=True))
    other = W.inputs(next(x for x in W.ALL if x.name == "qwen3-embed-1x128"), tok, i - 1, 151669)
    assert not np.array_equal(other[0], rows[0])  # each workload its own ids
    with pytest.raises(ValueError, match="vocabulary"):
        W.inputs(w, tok, i)


@pytest.mark.parametrize("arch", ARCHS)
def test_tiny_folder_and_every_head_match_sentence_transformers(tiny_cache, arch):
    """The folder is a sentence-transformers model with the real one's head; PyTorch's
    provider (transformers + zoi.bench.head) and zoi FP32 give sentence-transformers' own
    embeddings on right-padded batches of random ids."""
    import zoi

    cache, refs = tiny_cache
    ref = refs[arch]
    real = M.DECODER_EMBEDDERS[arch]
    cfg = json.loads((ref.path / "config.json").read_text())
    assert (ref.hidden, ref.heads, ref.vocab) == (
        cfg["hidden_size"],
        cfg["num_attention_heads"],
        30522,
    )
    assert (cache / ".gitignore").read_text().strip() == "*"  # no weights offered to git
    # the real models' positions (2048, 32768), the benchmark's sequence limit: zoi sizes an
    # engine for max_seq_length tokens at least, and the harness gives it max_len
    assert cfg["max_position_embeddings"] == real["kw"]["max_position_embeddings"]
    st_cfg = json.loads((ref.path / "sentence_bert_config.json").read_text())
    assert st_cfg["max_seq_length"] == ref.max_len == 512
    assert M.get_model(arch, cache).path == ref.path  # cached: the same folder
    head = read_head(ref.path)
    assert head.pooling == real["pooling"] and head.normalize
    assert len(head.dense) == len(real["dense"])
    if arch == "gemma-embed":
        assert cfg["use_bidirectional_attention"] and cfg["sliding_window"] == 16
    assert read_head(M.minilm_path()) == Head()  # the BERT family: mean pooling, as before

    ids, mask = _padded(ref.vocab, [40, 29, 11, 40])  # longer than the tiny window
    want = _st_reference(ref.path, ids, mask)
    assert want.shape == (4, ref.hidden) and np.allclose(np.linalg.norm(want, axis=1), 1, atol=1e-5)

    p = instantiate(
        BY_NAME["torch-fp32"],
        model_dir=str(ref.path),
        artifacts={},
        threads=2,
        max_tokens=512,
    )
    p.load()
    got = p.run(p.feed(ids, mask))
    np.testing.assert_allclose(got, want, atol=2e-6, rtol=0)

    eng = zoi.compile(str(ref.path), device="cpu", max_tokens=512)
    assert (
        eng.spec.normalize
        and eng.spec.pooling == {"mean": "mean", "lasttoken": "last"}[head.pooling]
    )
    seqs = [ids[r, : mask[r].sum()].astype(np.int32) for r in range(len(ids))]
    zp = instantiate(
        BY_NAME["zoi-cpu-fp32"],
        model_dir=str(ref.path),
        artifacts={},
        threads=2,
        max_tokens=512,
    )
    zp.load()
    assert zp.normalize
    z = zp.call(zp.prepare(seqs, 1))
    assert _cos(z, want).min() >= 0.99999, _cos(z, want)


@pytest.mark.parametrize("arch", ARCHS)
def test_onnx_export_runs_the_same_computation(tiny_cache, arch):
    """The exported graph (no token types; Gemma3's bidirectional sliding-window masks built
    in the graph; Qwen3's causal mask and last-token pooling) matches sentence-transformers
    on shapes other than the export example's, FP32 fused and INT8."""
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    cache, refs = tiny_cache
    ref = refs[arch]
    assert C.model_inputs(ref) == ("input_ids", "attention_mask")
    f32 = C.onnx_fp32(ref, cache)
    stats = C.fusion_stats(f32)
    assert stats is not None and stats["attention_fused"] is False  # recorded, not hidden
    assert stats["fused_ops"].get("SimplifiedLayerNormalization")  # RMSNorm fused
    q = C.onnx_int8(ref, cache)
    assert C.external_data(f32) is None and C.external_data(q) is None  # small: one file
    for lengths in ([37, 20, 5], [128], [1, 3]):
        ids, mask = _padded(ref.vocab, lengths, seed=len(lengths))
        want = _st_reference(ref.path, ids, mask)
        for path, tol in ((C.onnx_raw(ref, cache), 1e-6), (f32, 1e-6), (q, 0.02)):
            s = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
            assert {i.name for i in s.get_inputs()} == {"input_ids", "attention_mask"}
            got = s.run(None, {"input_ids": ids, "attention_mask": mask})[0]
            assert got.shape == want.shape and np.isfinite(got).all()
            assert _cos(got, want).min() > 1 - tol, (path.name, lengths, _cos(got, want))
            if tol < 1e-3:
                np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)


def test_bidirectional_masks_are_transformers_own(tiny_cache):
    """The export's Gemma3 masks (index arithmetic, not transformers' vmap) give the hidden
    states transformers' own masks give, padding and window included; Qwen3 needs none."""
    import torch
    from transformers import AutoModel

    _, refs = tiny_cache
    ids, mask = _padded(refs["gemma-embed"].vocab, [40, 23, 7])
    t_ids, t_mask = torch.from_numpy(ids), torch.from_numpy(mask)
    keep = t_mask.bool()
    # additive masks for eager attention (the export), boolean ones for SDPA (CUDA graphs)
    for attn, additive in (("eager", True), ("sdpa", False)):
        path = str(refs["gemma-embed"].path)
        enc = AutoModel.from_pretrained(path, attn_implementation=attn).eval()
        masks = bidirectional_masks(enc.config, additive=additive)
        assert masks is not None and enc.config.sliding_window == 9
        with torch.no_grad():
            a = enc(input_ids=t_ids, attention_mask=t_mask, use_cache=False).last_hidden_state
            am = masks(t_mask)
            b = enc(input_ids=t_ids, attention_mask=am, use_cache=False).last_hidden_state
        assert am["sliding_attention"].dtype == (torch.float32 if additive else torch.bool)
        torch.testing.assert_close(a[keep], b[keep], atol=1e-6, rtol=0)
    qcfg = AutoModel.from_pretrained(str(refs["qwen3-embed"].path)).config
    assert bidirectional_masks(qcfg) is None


def test_onnx_weights_outside_a_large_graph(tiny_cache, tmp_path, monkeypatch):
    """Past EXTERNAL_DATA_BYTES (Qwen3-Embedding-0.6B in FP32: 2.4 GB > protobuf's 2 GiB) every
    ONNX artifact keeps its weights in one `<graph>.data` beside it, renamed into place before
    the graph; ONNX Runtime runs them and the provider counts their bytes."""
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    _, refs = tiny_cache
    ref = refs["qwen3-embed"]
    monkeypatch.setattr(C, "EXTERNAL_DATA_BYTES", 0)
    raw = C.onnx_raw(ref, tmp_path)
    f32, q = C.onnx_fp32(ref, tmp_path), C.onnx_int8(ref, tmp_path)
    for p in (raw, f32, q):
        data = C.external_data(p)
        assert data is not None and data.stat().st_size > p.stat().st_size, p
        assert not p.with_name(p.name + ".partial").exists()
    assert sorted(x.name for x in raw.parent.iterdir() if x.suffix == ".data") == sorted(
        p.name + ".data" for p in (raw, f32, q)
    )
    ids, mask = _padded(ref.vocab, [30, 12])
    want = _st_reference(ref.path, ids, mask)
    for p in (raw, f32):
        got = ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]).run(
            None, {"input_ids": ids, "attention_mask": mask}
        )[0]
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
    prov = instantiate(
        BY_NAME["onnxruntime-int8"],
        model_dir=str(ref.path),
        artifacts={"onnx": str(q)},
        threads=2,
        max_tokens=512,
    )
    prov.load()
    assert _cos(prov.run(prov.feed(ids, mask)), want).min() > 0.98
    assert prov.memory()["weights_bytes"] > C.external_data(q).stat().st_size
    if not missing(BY_NAME["openvino-fp32"]):  # OpenVINO reads the graph and its weights
        ov = instantiate(
            BY_NAME["openvino-fp32"],
            model_dir=str(ref.path),
            artifacts={"xml": str(C.openvino_fp32(ref, tmp_path))},
            threads=2,
            max_tokens=512,
        )
        ov.load()
        np.testing.assert_allclose(ov.run(ov.feed(ids, mask)), want, atol=1e-5, rtol=0)


@pytest.mark.parametrize("arch", ARCHS)
def test_openvino_int8_converts(tiny_cache, arch):
    pytest.importorskip("openvino")
    pytest.importorskip("nncf")
    cache, refs = tiny_cache
    ref = refs[arch]
    xml = C.openvino_int8(ref, cache, subset=40)
    p = instantiate(
        BY_NAME["openvino-int8"],
        model_dir=str(ref.path),
        artifacts={"xml": str(xml)},
        threads=2,
        max_tokens=512,
    )
    p.load()
    assert p.names == {"input_ids", "attention_mask"}
    ids, mask = _padded(ref.vocab, [128, 128])
    got = p.run(p.feed(ids, mask))
    assert _cos(got, _st_reference(ref.path, ids, mask)).min() > 0.98


def test_ctranslate2_refuses_with_the_reason(tiny_cache):
    """CTranslate2 converts Gemma3 / Qwen3 as language models only (Generator: logits), which
    no Encoder loads: the conversion says so, per model, and the harness records it."""
    pytest.importorskip("ctranslate2")
    cache, refs = tiny_cache
    b = harness.Bench(harness.Config(cache_dir=cache, device="cpu"))

    class _Prog:
        def update(self, *a, **k):
            pass

    b.prog, b.task = _Prog(), 0
    spec = BY_NAME["ctranslate2-int8"]
    for a in ARCHS:
        assert spec.name not in b.convert_all(refs[a], [spec])
    assert [(r["provider"], r["model"]) for r in b.refusals] == [(spec.name, a) for a in ARCHS]
    assert all("no encoder" in r["reason"] for r in b.refusals)
    wls = [w for w in W.ALL if w.model == "qwen3-embed"]
    b.refusal_rows(refs["qwen3-embed"], wls, [spec])
    assert [(r["workload"], "no encoder" in r["error"]) for r in b.rows] == [
        (w.name, True) for w in wls
    ]


def test_zoi_int8_compiles_the_gemma_head(tiny_cache, tmp_path):
    """INT8 with sentence-transformers' Dense modules after the pool (their calibration rows
    are pooled rows, one per text, not token rows)."""
    from zoi.bench.providers.zoi_engine import ZoiProvider

    _, refs = tiny_cache
    arts = ZoiProvider.convert(BY_NAME["zoi-cpu-int8"], refs["gemma-embed"], tmp_path)
    assert (tmp_path / "gemma-embed").is_dir() and arts["artifact"]


@pytest.mark.slow
def test_harness_runs_the_decoder_workloads(tiny_cache, tmp_path):
    """Every requested peer times both architectures at 1x128 and 32x128 on random ids, or
    carries an error row naming why it could not (CTranslate2: no encoder)."""
    cache, refs = tiny_cache
    names = [
        "zoi-cpu-fp32",
        "zoi-cpu-int8",
        "torch-fp32",
        "onnxruntime-fp32",
        "onnxruntime-int8",
        "openvino-int8",
        "ctranslate2-int8",
    ]
    names = [n for n in names if not missing(BY_NAME[n])]
    wl = [f"{a}-{s}" for a in ARCHS for s in ("1x128", "32x128")]
    cfg = quick_config(tmp_path / "run.json", names, wl, cache_dir=cache, rss=True)
    res = run_harness(cfg)
    cells = {(r["provider"], r["workload"]): r for r in res["results"]}
    refused = {(x["provider"], x["model"]) for x in res["refusals"]}
    for n in names:
        for w in wl:
            r = cells.get((n, w))
            assert r is not None, (n, w)
            model = w.rsplit("-", 1)[0]
            if n.startswith("ctranslate2"):
                assert "no encoder" in r["error"] and (n, model) in refused
            else:
                assert "p50_ms" in r, (n, w, r.get("error", "")[:500])
                b = int(w.rsplit("-", 1)[1].split("x")[0])
                assert r["batch"] == b and r["tokens"] == 128 * b and r["seq"] == 128
                assert math.isfinite(r["p50_ms"]) and r["p50_ms"] > 0
    mem = {(m["provider"], m["model"]): m for m in res["memory"]}
    for a in ARCHS:
        m = mem[("torch-fp32", a)]
        assert m["weights_bytes"] > refs[a].vocab * refs[a].hidden * 4  # the table at least
        assert m["peak_rss_bytes"] > m["weights_bytes"]
    assert {w["name"]: w["ids"] for w in res["workloads"]} == dict.fromkeys(wl, "random")
    assert res["models"]["qwen3-embed"]["hidden"] == 64


def test_head_module_pools_the_last_real_token(monkeypatch):
    """Last-token pooling on right-padded rows reads each row's own last real token."""
    torch = pytest.importorskip("torch")
    from zoi.bench import head as H

    h = torch.arange(2 * 5 * 3, dtype=torch.float32).reshape(2, 5, 3)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]])
    monkeypatch.setattr(H, "read_head", lambda d: Head("lasttoken", (), False))
    torch.testing.assert_close(head_module("unused")(h, mask), torch.stack([h[0, 4], h[1, 1]]))


def test_large_decoder_graphs_skip_the_offline_optimiser(tiny_cache, tmp_path, monkeypatch):
    """Past SESSION_FUSIONS_BYTES a decoder embedder's graph goes to ONNX Runtime as exported
    (its session fuses at load): the offline optimiser is never called, INT8 quantises it."""
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    _, refs = tiny_cache
    ref = refs["qwen3-embed"]
    monkeypatch.setattr(C, "SESSION_FUSIONS_BYTES", 0)
    import onnxruntime.transformers.optimizer as opt

    def boom(*a, **k):
        raise AssertionError("the offline optimiser ran")

    monkeypatch.setattr(opt, "optimize_model", boom)
    raw = C.onnx_raw(ref, tmp_path)
    assert C.onnx_fp32(ref, tmp_path) == raw
    q = C.onnx_int8(ref, tmp_path)
    assert q.exists() and q != raw


def test_int8_saturation_read_from_the_cpu_flags():
    """ONNX Runtime's INT8 export takes 7-bit weights exactly where its x86 products saturate
    (AVX2 / AVX-512 without VNNI), read from /proc/cpuinfo's flags."""
    assert C.int8_saturates("flags\t\t: fpu sse2 avx2 fma\n")
    assert C.int8_saturates("flags\t\t: avx2 avx512f avx512bw\n")
    assert not C.int8_saturates("flags\t\t: avx2 avx512f avx512_vnni\n")
    assert not C.int8_saturates("flags\t\t: avx2 avx_vnni\n")
    assert not C.int8_saturates("flags\t\t: sse2 sse4_2\n")  # no AVX2: not this kernel
    assert not C.int8_saturates("")
