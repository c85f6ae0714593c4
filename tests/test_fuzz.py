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
from zoi.errors import ZoiError

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
    out = eng.encode(["a probe sentence"])  # when loading succeeds the engine must work
    assert out.shape == (1, eng.spec.hidden)


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
