"""What a new user hits first: hints, messages, file modes, output formats, the
progress flag, Hugging Face ids from the local cache, sentence-transformers' encode arguments."""

from __future__ import annotations

import io
import json
import os
import shutil
import sys

import numpy as np
import pytest

import zoi
from zoi.cli import main
from zoi.errors import CheckpointError, ZoiError

CALIB = ["a short text", "the quick brown fox jumps over the lazy dog", "hello world again"]


@pytest.fixture(scope="module")
def int8_art(small_bert, tmp_path_factory):
    """An INT8 artifact of a copy of small_bert, plus the copy (tests may move it)."""
    d = tmp_path_factory.mktemp("int8")
    src = shutil.copytree(small_bert, d / "src-model")
    art = d / "art"
    zoi.compile(src, device="reference", precision="int8", max_tokens=128, calibration=CALIB).save(
        art
    )
    return art, src


# ---- 2: the bench's install hint ---------------------------------------------------------------
def test_bench_skip_hint_keeps_brackets(tmp_path):
    from rich.console import Console

    from zoi.bench.harness import Bench, Config
    from zoi.bench.providers import SPECS, missing
    from zoi.bench.report import print_report

    con = Console(record=True, width=200, file=io.StringIO())
    b = Bench(Config(cache_dir=tmp_path), console=con)
    spec = SPECS[0]
    why = f"python package `{spec.requires[0]}` is not installed (pip install 'zoi[bench]')"
    assert missing(spec) is None or "zoi[bench]" in missing(spec)
    b.skip(spec.name, why)
    assert "pip install 'zoi[bench]'" in con.export_text()
    res = {
        "providers": [{"name": spec.name, "label": spec.name, "status": "skipped", "reason": why}],
        "workloads": [],
        "results": [],
    }
    print_report(res, con)
    assert "pip install 'zoi[bench]'" in con.export_text()


# ---- 3: zoi eval ARTIFACT --reference MODEL_DIR ----------------------------------------------
def test_eval_moved_source_needs_reference(int8_art, tmp_path, capsys):
    art, src = int8_art
    texts = tmp_path / "t.txt"
    texts.write_text("\n".join(CALIB + ["another sentence", "and one more"]) + "\n")
    moved = src.with_name("moved-model")
    os.replace(src, moved)
    try:
        rc = main(["eval", str(art), "--texts", str(texts), "-q"])
        err = capsys.readouterr().err
        assert rc == 2
        assert "--reference MODEL_DIR" in err and str(src) in err and "not there" in err
        assert "not a directory" not in err
        out_json = tmp_path / "rep.json"
        rc = main(
            ["eval", str(art), "--reference", str(moved), "--texts", str(texts), "-q"]
            + ["--json", str(out_json)]
        )
        assert rc == 0, capsys.readouterr().err
        rep = json.loads(out_json.read_text())
        assert rep["reference"] == str(moved) and rep["texts"] == 5
        assert 0.9 < rep["embedding"]["cos_min"] <= 1.0 + 1e-6
    finally:
        os.replace(moved, src)


def test_eval_reference_must_be_the_same_model(int8_art, tmp_path, capsys):
    from conftest import build_hf_model, save_checkpoint

    art, _ = int8_art
    other = save_checkpoint(build_hf_model("bert", hidden_size=40, num_attention_heads=4), tmp_path)
    rc = main(["eval", str(art), "--reference", str(other), "-q"])
    err = capsys.readouterr().err
    assert rc == 2 and "is not the model" in err and "hidden 40 vs 60" in err


# ---- 4: artifacts honour the umask -----------------------------------------------------------
@pytest.mark.parametrize("mask,dmode,fmode", [(0o022, 0o755, 0o644), (0o077, 0o700, 0o600)])
def test_artifact_modes_follow_umask(small_bert, tmp_path, mask, dmode, fmode):
    from zoi.engine import current_umask

    eng = zoi.compile(small_bert, device="reference", max_tokens=128)
    old = os.umask(mask)
    try:
        assert current_umask() == mask
        art = eng.save(tmp_path / "art")
        eng.save(art)  # overwriting keeps the modes too
    finally:
        os.umask(old)
    assert os.stat(art).st_mode & 0o777 == dmode
    for f in ("zoi.json", "weights.safetensors", "tokenizer.json"):
        assert os.stat(art / f).st_mode & 0o777 == fmode, f


