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
    env = {"ZOI_MAX_BATCH_TOKENS": "1024", "ZOI_PORT": "9000", "ZOI_AUTO_TRUNCATE": "false",
           "ZOI_MAX_QUEUE_DELAY_US": "250"}
    c = parse(["--max-batch-tokens", "2048"], env)
    assert c.max_batch_tokens == 2048 and c.port == 9000 and c.auto_truncate is False
    assert c.max_queue_delay_us == 250 and c.max_concurrent_requests == ServeConfig().max_concurrent_requests
    assert parse(["--auto-truncate"], env).auto_truncate is True
    with pytest.raises(ValueError, match="ZOI_PORT"):
        parse([], {"ZOI_PORT": "eighty"})
    with pytest.raises(ValueError, match="max_batch_requests"):
        parse(["--max-batch-requests", "0"]).validate()


def run_serve(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "zoi.serve", *args], capture_output=True, text=True,
                          timeout=timeout)


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
