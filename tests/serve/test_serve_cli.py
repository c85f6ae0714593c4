"""`zoi serve` options and start-up failures: flags, environment variables, clear errors."""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys

import pytest

from zoi.serve.cli import config_from_args, register
from zoi.serve.config import OPTIONS, ServeConfig


def parse(argv, env=None):
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers()
    register(sub)
    return config_from_args(ap.parse_args(["serve", *argv]), env or {})


def test_every_option_has_a_flag_and_a_variable():
    fields = set(ServeConfig.__dataclass_fields__)
    assert {o.dest for o in OPTIONS} == fields
    assert all(o.env.startswith("ZOI_") and o.flag.startswith("--") for o in OPTIONS)


def test_flag_beats_env_beats_default():
    env = {
        "ZOI_MAX_BATCH_TOKENS": "1024",
        "ZOI_PORT": "9000",
        "ZOI_AUTO_TRUNCATE": "false",
        "ZOI_MAX_QUEUE_DELAY_US": "250",
    }
    c = parse(["--max-batch-tokens", "2048"], env)
    assert c.max_batch_tokens == 2048 and c.port == 9000 and c.auto_truncate is False
    assert (
        c.max_queue_delay_us == 250
        and c.max_concurrent_requests == ServeConfig().max_concurrent_requests
    )
    assert parse(["--auto-truncate"], env).auto_truncate is True
    with pytest.raises(ValueError, match="ZOI_PORT"):
        parse([], {"ZOI_PORT": "eighty"})
    with pytest.raises(ValueError, match="max_batch_requests"):
        parse(["--max-batch-requests", "0"]).validate()


def run_serve(*args, timeout=120):
    return subprocess.run(
        [sys.executable, "-m", "zoi.serve", *args], capture_output=True, text=True, timeout=timeout
    )


def test_missing_model_folder_fails_clearly(tmp_path):
    p = run_serve(str(tmp_path / "nope"), "--port", "0")
    assert p.returncode == 2 and "zoi serve: error" in p.stderr and "nope" in p.stderr


def test_port_in_use_fails_clearly(device):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        p = run_serve("--port", str(port), "--device", device)
    assert p.returncode == 2 and f"cannot listen on 127.0.0.1:{port}" in p.stderr


def test_zoi_cli_has_serve():
    from zoi.cli import build_parser
    from zoi.serve.cli import cmd_serve

    args = build_parser().parse_args(
        ["serve", "some/model", "--port", "0", "--max-queue-delay-us", "100"]
    )
    assert args.func is cmd_serve and args.model == ["some/model"]
    c = config_from_args(args, {})
    assert c.port == 0 and c.max_queue_delay_us == 100


def test_bench_serve_parser():
    from zoi.bench.loadtest import cmd_bench_serve, make_texts, register_bench

    ap = argparse.ArgumentParser()
    register_bench(ap.add_subparsers())
    args = ap.parse_args(
        ["serve", "--url", "http://127.0.0.1:9", "-c", "1", "32", "--route", "kserve"]
    )
    assert args.func is cmd_bench_serve and args.concurrency == [1, 32] and args.route == "kserve"
    texts = make_texts(50, seed=0, min_words=4, max_words=60)
    assert texts == make_texts(50, seed=0, min_words=4, max_words=60)  # reproducible
    lens = [len(t.split()) for t in texts]
    assert min(lens) >= 4 and max(lens) <= 60 and len(set(lens)) > 10


def test_serve_a_saved_artifact_keeps_the_models_name(engine, device, tmp_path):
    import httpx
    import numpy as np

    from zoi.bench.loadtest import ServerProcess

    from .serve_helpers import cosine_rows

    art = engine.save(tmp_path / "minilm-art")
    with ServerProcess(
        str(art), env={"ZOI_DEVICE": device}, args=["--max-batch-tokens", "1024"]
    ) as srv:
        info = httpx.get(srv.url + "/info").json()
        # the name kept in the artifact, not its folder's
        assert info["model_id"] == "all-MiniLM-L6-v2" and info["max_batch_tokens"] == 1024
        r = httpx.post(
            srv.url + "/v1/embeddings",
            json={"model": "all-MiniLM-L6-v2", "input": ["from an artifact"]},
        )
        assert r.status_code == 200
        bad = {"model": "minilm-art", "input": ["x"]}
        assert httpx.post(srv.url + "/v1/embeddings", json=bad).status_code == 404
        assert (
            cosine_rows(
                np.array(r.json()["data"][0]["embedding"]), engine.encode("from an artifact")
            )[()]
            >= 0.9999
        )
    with ServerProcess(
        str(art), env={"ZOI_DEVICE": device, "ZOI_SERVED_MODEL_NAME": "my-embedder"}
    ) as srv:
        assert httpx.get(srv.url + "/info").json()["model_id"] == "my-embedder"
        assert httpx.get(srv.url + "/v2/models/my-embedder/ready").status_code == 200


def test_int8_compiles_go_through_the_artifact_cache(monkeypatch):
    """An INT8 / FP8 compile is cached (the next start loads it); FP32 and --no-compile-cache
    compile directly."""
    import zoi
    import zoi.cache
    from zoi.serve.cli import open_engine
    from zoi.serve.config import ServeConfig

    calls = []
    monkeypatch.setattr(
        zoi.cache,
        "cached_compile",
        lambda path, **kw: calls.append(("cache", path, kw)) or ("E", "cached", "/c/e"),
    )
    monkeypatch.setattr(
        zoi, "compile", lambda path, **kw: calls.append(("compile", path, kw)) or "F"
    )
    assert open_engine("m", ServeConfig(precision="int8")) == "E"
    assert calls[-1][0] == "cache" and calls[-1][2]["precision"] == "int8"
    assert open_engine("m", ServeConfig(precision="fp32")) == "F"
    assert open_engine("m", ServeConfig(precision="int8", compile_cache=False)) == "F"
    assert [c[0] for c in calls] == ["cache", "compile", "compile"]


def test_decoder_precision_words(monkeypatch):
    """--precision w8 (weight-only INT8: a decoder on the GPU) is one of zoi serve's choices; a
    decoder folder is compiled with the word as given, and the server shows it as it is."""
    from tests.decoder.fakes import ByteTokenizer, FakeBackend

    import zoi
    import zoi.serve.cli as cli
    from zoi.serve.decoder_service import DecoderService

    calls = []
    monkeypatch.setattr(cli, "_is_decoder", lambda model: True)
    monkeypatch.setattr(zoi, "compile", lambda path, **kw: calls.append((path, kw)) or "G")
    assert cli.open_engine("dec", parse(["--precision", "w8", "--device", "cuda"])) == "G"
    path, kw = calls[-1]
    assert (path, kw["precision"], kw["device"]) == ("dec", "w8", "cuda")
    assert ServeConfig.from_env({"ZOI_PRECISION": "w8"}).precision == "w8"
    with pytest.raises(ValueError, match="ZOI_PRECISION='w8a16': expected one of .*int8.*w8"):
        ServeConfig.from_env({"ZOI_PRECISION": "w8a16"})
    for word, shown in (("int8", "int8"), ("w8", "w8"), ("fp16", "float16"), ("fp32", "float32")):
        svc = DecoderService(FakeBackend(), ByteTokenizer(), precision=word)
        try:
            assert svc.dtype == shown, word
        finally:
            svc.close()