# ---- 6: zoi encode -o x.csv, unknown extensions, zoi info ART --------------------------------
def test_encode_writes_csv(small_bert, tmp_path, capsys):
    out = tmp_path / "emb.csv"
    args = ["encode", "-m", str(small_bert), "--device", "reference", "hello", "big world"]
    assert main([*args, "-o", str(out)]) == 0
    got = np.loadtxt(out, delimiter=",", ndmin=2)
    want = zoi.compile(small_bert, device="reference").encode(["hello", "big world"])
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-8)
    assert not out.read_text().lstrip().startswith("{")


@pytest.mark.parametrize("name", ["emb.txt", "emb", "emb.parquet"])
def test_encode_refuses_unknown_output_extension(small_bert, tmp_path, capsys, name):
    out = tmp_path / name
    rc = main(["encode", "-m", str(small_bert), "--device", "reference", "x", "-o", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and "unknown output format" in err and ".csv" in err and ".npy" in err
    assert not out.exists()


def test_info_quant_details_not_cut(int8_art, capsys, monkeypatch):
    from zoi.tools.info import quant_details

    art, _ = int8_art
    monkeypatch.setenv("COLUMNS", "400")
    assert main(["info", str(art)]) == 0
    out = capsys.readouterr().out
    meta = json.loads((art / "zoi.json").read_text())
    assert meta["quant"]
    for name, q in meta["quant"].items():
        info = q.get("info", {})
        line = next(ln for ln in out.splitlines() if f" {name} " in ln)
        details = quant_details(info)
        assert details in line, (details, line)
        for key in info:
            assert f"{key}=" in details
    # a per-channel list is summarised, never printed in full or cut
    assert (
        quant_details({"in_scale": [0.5] * 384, "a": 1.23456}) == "in_scale=[384 values], a=1.235"
    )


# ---- 5: the progress flag of zoi encode ------------------------------------------------------
def test_encode_progress_flag(small_bert, tmp_path, capsys):
    f = tmp_path / "t.txt"
    f.write_text("one\ntwo\nthree\n")
    base = ["encode", "-m", str(small_bert), "--device", "reference", "-f", str(f)]
    assert main([*base, "--progress"]) == 0
    cap = capsys.readouterr()
    # a file streams in chunks (its length is not read ahead): the bar counts texts
    assert "encode" in cap.err and "3text" in cap.err
    assert len(json.loads(cap.out)["embeddings"]) == 3
    assert main([*base, "--no-progress"]) == 0
    assert "3text" not in capsys.readouterr().err
    assert main(base) == 0  # default: no bar for 3 texts off a terminal
    assert "3text" not in capsys.readouterr().err


# ---- 7: Hugging Face ids from the local cache -------------------------------------------------
def _fake_hub_cache(root, model_dir, repo="sentence-transformers/tiny-bert", rev="0123abcd"):
    """The layout huggingface_hub writes: snapshots/REV/FILE -> ../../blobs/HASH."""
    import hashlib

    base = root / ("models--" + repo.replace("/", "--"))
    (base / "blobs").mkdir(parents=True)
    (base / "refs").mkdir()
    (base / "refs" / "main").write_text(rev)
    for p in sorted(model_dir.rglob("*")):
        if p.is_dir():
            continue
        rel = p.relative_to(model_dir)
        h = hashlib.sha256(p.read_bytes()).hexdigest()
        shutil.copy(p, base / "blobs" / h)
        link = base / "snapshots" / rev / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(base / "blobs" / h, link.parent))
    return base / "snapshots" / rev


@pytest.mark.parametrize("how", ["HF_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME", "home"])
def test_hf_id_resolved_from_local_cache(small_bert, tmp_path, monkeypatch, how):
    from zoi.frontend.hub import hub_cache_dir, resolve_model

    for v in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(v, raising=False)
    cache = {
        "HF_HUB_CACHE": tmp_path / "c",
        "HF_HOME": tmp_path / "hfhome" / "hub",
        "XDG_CACHE_HOME": tmp_path / "xdg" / "huggingface" / "hub",
        "home": tmp_path / "home" / ".cache" / "huggingface" / "hub",
    }[how]
    if how == "home":
        monkeypatch.setenv("HOME", str(tmp_path / "home"))
    else:
        up = {"HF_HUB_CACHE": 0, "HF_HOME": 1, "XDG_CACHE_HOME": 2}[how]
        monkeypatch.setenv(how, str(cache.parents[up - 1] if up else cache))
    assert hub_cache_dir() == cache
    snap = _fake_hub_cache(cache, small_bert)
    monkeypatch.chdir(tmp_path)  # the id is not a folder here
    assert resolve_model("sentence-transformers/tiny-bert") == snap
    eng = zoi.compile("sentence-transformers/tiny-bert", device="reference", max_tokens=128)
    assert eng.spec.name == "tiny-bert" and eng.model.meta["source"] == str(snap)
    want = zoi.compile(small_bert, device="reference", max_tokens=128).encode(["a b c", "hello"])
    np.testing.assert_array_equal(eng.encode(["a b c", "hello"]), want)
    # a snapshot folder given directly keeps the model's name, not the revision's
    assert zoi.compile(snap, device="reference", max_tokens=128).spec.name == "tiny-bert"


def test_hf_id_missing_says_how_to_get_it(tmp_path, monkeypatch, capsys):
    from zoi.frontend.hub import resolve_model

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty"))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(CheckpointError) as ei:
        resolve_model("sentence-transformers/all-MiniLM-L6-v2")
    msg = str(ei.value)
    assert "never downloads" in msg and "hf download sentence-transformers/all-MiniLM-L6-v2" in msg
    assert str(tmp_path / "empty") in msg
    rc = main(["encode", "-m", "someorg/some-model", "--device", "reference", "x"])
    err = capsys.readouterr().err
    assert rc == 2 and "local Hugging Face cache" in err and "hf download someorg/some-model" in err


def test_hf_id_revision_and_ambiguous_snapshots(small_bert, tmp_path, monkeypatch):
    from zoi.frontend.hub import resolve_model

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "c"))
    monkeypatch.chdir(tmp_path)
    snap = _fake_hub_cache(tmp_path / "c", small_bert, repo="org/m", rev="aaaa")
    assert resolve_model("org/m@aaaa") == snap
    with pytest.raises(CheckpointError, match="revision bbbb is not in the local"):
        resolve_model("org/m@bbbb")
    shutil.copytree(snap, snap.with_name("bbbb"), symlinks=True)
    (snap.parents[1] / "refs" / "main").unlink()
    with pytest.raises(CheckpointError, match="2 snapshots and no refs/main"):
        resolve_model("org/m")
    assert resolve_model("org/m@bbbb") == snap.with_name("bbbb")


