"""Fuzz: corrupt a real checkpoint (safetensors header and data, config.json, tokenizer.json).

Loading must only ever raise zoi errors: never another exception, a crash or a hang.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import zoi
from conftest import minilm_path
from zoi.errors import NumericalError, ZoiError

FUZZ = settings(
    max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), derandomize=False
)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    d = tmp_path_factory.mktemp("fuzz") / "m"
    shutil.copytree(minilm_path(), d)
    return d


def _try_load(folder) -> None:
    try:
        eng = zoi.compile(folder, device="reference", max_tokens=512)
    except ZoiError:
        return
    try:  # when loading succeeds the engine must work, or refuse non-finite output
        out = eng.encode(["a probe sentence"])
    except NumericalError:
        return
    assert out.shape == (1, eng.spec.hidden) and np.isfinite(out).all()


@FUZZ
@given(data=st.data())
def test_safetensors_bytes(folder, data):
    p = folder / "model.safetensors"
    raw = bytearray(p.read_bytes()) if not hasattr(test_safetensors_bytes, "_raw") else None
    if raw is not None:
        test_safetensors_bytes._raw = bytes(raw)
    orig = test_safetensors_bytes._raw
    hlen = int.from_bytes(orig[:8], "little")
    region = data.draw(st.sampled_from(["header_len", "header", "data", "truncate"]))
    buf = bytearray(orig)
    if region == "truncate":
        buf = buf[: data.draw(st.integers(0, len(orig) - 1))]
    else:
        lo, hi = {"header_len": (0, 8), "header": (8, 8 + hlen), "data": (8 + hlen, len(orig))}[
            region
        ]
        for _ in range(data.draw(st.integers(1, 8))):
            i = data.draw(st.integers(lo, hi - 1))
            buf[i] = data.draw(st.integers(0, 255))
    try:
        p.write_bytes(bytes(buf))
        _try_load(folder)
    finally:
        p.write_bytes(orig)


JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**40), 2**40)
    | st.floats(allow_nan=True)
    | st.text(max_size=8),
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=5), c, max_size=3),
    max_leaves=5,
)


@FUZZ
@given(data=st.data())
def test_config_fields(folder, data):
    p = folder / "config.json"
    orig = p.read_text()
    cfg = json.loads(orig)
    for _ in range(data.draw(st.integers(1, 3))):
        key = data.draw(st.sampled_from(sorted(cfg)))
        if data.draw(st.booleans()):
            cfg[key] = data.draw(JSON_VALUES)
        else:
            cfg.pop(key, None)
            if not cfg:
                break
    try:
        p.write_text(
            json.dumps(cfg)
            if data.draw(st.integers(0, 9))
            else orig[: data.draw(st.integers(0, len(orig)))]
        )
        _try_load(folder)
    finally:
        p.write_text(orig)


@FUZZ
@given(data=st.data())
def test_tokenizer_json(folder, data):
    p = folder / "tokenizer.json"
    orig = p.read_bytes()
    mode = data.draw(st.sampled_from(["bytes", "truncate", "field"]))
    if mode == "bytes":
        buf = bytearray(orig)
        for _ in range(data.draw(st.integers(1, 6))):
            buf[data.draw(st.integers(0, len(buf) - 1))] = data.draw(st.integers(0, 255))
        new = bytes(buf)
    elif mode == "truncate":
        new = orig[: data.draw(st.integers(0, len(orig) - 1))]
    else:
        tok = json.loads(orig)
        key = data.draw(st.sampled_from(sorted(tok)))
        tok[key] = data.draw(JSON_VALUES)
        new = json.dumps(tok).encode()
    try:
        p.write_bytes(new)
        _try_load(folder)
    finally:
        p.write_bytes(orig)


def test_fuzz_left_the_checkpoint_intact(folder):
    eng = zoi.compile(folder, device="reference")
    ref = zoi.compile(minilm_path(), device="reference")
    np.testing.assert_array_equal(eng.encode(["same"]), ref.encode(["same"]))


# ---- the artifact loader: edited zoi.json values, corrupt weights headers --------------------
@pytest.fixture(scope="module")
def artifact(small_bert, tmp_path_factory):
    art = zoi.compile(small_bert, device="reference", max_tokens=64, precision="int8").save(
        tmp_path_factory.mktemp("fuzz_art") / "art"
    )
    return art, (art / "zoi.json").read_text(), (art / "weights.safetensors").read_bytes()


_json_any = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**64), 2**64) | st.floats() | st.text(max_size=8),
    lambda k: st.lists(k, max_size=3) | st.dictionaries(st.text(max_size=6), k, max_size=3),
    max_leaves=8,
)


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_artifact_loader(artifact, data):
    art, meta_text, weights = artifact
    meta = json.loads(meta_text)
    (art / "weights.safetensors").write_bytes(weights)
    for _ in range(data.draw(st.integers(1, 3))):
        where = data.draw(st.sampled_from(["top", "spec", "quant", "weights_header"]))
        if where == "top":
            meta[data.draw(st.sampled_from(sorted(meta)))] = data.draw(_json_any)
        elif where == "spec" and isinstance(meta.get("spec"), dict) and meta["spec"]:
            meta["spec"][data.draw(st.sampled_from(sorted(meta["spec"])))] = data.draw(_json_any)
        elif where == "quant" and isinstance(meta.get("quant"), dict) and meta["quant"]:
            q = meta["quant"][data.draw(st.sampled_from(sorted(meta["quant"])))]
            if isinstance(q, dict):
                q[data.draw(st.sampled_from(["scheme", "amax", "info"]))] = data.draw(_json_any)
        else:
            buf = bytearray(weights)
            hlen = int.from_bytes(buf[:8], "little")
            i = data.draw(st.integers(0, 8 + hlen - 1))
            buf[i] = data.draw(st.integers(0, 255))
            (art / "weights.safetensors").write_bytes(bytes(buf))
    (art / "zoi.json").write_text(json.dumps(meta))
    try:
        eng = zoi.load(art, device="reference")
    except (ZoiError, ValueError):
        return
    out = eng.encode(["a probe sentence"])  # an unedited part loads and runs
    assert np.isfinite(out).all()
