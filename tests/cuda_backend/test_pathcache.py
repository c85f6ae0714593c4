"""The persistent-vs-per-op choice remembered across builds (backends/cuda/pathcache.py)."""

from __future__ import annotations

import json
import logging
import os

import numpy as np
import pytest

from zoi.backends.cuda import pathcache
from zoi.backends.cuda.options import CudaOptions
from zoi.frontend.spec import ModelSpec

pytest.importorskip("triton")

SPEC = ModelSpec(
    arch="bert", vocab_size=100, hidden=384, layers=2, heads=12, intermediate=1536,
    max_positions=128,
)  # fmt: skip


def _key(**kw):
    a = dict(
        device_name="NVIDIA H200", capability=(9, 0), precision="fp16", spec=SPEC,
        opts=CudaOptions(), tb=128,
    )  # fmt: skip
    a.update(kw)
    return pathcache.cache_key(**a)


def test_key_names_what_the_timing_depends_on():
    k = _key()
    assert k == _key()  # stable
    assert len(k) == 32
    import dataclasses

    for change in (
        dict(tb=16),
        dict(device_name="NVIDIA H100"),
        dict(capability=(8, 9)),
        dict(precision="int8"),
        dict(spec=dataclasses.replace(SPEC, hidden=768)),
        dict(spec=dataclasses.replace(SPEC, layers=6)),
        dict(opts=CudaOptions(persistent_cfg={"BK": 128})),
        dict(opts=CudaOptions(pdl=False)),
    ):
        assert _key(**change) != k, change
    # the same GPU model at another index, another cache file, the model's name: same answer
    assert _key(opts=CudaOptions(device_index=1)) == k
    assert _key(opts=CudaOptions(path_cache="/elsewhere.json")) == k
    assert _key(spec=dataclasses.replace(SPEC, name="other")) == k


def test_store_lookup_roundtrip_and_atomic_file(tmp_path):
    f = tmp_path / "sub" / "cuda_paths.json"
    assert pathcache.lookup(f, "k1") is None  # no file yet
    pathcache.store(f, "k1", "per-op", {"persistent": 188.0, "per-op": 173.0})
    pathcache.store(f, "k2", "persistent")
    assert pathcache.lookup(f, "k1") == "per-op"
    assert pathcache.lookup(f, "k2") == "persistent"
    assert pathcache.lookup(f, "k3") is None
    data = json.loads(f.read_text())
    assert data["format"] == pathcache.FORMAT
    assert data["entries"]["k1"]["us"] == {"persistent": 188.0, "per-op": 173.0}
    assert [p.name for p in f.parent.iterdir()] == ["cuda_paths.json"]  # no temp file left
    pathcache.store(f, "k1", "persistent")  # a new measurement replaces the old answer
    assert pathcache.lookup(f, "k1") == "persistent"
    pathcache.store(f, "k4", "fastest")  # not a path: refused, nothing written
    assert pathcache.lookup(f, "k4") is None and "k4" not in json.loads(f.read_text())["entries"]
    assert pathcache.lookup(None, "k1") is None
    pathcache.store(None, "k1", "per-op")  # no cache configured: a no-op


@pytest.mark.parametrize(
    "content",
    ["{not json", json.dumps([1, 2]), json.dumps({"format": 99, "entries": {}}),
     json.dumps({"format": 1, "entries": {"k": {"path": "warp"}}}),
     json.dumps({"format": 1, "entries": "x"})],
)  # fmt: skip
def test_a_bad_file_is_ignored_and_rewritten(tmp_path, caplog, content):
    f = tmp_path / "cuda_paths.json"
    f.write_text(content)
    with caplog.at_level(logging.WARNING, logger="zoi"):
        assert pathcache.lookup(f, "k") is None
    pathcache.store(f, "k", "per-op")
    assert pathcache.lookup(f, "k") == "per-op"
    assert json.loads(f.read_text())["format"] == pathcache.FORMAT


def test_an_unwritable_cache_only_warns(tmp_path, caplog):
    blocker = tmp_path / "not_a_dir"
    blocker.write_text("a file where the cache folder should be")
    with caplog.at_level(logging.WARNING, logger="zoi"):
        pathcache.store(blocker / "cuda_paths.json", "k", "per-op")  # mkdir fails, as root too
    assert "could not write" in caplog.text
    assert blocker.read_text().startswith("a file")


def test_from_env_puts_the_cache_in_the_zoi_cache_dir(tmp_path):
    o = CudaOptions.from_env({"ZOI_CACHE_DIR": str(tmp_path)})
    assert o.path_cache == str(tmp_path / "cuda_paths.json")
    assert (
        CudaOptions.from_env(
            {"ZOI_CACHE_DIR": str(tmp_path), "ZOI_CUDA_PATH_CACHE": "0"}
        ).path_cache
        is None
    )
    given = CudaOptions.from_env({"ZOI_CACHE_DIR": str(tmp_path)}, path_cache="/x.json")
    assert given.path_cache == "/x.json"
    assert CudaOptions().path_cache is None  # the backend's own default: time every build


torch = pytest.importorskip("torch")
GPU = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="needs a CUDA GPU")
def test_second_build_compiles_the_winner_only(tmp_path):
    """The first FP16 build times both paths of its small buckets and writes the
    answers; a second build of the same shapes reads them (bucket_paths "cached"), builds the
    same path only, and computes the same bits."""
    from tests.cuda_backend.cuda_helpers import batch, tiny_model

    from zoi.backends.cuda.backend import CudaBackend

    f = tmp_path / "cuda_paths.json"
    model = tiny_model("fp16", max_tokens=256, max_batch=16, hidden=384, heads=12, inter=1536)
    opts = CudaOptions(path_cache=str(f), persistent="time")
    be1 = CudaBackend(model, buckets=[16, 128, 256], options=opts)
    p1 = be1.memory()["bucket_paths"]
    assert all("per_op_us" in p1[tb] and "persistent_us" in p1[tb] for tb in (16, 128, 256))
    entries = json.loads(f.read_text())["entries"].values()
    assert sorted(e["path"] != "kernels" for e in entries) == [False, True, True, True]
    ids, pos, cu = batch([40, 7, 33], int(model.spec.vocab_size), np.random.default_rng(2))
    want = be1.run(ids, pos, cu, True)
    del be1
    be2 = CudaBackend(model, buckets=[16, 128, 256], options=opts)
    p2 = be2.memory()["bucket_paths"]
    for tb in (16, 128, 256):
        assert p2[tb] == {"path": p1[tb]["path"], "cached": True}
    np.testing.assert_array_equal(be2.run(ids, pos, cu, True), want)
