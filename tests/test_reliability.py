"""No silent wrong answers, files only inside the model folder, clear errors."""

from __future__ import annotations

import json
import os
import shutil
import struct
import threading

import numpy as np
import pytest

import zoi
from zoi.errors import CheckpointError, InputError, NumericalError, UnsupportedModelError
from zoi.frontend.checkpoint import load_checkpoint
from zoi.frontend.safetensors_io import SafetensorsFile, save_safetensors
from zoi.frontend.tokenizer import Tokenizer


@pytest.fixture()
def ckpt(small_bert, tmp_path):
    dst = tmp_path / "ckpt"
    shutil.copytree(small_bert, dst)
    return dst


def _edit_json(path, **kw):
    d = json.loads(path.read_text())
    d.update(kw)
    path.write_text(json.dumps(d))


def _cos(a, b):
    return float((a * b).sum() / np.linalg.norm(a) / np.linalg.norm(b))


# ---- pooling ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "cfg",
    [
        {"pooling_mode_mean_tokens": True, "pooling_mode_mean_sqrt_len_tokens": True},
        {"pooling_mode_mean_sqrt_len_tokens": True},
        {"pooling_mode_weightedmean_tokens": True},
        {"pooling_mode": ["mean", "max"]},
        {"pooling_mode": ["lasttoken", "mean"]},
    ],
)
def test_pooling_zoi_cannot_reproduce_is_refused(ckpt, cfg):
    (ckpt / "1_Pooling" / "config.json").write_text(json.dumps({"embedding_dimension": 60, **cfg}))
    with pytest.raises(UnsupportedModelError, match="pooling modes") as e:
        load_checkpoint(ckpt)
    if len(cfg) > 1 or isinstance(cfg.get("pooling_mode"), list):
        assert "concatenates" in str(e.value)