def test_bundled_model_keeps_its_name_by_path(minilm):
    eng = zoi.compile(minilm, device="reference", max_tokens=512)
    assert eng.spec.name == "all-MiniLM-L6-v2"
    assert eng.model.meta.get("source_default") is True


# ---- 7: sentence-transformers' encode arguments ----------------------------------------------
def test_encode_accepts_sentence_transformers_output_args(small_bert):
    torch = pytest.importorskip("torch")
    eng = zoi.compile(small_bert, device="cpu", max_tokens=128)
    texts = ["a man eats", "the cat sleeps", "x"]
    ref = eng.encode(texts)
    t = eng.encode(texts, convert_to_tensor=True)
    assert isinstance(t, torch.Tensor) and t.shape == (3, ref.shape[1]) and t.dtype == torch.float32
    np.testing.assert_array_equal(t.numpy(), ref)
    one = eng.encode("a man eats", convert_to_tensor=True, device="cpu")
    assert isinstance(one, torch.Tensor) and one.shape == (ref.shape[1],)
    lst = eng.encode(texts, convert_to_numpy=False)
    assert isinstance(lst, list) and len(lst) == 3 and all(isinstance(x, torch.Tensor) for x in lst)
    np.testing.assert_array_equal(torch.stack(lst).numpy(), ref)
    a = eng.encode(texts, convert_to_numpy=True, convert_to_tensor=False, device="cpu")
    assert isinstance(a, np.ndarray)
    np.testing.assert_array_equal(a, ref)
    # convert_to_tensor wins over convert_to_numpy, as in sentence-transformers
    assert isinstance(
        eng.encode(texts, convert_to_numpy=True, convert_to_tensor=True), torch.Tensor
    )
    with pytest.raises(ValueError, match="this engine runs on cpu"):
        eng.encode(texts, device="cuda")
    with pytest.raises(ValueError, match="this engine runs on cpu"):
        eng.encode(texts, device=torch.device("cuda:0"))
    assert isinstance(eng.encode(texts, device=torch.device("cpu")), np.ndarray)


def test_encode_tensor_without_torch_is_a_clear_error(small_bert, monkeypatch):
    eng = zoi.compile(small_bert, device="reference", max_tokens=128)
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` raises ImportError
    with pytest.raises(ZoiError, match="torch is not installed"):
        eng.encode(["x"], convert_to_tensor=True)
    with pytest.raises(ZoiError, match="convert_to_numpy=False"):
        eng.encode(["x"], convert_to_numpy=False)
    assert eng.encode(["x"], device="cpu").shape == (1, eng.spec.hidden)
