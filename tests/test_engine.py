"""Engine API: encode shapes and order, batch-vs-single, chunking, save/load, bad input."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import zoi
from conftest import build_hf_model, save_checkpoint
from zoi.errors import CheckpointError, InputError, ZoiError


@pytest.fixture(scope="module")
def eng(small_bert):
    return zoi.compile(small_bert, device="reference", max_tokens=64)


TEXTS = [
    "short",
    "a somewhat longer sentence with more words in it",
    "",
    "mid length text here",
    "x " * 40,
    "another one",
    "z",
]


def test_shapes_and_defaults(eng):
    one = eng.encode("hello")
    assert one.shape == (eng.spec.hidden,) and one.dtype == np.float32
    many = eng.encode(TEXTS)
    assert many.shape == (len(TEXTS), eng.spec.hidden) and many.dtype == np.float32
    assert np.isfinite(many).all()
    np.testing.assert_allclose(np.linalg.norm(many, axis=1), 1, atol=1e-5)  # model has Normalize
    raw = eng.encode(TEXTS, normalize_embeddings=False)
    assert not np.allclose(np.linalg.norm(raw, axis=1), 1)
    empty = eng.encode([])
    assert empty.shape == (0, eng.spec.hidden)


def test_empty_string_is_cls_sep(eng):
    ids = eng.tokenize([""])[0]
    assert list(ids) == [101, 102]
    assert np.isfinite(eng.encode("")).all()


def test_batch_equals_single_and_order_kept(eng):
    batched = eng.encode(TEXTS, batch_size=3)
    single = np.stack([eng.encode(t) for t in TEXTS])
    np.testing.assert_allclose(batched, single, atol=1e-5, rtol=0)
    rev = eng.encode(TEXTS[::-1], batch_size=32)
    np.testing.assert_allclose(rev[::-1], batched, atol=1e-5, rtol=0)


def test_chunking_over_max_tokens(eng):
    texts = ["word " * 30] * 9  # 9 x 32 tokens > max_tokens=64
    out = eng.encode(texts, batch_size=100)
    np.testing.assert_allclose(out, np.repeat(out[:1], 9, axis=0), atol=1e-5)
    ids, cu = [], [0]
    for s in eng.tokenize(texts):
        ids.extend(s)
        cu.append(len(ids))
    pos = np.concatenate([np.arange(len(s)) for s in eng.tokenize(texts)])
    np.testing.assert_allclose(
        eng.run_packed(np.array(ids), pos, np.array(cu), normalize=True), out, atol=1e-5
    )


def test_truncation(eng):
    long = "word " * 1000
    ids = eng.tokenize([long])[0]
    assert len(ids) == eng.spec.max_positions and ids[-1] == 102
    with pytest.raises(InputError, match=r"texts\[1\] has \d+ tokens"):
        eng.encode(["ok", "word " * 100], truncate=False)
    if eng.tokenizer.native is None:  # HF: characters capped before tokenising
        with pytest.raises(InputError, match=r"texts\[0\] has \d+ characters"):
            eng.encode(["y" * (eng.tokenizer.max_chars + 1)], truncate=False)
    else:  # native: no cap (exact on any length), one long word is one [UNK]
        assert eng.tokenize(["y" * (eng.tokenizer.max_chars + 1)], False)[0].tolist() == [
            101,
            100,
            102,
        ]
    huge = "antidisestablishment " * 200_000  # 4 MB: tokenising stops at the limit
    assert np.isfinite(eng.encode(huge)).all()
    with pytest.raises(InputError, match=r"texts\[0\] has at least \d+ tokens"):
        eng.encode([huge], truncate=False)


@pytest.mark.parametrize("bad", [[1, "a"], ["a", None], [b"bytes"], 42, ["ok", ["nested"]]])
def test_wrong_types(eng, bad):
    with pytest.raises(TypeError, match=r"texts\[\d\]|list of str|str or a list"):
        eng.encode(bad)


def test_bad_arguments(eng):
    with pytest.raises(ValueError, match="batch_size"):
        eng.encode(["a"], batch_size=0)
    with pytest.raises(InputError):
        eng.run_packed(np.array([1, 2]), np.array([0, 1]), np.array([0, 3]))
    with pytest.raises(InputError, match="token ids"):
        eng.run_packed(np.array([10**6]), np.array([0]), np.array([0, 1]))
    with pytest.raises(ValueError, match="precision"):
        zoi.compile(device="reference", precision="int4")
    for word in ("w8", "w8a8"):  # the decoders' words: refused by name, with what encoders run
        with pytest.raises(ValueError, match=f"'{word}' applies to decoder.*'int8' is W8A8"):
            zoi.compile(device="cpu", precision=word)
    with pytest.raises(ValueError, match="device"):
        zoi.compile(device="tpu")
    with pytest.raises(ValueError, match="fp16"):
        zoi.compile(device="reference", precision="fp16")


def test_save_load_roundtrip(eng, tmp_path):
    texts = TEXTS
    ref = eng.encode(texts)
    out = eng.save(tmp_path / "art")
    assert sorted(p.name for p in out.iterdir()) == [
        "tokenizer.json",
        "weights.safetensors",
        "zoi.json",
    ]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp dirs left
    back = zoi.load(out, device="reference")
    np.testing.assert_array_equal(back.encode(texts), ref)
    assert back.spec == eng.spec and back.max_tokens == eng.max_tokens
    eng.save(out)  # overwriting an artifact is atomic and works
    assert zoi.load(out, device="reference").spec == eng.spec
    (tmp_path / "notart").mkdir()
    (tmp_path / "notart" / "precious.txt").write_text("keep me")
    with pytest.raises(ZoiError, match="not a zoi artifact"):
        eng.save(tmp_path / "notart")
    assert (tmp_path / "notart" / "precious.txt").read_text() == "keep me"


def test_load_rejects_corrupt_artifact(eng, tmp_path):
    out = eng.save(tmp_path / "a")
    meta = json.loads((out / "zoi.json").read_text())
    meta["format"] = 99
    (out / "zoi.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="zoi.json"):
        zoi.load(out, device="reference")
    out = eng.save(tmp_path / "b")
    data = (out / "weights.safetensors").read_bytes()
    (out / "weights.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="weights.safetensors"):
        zoi.load(out, device="reference")


# ---- bad checkpoints ---------------------------------------------------------------------------
@pytest.fixture()
def ckpt(tmp_path):
    return save_checkpoint(build_hf_model("bert", seed=5), tmp_path / "m")


def test_pickle_only_refused(ckpt):
    os.remove(ckpt / "model.safetensors")
    (ckpt / "pytorch_model.bin").write_bytes(b"\x80\x04not really a pickle")
    with pytest.raises(CheckpointError, match=r"pickle.*safetensors.*save_pretrained"):
        zoi.compile(ckpt, device="reference")


def test_unsupported_architecture(ckpt):
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg["model_type"] = "gpt2"
    (ckpt / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(
        CheckpointError, match=r"gpt2.*supports BertModel, DistilBertModel, RobertaModel"
    ):
        zoi.compile(ckpt, device="reference")


def test_bad_json(ckpt):
    (ckpt / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match=r"config.json: not valid JSON"):
        zoi.compile(ckpt, device="reference")


def test_missing_files(ckpt):
    os.remove(ckpt / "tokenizer.json")
    with pytest.raises(CheckpointError, match="tokenizer.json"):
        zoi.compile(ckpt, device="reference")
    with pytest.raises(CheckpointError, match="not a directory"):
        zoi.compile(ckpt / "nope", device="reference")


def test_truncated_safetensors(ckpt):
    p = ckpt / "model.safetensors"
    data = p.read_bytes()
    for cut in (4, 100, len(data) - 10):
        p.write_bytes(data[:cut])
        with pytest.raises(CheckpointError, match="model.safetensors"):
            zoi.compile(ckpt, device="reference")


def test_missing_tensor_wrong_shape_wrong_dtype(ckpt):
    from safetensors.numpy import load_file, save_file

    p = ckpt / "model.safetensors"
    orig = load_file(str(p))
    t = dict(orig)
    del t["encoder.layer.1.output.dense.weight"]
    save_file(t, str(p))
    with pytest.raises(CheckpointError, match=r"encoder.layer.1.output.dense.weight.*missing"):
        zoi.compile(ckpt, device="reference")
    t = dict(orig)
    t["encoder.layer.0.intermediate.dense.weight"] = t["encoder.layer.0.intermediate.dense.weight"][
        :, :-1
    ].copy()
    save_file(t, str(p))
    with pytest.raises(CheckpointError, match=r"intermediate.dense.weight has shape"):
        zoi.compile(ckpt, device="reference")
    t = dict(orig)
    t["embeddings.LayerNorm.weight"] = t["embeddings.LayerNorm.weight"].astype(np.int32)
    save_file(t, str(p))
    with pytest.raises(CheckpointError, match=r"dtype I32"):
        zoi.compile(ckpt, device="reference")
    t = dict(orig)
    t["embeddings.LayerNorm.bias"] = np.full_like(t["embeddings.LayerNorm.bias"], np.nan)
    save_file(t, str(p))
    with pytest.raises(CheckpointError, match="NaN"):
        zoi.compile(ckpt, device="reference")
