"""`zoi bench --device cuda` on the decode workloads (zoi.bench.decode): the zoi-cuda
provider path on a tiny random decoder (the Triton interpreter in CI; compiled, with CUDA graphs,
under ZOI_TRITON_COMPILED=1), the row's fields and the JSON around it, provider selection per
device, and the clear errors (unknown provider, no GPU)."""

from __future__ import annotations

import json
import math

import pytest
from tests.decoder.cuda.helpers import INTERP, torch

from zoi.bench import decode
from zoi.bench.cli import main as bench_main

NEW = 3


def pos(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


@pytest.fixture
def tiny(ckpt, monkeypatch):
    """A `tiny-decode` workload on the tests' qwen2 checkpoint (no real-shape folder written)."""
    folder = ckpt("qwen2")
    monkeypatch.setitem(decode.WORKLOADS, "tiny-decode", "tiny")
    monkeypatch.setattr(decode, "model_folder", lambda shape, cache: folder)
    return folder


def test_zoi_cuda_row(tiny, tmp_path):
    out = tmp_path / "r_cuda_decode.json"
    res = decode.run(
        ["tiny-decode"],
        ["zoi-cuda-w8"],
        prompt_len=8,
        new_tokens=NEW,
        streams=[2, 1],
        cache=tmp_path,
        out=out,
        devices={"cuda"},
    )
    assert json.loads(out.read_text()) == json.loads(json.dumps(res))
    (r,) = res["rows"]
    assert "error" not in r, r.get("error")
    assert (r["workload"], r["provider"], r["precision"]) == (
        "tiny-decode",
        "zoi-cuda-w8",
        "w8",
    )
    assert res["precision_words"] == decode.PRECISION_WORDS
    for k in ("ttft_ms", "decode_ms_per_token", "decode_ms_p90", "tokens_per_s_streams"):
        assert pos(r[k]), (k, r[k])
    assert pos(r["decode_tokens_per_s_streams"]) and pos(r["build_s"])
    assert r["decode_ms_p90"] >= r["decode_ms_per_token"]
    assert r["streams"] == 2 and sorted(r["by_streams"]) == ["1", "2"]
    for n, s in r["by_streams"].items():
        assert s["streams"] == int(n) and s["tokens"] == int(n) * NEW  # every token counted
        for k in ("tokens_per_s", "decode_tokens_per_s", "ttft_ms_all_prefills", "decode_step_ms"):
            assert pos(s[k]), (n, k, s[k])
        assert ("time_decode_graph_us" in s) == r["graphs"]
        if r["graphs"]:
            assert pos(s["time_decode_graph_us"])
    assert r["tokens_per_s_streams"] == r["by_streams"]["2"]["tokens_per_s"]
    assert r["memory"]["weights_bytes"] > 0
    if INTERP:
        assert r["device"] == "triton interpreter (CPU)" and not r["graphs"]
        assert res["triton_interpret"]
    else:  # pragma: no cover - the GPU run
        assert r["graphs"] and pos(r["time_decode_graph_us_b1"])
    assert res["streams"] == {"cuda": [1, 2]} and res["new_tokens"] == NEW
    assert {"torch", "triton", "transformers"} <= set(res["versions"])
    assert (res["gpu"] is None) == (not torch.cuda.is_available())
    # the targets name the decoder's workloads, which this run did not measure
    assert len(res["targets"]) == 2 and all(v is None for v in res["targets"].values())


def test_targets_from_rows():
    rows = [
        {
            "workload": "llama-3.2-1b-decode",
            "provider": "zoi-cuda-w8",
            "decode_ms_per_token": 0.3,
        },
        {
            "workload": "qwen2.5-0.5b-decode",
            "provider": "zoi-cuda-w8",
            "by_streams": {"32": {"tokens_per_s": 9000.0}},
        },
        {
            "workload": "qwen2.5-0.5b-decode",
            "provider": "transformers-cuda-fp16",
            "by_streams": {"32": {"tokens_per_s": 4000.0}},
        },
    ]
    b1, x32 = decode.targets(rows).values()
    assert b1 == {"ms": 0.3, "met": True}
    assert x32["ratio"] == 2.25 and x32["met"] is False
    rows[2]["error"] = "failed"
    assert list(decode.targets(rows).values())[1] is None


def test_providers_per_device():
    assert decode.select(None, {"cpu"}) == list(decode.CPU_PROVIDERS)
    assert decode.select(None, {"cpu"})[:2] == ["zoi-fp32", "zoi-int8"]
    assert decode.select(None, {"cuda"}) == [
        "zoi-cuda-w8",
        "zoi-cuda-int8",
        "zoi-cuda-fp16",
        "transformers-cuda-fp16",
    ]
    assert decode.select(["zoi-*"], {"cuda"}) == ["zoi-cuda-w8", "zoi-cuda-int8", "zoi-cuda-fp16"]
    assert decode.select(["zoi-int8"], {"cuda"}) == []  # a CPU provider on --device cuda
    # the earlier names of the W8A8 providers select them; no provider is named w8a8 any more
    assert decode.select(["zoi-cuda-w8a8"], {"cuda"}) == ["zoi-cuda-int8"]
    assert decode.select(["zoi-w8a8"], {"cpu"}) == ["zoi-int8"]
    assert not any("w8a8" in p for p in decode.PROVIDERS)
    assert decode._ints(["8", "32"]) == decode._ints(["8,32"]) == [8, 32]


def test_unknown_provider(capsys, tmp_path):
    rc = bench_main(
        ["--device", "cuda", "--workloads", "qwen2.5-0.5b-decode", "--providers", "nope"]
        + ["--out", str(tmp_path / "x.json")]
    )
    err = capsys.readouterr().err
    assert rc == 2 and "no decode provider matches ['nope']" in err and "zoi-cuda-int8" in err
    assert not (tmp_path / "x.json").exists()
    # through the API: an error row, no checkpoint written
    res = decode.run(["qwen2.5-0.5b-decode"], ["nope"], cache=tmp_path, devices={"cuda"})
    (r,) = res["rows"]
    assert "unknown provider 'nope'" in r["error"] and "zoi-cuda-fp16" in r["error"]
    assert not (tmp_path / "decoders").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without a GPU")
def test_cuda_without_gpu(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # no interpreter fallback
    rc = bench_main(
        ["--device", "cuda", "--workloads", "qwen2.5-0.5b-decode", "--streams", "4,8", "16"]
        + ["--cache-dir", str(tmp_path), "--out-dir", str(tmp_path / "out")]
    )
    assert rc == 1  # no row measured
    (f,) = (tmp_path / "out").iterdir()
    assert f.name.endswith("_cuda_decode.json")
    res = json.loads(f.read_text())
    assert res["devices"] == ["cuda"] and res["streams"] == {"cuda": [4, 8, 16]}
    assert "int8 = W8A8" in res["precision_words"] and "w8 = weight-only" in res["precision_words"]
    assert res["new_tokens"] == 128 and res["command"].startswith("zoi bench --device cuda")
    assert [r["provider"] for r in res["rows"]] == list(decode.CUDA_PROVIDERS)
    for r in res["rows"]:
        assert "no CUDA GPU visible to torch" in r["error"] and r["device"] == "cuda"
    assert all(v is None for v in res["targets"].values())
    assert not (tmp_path / "decoders").exists()  # nothing to run: no checkpoint written


def test_compile_decoder_cuda_precisions(ckpt, tmp_path):
    """zoi's words on cuda: "w8" weight-only INT8, "int8" W8A8 ("w8a8" the same), fp16, fp32
    (the default); anything else is refused naming the choices, before the folder is read."""
    from zoi.decoder.compile import compile_decoder
    from zoi.errors import InputError

    kw = dict(device="cuda", max_seq_len=32, max_batch=1)
    g = compile_decoder(ckpt("qwen2"), precision="fp16", **kw)
    assert g.backend.precision == "fp16" and g.backend.max_prefill == 32 and not g.backend.a8
    g = compile_decoder(ckpt("qwen2"), max_tokens=48, **kw)
    assert g.backend.max_prefill == 48  # max_tokens: the packed prefill tokens on cuda
    assert g.precision == g.backend.precision == "fp32" and g.backend.wbytes == 4
    for word, want, a8 in (("w8", "w8", False), ("int8", "int8", True), ("w8a8", "int8", True)):
        g = compile_decoder(ckpt("qwen2"), precision=word, **kw)
        assert (g.precision, g.backend.precision, g.backend.a8) == (want, want, a8), word
        assert g.backend.wbytes == 1 and g.backend.layers[0]["qkv"][1] is not None  # INT8 W
    with pytest.raises(InputError, match=r"'int4'.*'cuda'.*'w8' \(weight-only INT8\)"):
        compile_decoder(tmp_path / "not-a-folder", device="cuda", precision="int4")
    with pytest.raises(InputError, match=r"'fp16'.*'cpu'.*'fp32' or 'int8' \(W8A8"):
        compile_decoder(ckpt("qwen2"), precision="fp16")  # the CPU's list
