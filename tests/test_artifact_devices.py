"""An artifact's max_tokens across devices: a compile with the automatic max_tokens records it
(meta max_tokens_auto), and load() on a device whose default is smaller takes that default (a GPU
compile's 32768 tokens would give a CPU engine an 8x bigger arena); an explicit max_tokens, at
compile or at load, is kept. The host-memory check of the arena is the CPU plan's: device="cuda"
holds no host arena, so it is not refused for one."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

import zoi
from zoi.engine import DEFAULT_MAX_TOKENS, _check_arena


def _as_if_compiled_for_cuda(art, tokens=32768, auto=True):
    p = art / "zoi.json"
    meta = json.loads(p.read_text())
    meta["max_tokens"] = tokens
    meta["max_batch"] = min(meta.get("max_batch") or tokens, tokens)
    meta["meta"]["max_tokens_auto"] = {"device": "cuda"} if auto else None
    p.write_text(json.dumps(meta))


@pytest.fixture(scope="module")
def auto_engine(small_bert):
    return zoi.compile(small_bert, device="cpu", precision="fp32")


def test_auto_max_tokens_is_recorded(auto_engine, small_bert, tmp_path):
    assert auto_engine.model.plan.max_tokens == DEFAULT_MAX_TOKENS["cpu"]
    assert auto_engine.model.meta["max_tokens_auto"] == {"device": "cpu"}
    art = auto_engine.save(tmp_path / "a")
    assert json.loads((art / "zoi.json").read_text())["meta"]["max_tokens_auto"] == {
        "device": "cpu"
    }
    fixed = zoi.compile(small_bert, device="cpu", precision="fp32", max_tokens=512)
    assert fixed.model.meta["max_tokens_auto"] is None


def test_gpu_default_shrinks_to_the_cpu_default_on_load(auto_engine, tmp_path):
    art = auto_engine.save(tmp_path / "a")
    _as_if_compiled_for_cuda(art)
    texts = ["a short text", "another, somewhat longer text with more words", ""]
    want = auto_engine.encode(texts)
    back = zoi.load(art, device="cpu")
    assert back.model.plan.max_tokens == DEFAULT_MAX_TOKENS["cpu"]
    assert back.model.plan.max_batch <= back.model.plan.max_tokens
    np.testing.assert_array_equal(back.encode(texts), want)
    assert back.model.meta["max_tokens_auto"] == {"device": "cpu"}
    # asked for: kept, and a save of that engine records it as asked for
    big = zoi.load(art, device="cpu", max_tokens=8192)
    assert big.model.plan.max_tokens == 8192 and big.model.meta["max_tokens_auto"] is None


def test_explicit_gpu_max_tokens_is_kept(auto_engine, tmp_path):
    art = auto_engine.save(tmp_path / "a")
    _as_if_compiled_for_cuda(art, tokens=8192, auto=False)
    assert zoi.load(art, device="cpu").model.plan.max_tokens == 8192


def test_a_bigger_default_is_not_taken(auto_engine, tmp_path):
    """A CPU artifact loaded for another device keeps its (smaller) size: never more buckets
    than were compiled for; checked on device="reference" (default 4096, as the CPU's)."""
    art = auto_engine.save(tmp_path / "a")
    p = art / "zoi.json"
    meta = json.loads(p.read_text())
    meta["max_tokens"] = 1024
    meta["max_batch"] = min(meta["max_batch"], 1024)
    p.write_text(json.dumps(meta))
    assert zoi.load(art, device="reference").model.plan.max_tokens == 1024


@pytest.mark.parametrize("bad", [True, "cuda", 3, ["cuda"]])
def test_malformed_auto_record_is_ignored(auto_engine, tmp_path, bad):
    art = auto_engine.save(tmp_path / "a")
    _as_if_compiled_for_cuda(art)
    p = art / "zoi.json"
    meta = json.loads(p.read_text())
    meta["meta"]["max_tokens_auto"] = bad
    p.write_text(json.dumps(meta))
    assert zoi.load(art, device="cpu").model.plan.max_tokens == 32768  # as saved


def test_host_arena_check_is_the_cpu_plans():
    huge = SimpleNamespace(plan=SimpleNamespace(arena_bytes=1 << 62, max_tokens=32768))
    with pytest.raises(ValueError, match="use a smaller max_tokens"):
        _check_arena(huge, "cpu")
    with pytest.raises(ValueError, match="use a smaller max_tokens"):
        _check_arena(huge)  # the default is the CPU's
    assert _check_arena(huge, "cuda") is None
