"""`zoi demo`: compiled artifacts cached and reused, invalidated safely; the machine
load said with the latency table, the timing repeated or flagged when the load is high."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

import zoi
from zoi import cache as C
from zoi.cli import load_line, main, timed_under_load

CALIB = ["a short text", "the quick brown fox jumps over the lazy dog"]
TEXTS = ["hello there", "a man is eating food", "x"]


def _no_compile(*a, **k):
    raise AssertionError("compiled although a valid cached artifact exists")


def test_cached_compile_reuses_and_invalidates(small_bert, tmp_path, monkeypatch):
    src = shutil.copytree(small_bert, tmp_path / "model")
    cache = tmp_path / "cache"
    kw = dict(device="reference", precision="int8", max_tokens=128, calibration=CALIB, cache=cache)
    e1, how, entry = C.cached_compile(src, **kw)
    assert how == "compiled" and (entry / "zoi.json").is_file()
    assert entry.parent == cache / "artifacts"
    want = e1.encode(TEXTS)

    with monkeypatch.context() as m:  # second run: loaded, not compiled
        m.setattr(zoi.engine, "compile", _no_compile)
        m.setattr(zoi, "compile", _no_compile)
        e2, how, entry2 = C.cached_compile(src, **kw)
    assert how == "cached" and entry2 == entry
    np.testing.assert_array_equal(e2.encode(TEXTS), want)

    # other options are other entries
    e3, how, entry3 = C.cached_compile(src, **{**kw, "precision": "fp32"})
    assert how == "compiled" and entry3 != entry and e3.precision == "fp32"
    _, how, entry4 = C.cached_compile(src, **{**kw, "calibration": [*CALIB, "more"]})
    assert how == "compiled" and entry4 not in (entry, entry3)

    # the model's weights change: a new key, compiled again (never the stale artifact)
    w = src / "model.safetensors"
    raw = bytearray(w.read_bytes())
    raw[-5] ^= 0x01  # flip one bit of the last weight
    w.write_bytes(bytes(raw))
    e5, how, entry5 = C.cached_compile(src, **kw)
    assert how == "compiled" and entry5 != entry

    # a corrupt entry is compiled again and replaced
    (entry / "weights.safetensors").write_bytes(b"garbage")
    raw[-5] ^= 0x01
    w.write_bytes(bytes(raw))  # back to the first weights: the first key
    e6, how, entry6 = C.cached_compile(src, **kw)
    assert how == "compiled" and entry6 == entry
    np.testing.assert_array_equal(e6.encode(TEXTS), want)
    assert C.cached_compile(src, **kw)[1] == "cached"

    # an entry whose recorded key differs (copied in by hand, edited) is not trusted
    meta = json.loads((entry / "zoi.json").read_text())
    meta["meta"]["cache_key"] = "0" * 64
    (entry / "zoi.json").write_text(json.dumps(meta))
    assert C.cached_compile(src, **kw)[1] == "compiled"

    # a folder without zoi.json where an entry should be is replaced
    shutil.rmtree(entry)
    entry.mkdir()
    (entry / "junk").write_text("x")
    assert C.cached_compile(src, **kw)[1] == "compiled" and (entry / "zoi.json").is_file()


def test_cache_key_follows_code_and_options(small_bert, monkeypatch):
    k = C.cache_key(small_bert, {"precision": "int8"})
    assert k == C.cache_key(small_bert, {"precision": "int8"})
    assert k != C.cache_key(small_bert, {"precision": "fp32"})
    monkeypatch.setattr(C, "code_digest", lambda: "another zoi")
    assert k != C.cache_key(small_bert, {"precision": "int8"})


def test_cache_dir_env(tmp_path, monkeypatch):
    assert C.cache_dir({"ZOI_CACHE_DIR": str(tmp_path / "z")}) == tmp_path / "z"
    assert C.cache_dir({"XDG_CACHE_HOME": str(tmp_path)}) == tmp_path / "zoi"
    monkeypatch.setenv("HOME", str(tmp_path / "h"))
    assert C.cache_dir({}) == tmp_path / "h" / ".cache" / "zoi"


class FakeMeter:
    def __init__(self, loads):
        self.loads, self.waits = list(loads), 0

    def start(self):
        pass

    def stop(self):
        return self.loads.pop(0)

    def wait_quiet(self, threshold, max_wait, log=print):
        self.waits += 1
        return {}


def test_demo_timing_repeats_then_warns_under_load():
    calls = []

    def measure():
        calls.append(1)
        return [("zoi", 1.0, 2.0)]

    logs = []
    rows, load = timed_under_load(measure, FakeMeter([0.05]), 0.25, 1.0, log=logs.append)
    assert len(calls) == 1 and load["quiet"] and load["runs"] == 1 and not logs
    line = load_line(load)
    assert "machine load while timing" in line and "0.05 cores" in line
    assert "warning" not in line

    calls.clear()
    m = FakeMeter([1.4, 0.1])
    rows, load = timed_under_load(measure, m, 0.25, 1.0, log=logs.append)
    assert len(calls) == 2 and m.waits == 1 and load["quiet"] and load["other_cores"] == 0.1
    assert logs and "1.40 cores" in logs[0] and "timing again" in logs[0]
    assert "timed 2 times" in load_line(load) and "warning" not in load_line(load)

    calls.clear()
    rows, load = timed_under_load(measure, FakeMeter([1.4, 0.9]), 0.25, 1.0, log=logs.append)
    assert len(calls) == 2 and not load["quiet"] and load["other_cores"] == 0.9
    line = load_line(load)
    assert "warning" in line and "noisy" in line and "0.90 cores" in line


@pytest.mark.slow
def test_demo_second_run_uses_the_cache(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ZOI_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("COLUMNS", "200")
    args = ["demo", "--precisions", "fp32", "--iters", "2", "--load-wait", "0"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "compiled in" in out and "cached in" in out and "machine load while timing" in out
    monkeypatch.setattr(zoi.engine, "compile", _no_compile)
    monkeypatch.setattr(zoi, "compile", _no_compile)
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "cached artifact" in out and "machine load while timing" in out
    assert "A man is eating food." in out
