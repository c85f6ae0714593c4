"""The MPNet-base / ModernBERT-base workloads' plumbing, on tiny stand-ins of the
same architectures: the random-init folder, the peers' exports (no token types for these two,
unfused attention recorded), CTranslate2's refusal recorded per model, and a harness run."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from zoi.bench import convert as C
from zoi.bench import harness
from zoi.bench import models as M
from zoi.bench import workloads as W
from zoi.bench.providers import BY_NAME

from .bench_helpers import quick_config, run_harness

pytest.importorskip("rich")
pytest.importorskip("transformers")

ARCHS = ("mpnet-base", "modernbert-base")
TINY = {
    "mpnet-base": dict(
        hidden_size=40, num_hidden_layers=2, num_attention_heads=5, intermediate_size=71
    ),
    "modernbert-base": dict(
        hidden_size=40, num_hidden_layers=4, num_attention_heads=5, intermediate_size=37
    ),
}


def test_real_shapes_and_workloads():
    """The configs are the real models' (all-mpnet-base-v2, ModernBERT-base), CPU workloads."""
    mp, mb = M._RANDOM_ARCHS["mpnet-base"][2], M._RANDOM_ARCHS["modernbert-base"][2]
    assert (mp["num_hidden_layers"], mp["hidden_size"], mp["num_attention_heads"]) == (12, 768, 12)
    assert (mp["vocab_size"], mp["intermediate_size"]) == (30527, 3072)
    assert (mb["num_hidden_layers"], mb["hidden_size"], mb["num_attention_heads"]) == (22, 768, 12)
    assert (mb["vocab_size"], mb["intermediate_size"], mb["local_attention"]) == (50368, 1152, 128)
    assert mb["global_attn_every_n_layers"] == 3
    names = {w.name: w for w in W.ALL}
    for a in ARCHS:
        for shape in ("1x128", "32x128"):
            w = names[f"{a}-{shape}"]
            assert w.model == a and w.kind == "fixed" and w.devices == ("cpu",)
    assert not W.select([f"{ARCHS[0]}-1x128"], False, {"cuda"})  # CPU only
    with pytest.raises(ValueError, match="unknown workload"):
        W.select(["mpnet-base-8x128"], False, {"cpu"})


@pytest.fixture(scope="module")
def tiny_cache(tmp_path_factory, model_dir):
    """The bench cache with tiny MPNet / ModernBERT stand-ins under the workloads' names (their
    tokenizer is MiniLM's: `model_dir` skips without it)."""
    mp = pytest.MonkeyPatch()
    for a, kw in TINY.items():
        cname, mname, real = M._RANDOM_ARCHS[a]
        mp.setitem(M._RANDOM_ARCHS, a, (cname, mname, {**real, **kw}))
    cache = tmp_path_factory.mktemp("cache")
    refs = {a: M.get_model(a, cache) for a in ARCHS}
    yield cache, refs
    mp.undo()


@pytest.mark.parametrize("arch", ARCHS)
def test_tiny_folder_loads_everywhere(tiny_cache, arch):
    import torch
    from transformers import AutoModel

    import zoi

    cache, refs = tiny_cache
    ref = refs[arch]
    assert (ref.hidden, ref.heads) == (40, 5)
    assert (
        json.loads((ref.path / "1_Pooling" / "config.json").read_text())["word_embedding_dimension"]
        == 40
    )
    again = M.get_model(arch, cache)  # cached: same folder, not rewritten
    assert again.path == ref.path
    eng = zoi.compile(str(ref.path), device="cpu", max_tokens=512)
    assert eng.spec.arch == arch.split("-")[0] and eng.spec.pooling == "mean"
    tok = eng.tokenize(["a real sentence of text", "and another, a little longer one"])
    got = eng.encode(
        [
            "a real sentence of text",
            "and another, a little longer one",
        ],
        normalize_embeddings=False,
    )
    m = AutoModel.from_pretrained(str(ref.path)).eval()
    for i, ids in enumerate(tok):
        with torch.no_grad():
            h = m(input_ids=torch.from_numpy(ids.astype(np.int64))[None]).last_hidden_state[0]
        want = h.mean(0).numpy()
        cos = float(got[i] @ want / np.linalg.norm(got[i]) / np.linalg.norm(want))
        assert cos >= 0.99999, (arch, i, cos)


