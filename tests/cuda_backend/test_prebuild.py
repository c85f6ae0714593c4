"""Kernels compiled in worker processes before a cold GPU build (backends/cuda/prebuild.py):
the model travels to a worker and back unchanged, the buckets are shared out, a failing
worker never fails the build, and on a GPU the second build of the same shapes starts no
worker and gives the same bits."""

from __future__ import annotations

import dataclasses
import json
import logging
import os

import numpy as np
import pytest

pytest.importorskip("triton")

from tests.cuda_backend.cuda_helpers import batch, tiny_model  # noqa: E402

from zoi.backends.cuda import prebuild  # noqa: E402
from zoi.backends.cuda.options import CudaOptions  # noqa: E402


@pytest.mark.parametrize("precision", ["fp16", "int8"])
def test_model_round_trip(tmp_path, precision):
    """What a worker builds from is the model itself: spec, plan, weights, quant and meta."""
    model = tiny_model(precision, max_tokens=64, max_batch=8)
    model.meta = {"pooling": {"mode": "mean", "from": "test"}, "token_states": True}
    prebuild._write_model(model, tmp_path)
    back = prebuild._read_model(tmp_path)
    assert back.spec == model.spec and back.precision == model.precision
    assert back.plan == model.plan and back.meta == model.meta
    assert back.quant == model.quant
    assert back.weights.keys() == model.weights.keys()
    for k, w in model.weights.items():
        assert back.weights[k].dtype == w.dtype
        np.testing.assert_array_equal(back.weights[k], w)


def test_buckets_are_shared_out_and_the_count_is_bounded():
    b = [16, 32, 64, 128, 256, 512, 1024]
    parts = prebuild.split(b, 3)
    assert sorted(x for p in parts for x in p) == b and len(parts) == 3
    assert parts[0][0] == 16 and parts[0][-1] == 1024  # small and large in each
    assert prebuild.split([16], 4) == [[16]]
    opts = CudaOptions(parallel_build=8)
    assert prebuild.worker_count(opts, b, 100, 10_000) == 7  # one per bucket at most
    assert prebuild.worker_count(opts, b, 1000, 10_000) == 5  # half the free memory
    assert prebuild.worker_count(opts, b, 4000, 10_000) == 0  # one process: not worth it
    assert prebuild.worker_count(CudaOptions(parallel_build=0), b, 1, 10**9) == 0
    assert prebuild.worker_count(CudaOptions(), [16], 1, 10**9) == 0
    assert prebuild.worker_count(CudaOptions(), b[:5], 1, 10**9) == 0  # few buckets: serial
    assert prebuild.worker_count(CudaOptions(parallel_build=2), b[:5], 1, 10**9) == 2


def test_a_failing_worker_is_logged_and_ignored(tmp_path, caplog, monkeypatch):
    """A worker that cannot build (here: a model folder it cannot read) costs a warning, never
    the build: prebuild() returns what failed."""
    model = tiny_model("fp16", max_tokens=64, max_batch=8)
    monkeypatch.setattr(prebuild, "_write_model", lambda m, folder: None)  # nothing to read
    with caplog.at_level(logging.WARNING, logger="zoi"):
        info = prebuild.prebuild(model, CudaOptions(), [16, 64], 2, 0)
    assert info["processes"] == 2 and sorted(info["failed_buckets"]) == [16, 64]
    assert "kernel-compiling process" in caplog.text and "failed" in caplog.text


@pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1", reason="the workers' own run: interpreter"
)
def test_workers_build_their_buckets_under_the_interpreter(tmp_path):
    """The whole protocol with real workers (the interpreter, so on any CI machine): options
    and model reach them and each builds its buckets (exit 0)."""
    model = tiny_model("fp16", max_tokens=64, max_batch=8)
    opts = CudaOptions(pdl=False)
    info = prebuild.prebuild(model, opts, [16, 64], 2, 0)
    assert info == {**info, "processes": 2, "failed_buckets": []}


torch = pytest.importorskip("torch")
GPU = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="needs a CUDA GPU")
def test_cold_build_compiles_in_workers_once(tmp_path, monkeypatch):
    """The first build of these shapes (fresh Triton cache) runs workers, the second none; both
    give the same bits as a build without workers."""
    from zoi.backends.cuda.backend import CudaBackend

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    model = tiny_model("int8", max_tokens=256, max_batch=16, default="dynamic_asym")
    f = tmp_path / "cuda_paths.json"
    opts = CudaOptions(path_cache=str(f), parallel_build=2)
    be1 = CudaBackend(model, buckets=[16, 64, 256], options=opts)
    info = be1.memory()["prebuild"]
    assert info["processes"] == 2 and info["failed_buckets"] == [], info
    assert "kernels" in json.dumps(json.loads(f.read_text()))
    ids, pos, cu = batch([40, 7, 33], int(model.spec.vocab_size), np.random.default_rng(2))
    want = be1.run(ids, pos, cu, True)
    del be1
    be2 = CudaBackend(model, buckets=[16, 64, 256], options=opts)
    assert be2.memory()["prebuild"] is None  # marked built: no worker
    np.testing.assert_array_equal(be2.run(ids, pos, cu, True), want)
    plain = dataclasses.replace(opts, path_cache=None)
    be3 = CudaBackend(model, buckets=[16, 64, 256], options=plain)
    np.testing.assert_array_equal(be3.run(ids, pos, cu, True), want)