def test_pooling_mode_of_sentence_transformers_6(ckpt):
    (ckpt / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode": "cls"}))
    assert load_checkpoint(ckpt)[0].pooling == "cls"


# ---- whitespace does not count against the character cap -----------------------------------
def test_leading_whitespace_keeps_the_text(minilm):
    tok = Tokenizer.from_file(minilm / "tokenizer.json", 256)
    text = "A man is playing a guitar on the stage tonight."
    for pad in (" " * 9000, "\n\t " * 4000, " " * 20000):
        for truncate in (True, False):
            got = tok.encode_ids([pad + text], truncate)[0]
            assert got.tolist() == tok.encode_ids([text], truncate)[0].tolist()
    # the cap still holds for text that is not whitespace
    long = "word " * 5000
    assert len(tok.encode_ids([long])[0]) == 256
    if tok.native is None:  # HF: a character cap bounds the work
        with pytest.raises(InputError, match="characters, over the cap"):
            tok.encode_ids(["x" * (32 * 256 + 1)], False)
    else:  # native: no cap (it stops at the token limit); one long word is one [UNK]
        assert tok.encode_ids(["x" * (32 * 256 + 1)], False)[0].tolist() == [101, 100, 102]


def test_lone_surrogate_names_the_text(minilm):
    tok = Tokenizer.from_file(minilm / "tokenizer.json", 256)
    with pytest.raises(InputError, match=r"texts\[2\] is not valid Unicode.*surrogate"):
        tok.encode_ids(["fine", "also fine", "bad \ud800 text"])


# ---- task heads -----------------------------------------------------------------------------
def test_task_head_refused(ckpt):
    (ckpt / "modules.json").unlink()
    _edit_json(ckpt / "config.json", architectures=["BertForQuestionAnswering"])
    with pytest.raises(UnsupportedModelError, match="task head"):
        zoi.compile(ckpt, device="reference", max_tokens=64)
    _edit_json(ckpt / "config.json", architectures=["BertModel"])
    zoi.compile(ckpt, device="reference", max_tokens=64)


def test_task_head_in_a_sentence_transformers_folder_is_its_encoder(ckpt):
    _edit_json(ckpt / "config.json", architectures=["BertForMaskedLM"])
    assert load_checkpoint(ckpt)[0].pooling == "mean"


# ---- `zoi encode -f` keeps blank lines ------------------------------------------------------
def test_encode_file_rows_match_lines(small_bert, tmp_path):
    from zoi.cli import main

    art = tmp_path / "art"
    zoi.compile(small_bert, device="reference", max_tokens=64).save(art)
    f = tmp_path / "texts.txt"
    f.write_text("first line\n\nthird line\n   \nfifth\n", encoding="utf-8")
    out = tmp_path / "emb.npy"
    assert main(["encode", "--model", str(art), "-f", str(f), "-o", str(out)]) == 0
    emb = np.load(out)
    assert emb.shape[0] == 5
    eng = zoi.load(art, device="reference")
    ref = eng.encode(["first line", "", "third line", "   ", "fifth"])
    np.testing.assert_allclose(emb, ref, atol=1e-6)


# ---- safetensors: the tensors tile the data buffer ------------------------------------------
def _raw_safetensors(path, header: bytes, data: bytes):
    path.write_bytes(struct.pack("<Q", len(header)) + header + data)


def test_safetensors_overlap_gap_duplicate_refused(tmp_path):
    p = tmp_path / "x.safetensors"
    ent = lambda a, b: {"dtype": "F32", "shape": [(b - a) // 4], "data_offsets": [a, b]}  # noqa: E731
    cases = {
        "overlaps": {"a": ent(0, 16), "b": ent(0, 16)},
        "gap": {"a": ent(0, 8), "b": ent(16, 24)},
        "cover": {"a": ent(0, 8)},
    }
    for why, hdr in cases.items():
        _raw_safetensors(p, json.dumps(hdr).encode(), bytes(24 if why != "overlaps" else 16))
        with pytest.raises(CheckpointError, match=why if why != "cover" else "cover 8 of"):
            SafetensorsFile(p)
    dup = b'{"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, "a": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}}'
    _raw_safetensors(p, dup, bytes(16))
    with pytest.raises(CheckpointError, match="named twice"):
        SafetensorsFile(p)
    bad = b'{"a": {"dtype": "F32", "shape": [1.5], "data_offsets": [0, 4]}}'
    _raw_safetensors(p, bad, bytes(4))
    with pytest.raises(CheckpointError, match="malformed"):
        SafetensorsFile(p)
    save_safetensors({"a": np.ones(3, np.float32), "b": np.zeros((2, 2), np.int8)}, p)
    f = SafetensorsFile(p)  # what the safetensors library writes is accepted
    assert f.get("a").tolist() == [1, 1, 1]


def test_checkpoint_with_overlapping_layers_refused(ckpt):
    """The finding: layer 1's tensors pointing at layer 0's bytes ran layer 0's weights."""
    p = ckpt / "model.safetensors"
    raw = p.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    hdr = json.loads(raw[8 : 8 + n])
    for k in list(hdr):
        if ".layer.1." in k:
            hdr[k]["data_offsets"] = hdr[k.replace(".layer.1.", ".layer.0.")]["data_offsets"]
    h = json.dumps(hdr).encode()
    p.write_bytes(struct.pack("<Q", len(h)) + h + raw[8 + n :])
    with pytest.raises(CheckpointError, match="overlaps|gap"):
        load_checkpoint(ckpt)


# ---- config ranges, static scales, NaN never leaves the engine ------------------------------
@pytest.mark.parametrize("eps", [-1, 0, float("nan")])
def test_bad_layer_norm_eps_refused(ckpt, eps):
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg["layer_norm_eps"] = eps
    (ckpt / "config.json").write_text(json.dumps(cfg))  # NaN is written as NaN (Python json)
    with pytest.raises(CheckpointError, match="layer_norm_eps"):
        load_checkpoint(ckpt)


@pytest.fixture()
def overflowing(ckpt):
    """Finite weights whose forward overflows float32: LayerNorm weights of 3e38."""
    p = ckpt / "model.safetensors"
    f = SafetensorsFile(p)
    t = {n: np.array(f.get(n, float32=False)) for n in f.names()}
    del f
    for n in t:
        if n.endswith("embeddings.LayerNorm.weight"):
            t[n][:] = 3e38
    save_safetensors(t, p)
    return ckpt


@pytest.mark.parametrize("device", ["reference", "cpu"])
def test_nan_never_leaves_the_engine(overflowing, device):
    eng = zoi.compile(overflowing, device=device, max_tokens=64)
    with pytest.raises(NumericalError, match="NaN/Inf.*not at fault"):
        eng.encode(["a text", "another text"])


def test_nan_static_scale_refused_at_load(small_bert, tmp_path):
    eng = zoi.compile(small_bert, device="reference", precision="int8", max_tokens=64)
    art = eng.save(tmp_path / "art")
    meta = json.loads((art / "zoi.json").read_text())
    statics = [k for k, v in meta["quant"].items() if v["scheme"] == "static"]
    if not statics:
        k = next(iter(meta["quant"]))
        meta["quant"][k]["scheme"] = "static"
        statics = [k]
    meta["quant"][statics[0]]["amax"] = float("nan")
    (art / "zoi.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="amax"):
        zoi.load(art, device="reference")


# ---- artifacts check themselves -------------------------------------------------------------
@pytest.fixture()
def artifact(small_bert, tmp_path):
    return zoi.compile(small_bert, device="reference", max_tokens=64).save(tmp_path / "art")


@pytest.mark.parametrize(
    "edit",
    [
        {"heads": 10},
        {"layers": 1},
        {"act": "relu"},
        {"arch": "roberta"},
        {"eps": 1e-5},
        {"pooling": "cls"},
        {"precision": "int8"},
    ],
)
def test_edited_artifact_refused(artifact, edit):
    zoi.load(artifact, device="reference")  # loads as saved
    meta = json.loads((artifact / "zoi.json").read_text())
    if "precision" in edit:
        meta.update(edit)
    else:
        meta["spec"].update(edit)
    (artifact / "zoi.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="zoi.json was edited|not the one"):
        zoi.load(artifact, device="reference")


def test_swapped_weights_or_tokenizer_refused(small_bert, artifact, tmp_path):
    other = zoi.compile(small_bert, device="reference", max_tokens=64, precision="int8").save(
        tmp_path / "other"
    )
    shutil.copy(other / "weights.safetensors", artifact / "weights.safetensors")
    with pytest.raises(CheckpointError, match="weights"):
        zoi.load(artifact, device="reference")
    # same spec, different weights: a copy whose one value changed
    art2 = zoi.compile(small_bert, device="reference", max_tokens=64).save(tmp_path / "a2")
    f = SafetensorsFile(art2 / "weights.safetensors")
    t = {n: np.array(f.get(n, float32=False)) for n in f.names()}
    md = dict(f.metadata)
    del f
    t["l1.o.b"][0] += 0.5
    save_safetensors(t, art2 / "weights.safetensors", metadata=md)
    with pytest.raises(CheckpointError, match="weights are not the ones"):
        zoi.load(art2, device="reference")
    art3 = zoi.compile(small_bert, device="reference", max_tokens=64).save(tmp_path / "a3")
    tj = json.loads((art3 / "tokenizer.json").read_text())
    tj["truncation"] = None
    tj.setdefault("added_tokens", [])
    (art3 / "tokenizer.json").write_text(json.dumps(tj) + " ")
    with pytest.raises(CheckpointError, match="tokenizer"):
        zoi.load(art3, device="reference")


# ---- files only inside the model folder ------------------------------------------------------
def _sharded(ckpt, name: str):
    (ckpt / "model.safetensors").rename(ckpt.parent / "elsewhere.safetensors")
    f = SafetensorsFile(ckpt.parent / "elsewhere.safetensors")
    (ckpt / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {n: name for n in f.names()}})
    )


@pytest.mark.parametrize("how", ["dotdot", "absolute", "symlink"])
def test_index_shards_outside_the_folder_refused(ckpt, how):
    outside = str(ckpt.parent / "elsewhere.safetensors")
    if how == "symlink":
        _sharded(ckpt, "shard.safetensors")
        os.symlink(outside, ckpt / "shard.safetensors")
    else:
        _sharded(ckpt, "../elsewhere.safetensors" if how == "dotdot" else outside)
    with pytest.raises(CheckpointError, match="outside the model folder|absolute"):
        load_checkpoint(ckpt)


def test_pooling_path_outside_refused(ckpt):
    mods = json.loads((ckpt / "modules.json").read_text())
    for m in mods:
        if m["type"].endswith("Pooling"):
            m["path"] = "../../1_Pooling"
    (ckpt / "modules.json").write_text(json.dumps(mods))
    with pytest.raises(CheckpointError, match="outside the model folder"):
        load_checkpoint(ckpt)


@pytest.mark.parametrize("name", ["config.json", "tokenizer.json", "model.safetensors"])
def test_symlink_out_of_the_folder_refused(ckpt, name):
    (ckpt / name).rename(ckpt.parent / name)
    os.symlink(ckpt.parent / name, ckpt / name)
    with pytest.raises(CheckpointError, match="outside the model folder"):
        zoi.compile(ckpt, device="reference", max_tokens=64)


def test_hf_cache_layout_links_accepted(ckpt, tmp_path):
    snap = tmp_path / "models--x--y" / "snapshots" / "abc"
    blobs = tmp_path / "models--x--y" / "blobs"
    snap.mkdir(parents=True)
    blobs.mkdir()
    for p in ckpt.rglob("*"):
        if p.is_file():
            rel = p.relative_to(ckpt)
            blob = blobs / str(rel).replace("/", "_")
            shutil.copy(p, blob)
            (snap / rel).parent.mkdir(parents=True, exist_ok=True)
            os.symlink(os.path.relpath(blob, (snap / rel).parent), snap / rel)
    assert load_checkpoint(snap)[0].hidden == 60


@pytest.mark.parametrize("name", ["model.safetensors", "config.json"])
def test_fifo_does_not_block(ckpt, name):
    (ckpt / name).unlink()
    os.mkfifo(ckpt / name)
    out: list = []
    th = threading.Thread(
        target=lambda: out.append(_raises(lambda: zoi.compile(ckpt, device="reference"))),
        daemon=True,
    )
    th.start()
    th.join(30)
    assert not th.is_alive(), "open() blocked on a FIFO"
    assert isinstance(out[0], CheckpointError) and "FIFO" in str(out[0])


def _raises(fn):
    try:
        fn()
    except Exception as e:
        return e
    return None


# ---- clear errors ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "edit,match",
    [
        ({"heads": 0}, "heads must be an integer >= 1"),
        ({"heads": 7}, "multiple of heads"),
        ({"max_positions": -5}, "max_positions must be an integer >= 2"),
        ({"layers": 1.5}, "layers must be an integer"),
        ({"eps": -1}, "eps"),
    ],
)
def test_nonsense_artifact_spec_gets_a_clear_error(artifact, edit, match):
    meta = json.loads((artifact / "zoi.json").read_text())
    meta["spec"].update(edit)
    (artifact / "zoi.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match=match):
        zoi.load(artifact, device="reference")


@pytest.mark.parametrize("bad", [True, 3, "x", [1, 2]])
def test_artifact_meta_not_an_object_gets_a_clear_error(artifact, bad):
    """The model's own metadata ("meta": source, prompts, max_tokens_auto) must be a JSON object
    (found by tests/test_fuzz.py: True gave an AttributeError, a list a TypeError); null or
    absent is an empty one."""
    meta = json.loads((artifact / "zoi.json").read_text())
    meta["meta"] = bad
    (artifact / "zoi.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="'meta' must be a JSON object"):
        zoi.load(artifact, device="reference")
    for empty in (None, {}):
        meta["meta"] = empty
        (artifact / "zoi.json").write_text(json.dumps(meta))
        assert np.isfinite(zoi.load(artifact, device="reference").encode(["a probe"])).all()


def test_absurd_max_tokens_clear_error(artifact, small_bert):
    for bad in (10**12, 1e12, -3, 0, 2.5, True):
        with pytest.raises(ValueError, match="max_tokens"):
            zoi.load(artifact, device="cpu", max_tokens=bad)
    with pytest.raises(ValueError, match="max_tokens"):
        zoi.compile(small_bert, device="cpu", max_tokens=10**12)


def test_tokenizer_larger_than_embedding_table_refused(ckpt):
    _edit_json(ckpt / "config.json", vocab_size=30000)
    f = SafetensorsFile(ckpt / "model.safetensors")
    t = {n: np.array(f.get(n, float32=False)) for n in f.names()}
    del f
    k = next(n for n in t if n.endswith("word_embeddings.weight"))
    t[k] = t[k][:30000]
    save_safetensors(t, ckpt / "model.safetensors")
    with pytest.raises(CheckpointError, match="tokenizer has 30522 tokens.*30000 rows"):
        zoi.compile(ckpt, device="reference", max_tokens=64)


@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan")])
def test_non_finite_config_number_is_a_clear_error(ckpt, value):
    """hidden_size: Infinity / NaN in config.json (Python's json reads them) names the field
    instead of an OverflowError / ValueError from int() (found by tests/test_fuzz.py)."""
    _edit_json(ckpt / "config.json", hidden_size=value)
    with pytest.raises(CheckpointError, match="hidden_size"):
        load_checkpoint(ckpt)