@pytest.mark.parametrize("arch", ARCHS)
def test_onnx_exports_without_token_types(tiny_cache, arch):
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    import torch

    cache, refs = tiny_cache
    ref = refs[arch]
    assert C.model_inputs(ref) == ("input_ids", "attention_mask")
    f32 = C.onnx_fp32(ref, cache)
    stats = C.fusion_stats(f32)
    assert stats is not None and stats["attention_fused"] is False  # recorded, not hidden
    q = C.onnx_int8(ref, cache)
    assert C.fusion_stats(q) == stats  # the INT8 graph is the fused one, quantised
    ids = np.array([[101, 2023, 2003, 1037, 3793, 102, 0, 0]], np.int64)
    mask = (ids != 0).astype(np.int64)
    ids2, mask2 = np.repeat(ids, 2, 0), np.repeat(mask, 2, 0)
    ids2[1, 6:], mask2[1, 6:] = [2000, 102], 1  # a second, longer row
    m = C._pooled_module(ref.path, with_types=False)
    with torch.no_grad():
        want = m(torch.from_numpy(ids2), torch.from_numpy(mask2)).numpy()
    for path, tol in ((f32, 1e-4), (q, 0.2)):
        s = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        assert {i.name for i in s.get_inputs()} == {"input_ids", "attention_mask"}
        got = s.run(None, {"input_ids": ids2, "attention_mask": mask2})[0]
        assert np.isfinite(got).all()
        cos = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
        assert cos.min() > 1 - tol, (path.name, cos)
    assert C.model_inputs(M.ModelRef("x", M.minilm_path(), 384, 6, 12, 256)) == C.INPUTS


class _Prog:
    def update(self, *a, **k):
        pass


@pytest.mark.parametrize("arch", ARCHS)
def test_ctranslate2_refusal_is_per_model(tiny_cache, arch):
    pytest.importorskip("ctranslate2")
    cache, refs = tiny_cache
    b = harness.Bench(harness.Config(cache_dir=cache, device="cpu"))
    b.prog, b.task = _Prog(), 0
    spec = BY_NAME["ctranslate2-int8"]
    arts = b.convert_all(refs[arch], [spec])
    assert spec.name not in arts
    (r,) = b.refusals
    assert r["provider"] == spec.name and r["model"] == arch
    assert "No conversion is registered" in r["reason"]
    assert spec.name not in b.status  # still free to run the next model (bert-base)
    res = b.result([], [spec], {}, [0.0, 0.0, 0.0], 0.0)
    st = {p["name"]: p for p in res["providers"]}[spec.name]
    assert st["status"] == "failed" and arch in st["reason"]  # it ran nothing at all
    assert res["refusals"] == b.refusals


@pytest.mark.slow
def test_harness_runs_the_new_workloads(tiny_cache, tmp_path):
    pytest.importorskip("onnxruntime")
    from zoi.bench.providers import missing

    cache, _ = tiny_cache
    names = ["zoi-cpu-fp32", "zoi-cpu-int8", "onnxruntime-int8", "ctranslate2-int8"]
    names = [n for n in names if not missing(BY_NAME[n])]
    wl = ["mpnet-base-1x128", "modernbert-base-1x128"]
    res = run_harness(quick_config(tmp_path / "run.json", names, wl, cache_dir=cache))
    rows = [r for r in res["results"] if "p50_ms" in r]
    ran = {(r["provider"], r["workload"]) for r in rows}
    for n in names:
        if n.startswith("ctranslate2"):
            continue
        for a in ARCHS:
            assert (n, f"{a}-1x128") in ran, (n, a, res["results"])
    for r in rows:
        assert math.isfinite(r["p50_ms"]) and r["p50_ms"] > 0 and r["batch"] == 1
        assert r["tokens"] == 128
    if "ctranslate2-int8" in names:
        assert {x["model"] for x in res["refusals"]} == set(ARCHS)
    mem = {(m["provider"], m["model"]): m for m in res["memory"]}
    if ("onnxruntime-int8", "mpnet-base") in mem:
        assert mem[("onnxruntime-int8", "mpnet-base")]["ort_fusions"]["attention_fused"] is False
