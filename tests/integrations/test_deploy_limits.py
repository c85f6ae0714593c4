"""What the scale-out paths expose and what they say when the environment is wrong: a local Ray
of `zoi deploy ray` kept on the loopback address, and the Python Triton runs model.py with,
checked up front (`zoi export triton --check`) and at load (model.py's own messages)."""

from __future__ import annotations

import importlib.util
import ipaddress
import json
import os
import sys
import types
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from zoi.cli import build_parser

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def ref_artifact(small_bert, tmp_path_factory) -> Path:
    """A small artifact, compiled and served on the reference backend (no native core)."""
    import zoi

    out = tmp_path_factory.mktemp("art") / "small"
    zoi.compile(small_bert, device="reference", max_tokens=64).save(out)
    return out


# ---- Ray: the arguments of the local Ray ----------------------------------------------------
class _Stop(Exception):
    pass


def _fake_ray(monkeypatch) -> dict:
    """`ray` and `ray.serve` modules that record ray.init's arguments and stop the command at
    serve.start (no cluster is started)."""
    seen: dict = {}
    ray = types.ModuleType("ray")
    serve = types.ModuleType("ray.serve")

    def init(**kw):
        seen["init"] = kw
        seen["env"] = os.environ.get("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER")
        seen["loopback"] = os.environ.get("ZOI_RAY_LOOPBACK")

    def start(**kw):
        seen["serve"] = kw
        raise _Stop

    ray.init = init
    ray.serve = serve
    serve.start = start
    monkeypatch.setitem(sys.modules, "ray", ray)
    monkeypatch.setitem(sys.modules, "ray.serve", serve)
    # whatever the command sets is undone after the test
    monkeypatch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "unset-by-test")
    monkeypatch.setenv("ZOI_RAY_LOOPBACK", "unset-by-test")
    monkeypatch.delenv("ZOI_HOST", raising=False)
    return seen


def _deploy(argv: list[str]):
    args = build_parser().parse_args(["deploy", "ray", "ART", *argv])
    with pytest.raises(_Stop):
        args.func(args)


def test_local_ray_binds_the_loopback_address(monkeypatch):
    seen = _fake_ray(monkeypatch)
    _deploy([])  # the default --host 127.0.0.1
    kw = seen["init"]
    assert kw["address"] == "local"
    assert kw["_node_ip_address"] == "127.0.0.1"
    assert kw["include_dashboard"] is False and kw["dashboard_host"] == "127.0.0.1"
    assert seen["env"] == "0"  # Ray keeps 127.0.0.1 instead of the machine's outward address
    assert seen["loopback"] == "1"  # the replicas' own gRPC server too (ZoiReplica)
    assert seen["serve"]["http_options"]["host"] == "127.0.0.1"

    _deploy(["--host", "localhost", "--dashboard"])
    kw = seen["init"]
    assert kw["_node_ip_address"] == "127.0.0.1" and kw["include_dashboard"] is True
    assert kw["dashboard_host"] == "127.0.0.1"


@pytest.mark.parametrize(
    "argv", [["--max-header-bytes", "1024"], ["--header-timeout", "5", "--max-connections", "9"]]
)
def test_transport_limits_refused_by_name(monkeypatch, argv):
    """zoi serve's connection limits live in its own HTTP server; behind Ray's proxy they would be
    accepted and not applied, so the command refuses them (before Ray is started)."""
    seen = _fake_ray(monkeypatch)
    args = build_parser().parse_args(["deploy", "ray", "ART", *argv])
    with pytest.raises(SystemExit, match="Ray's proxy") as e:
        args.func(args)
    for flag in argv[::2]:
        assert flag in str(e.value)
    assert "init" not in seen


def test_public_host_leaves_ray_its_own_addresses(monkeypatch):
    seen = _fake_ray(monkeypatch)
    _deploy(["--host", "0.0.0.0"])
    kw = seen["init"]
    assert "_node_ip_address" not in kw
    assert kw["include_dashboard"] is False and kw["dashboard_host"] == "127.0.0.1"
    assert seen["env"] == "unset-by-test" and seen["loopback"] == "unset-by-test"
    assert seen["serve"]["http_options"]["host"] == "0.0.0.0"


def test_joining_a_cluster_passes_only_its_address(monkeypatch):
    seen = _fake_ray(monkeypatch)
    _deploy(["--address", "10.0.0.5:6379"])
    assert seen["init"]["address"] == "10.0.0.5:6379"
    assert "_node_ip_address" not in seen["init"]
    assert seen["env"] == "unset-by-test"


def test_replica_grpc_server_moved_to_loopback(monkeypatch):
    """Ray Serve binds a replica's inter-deployment gRPC server to [::]; in a loopback-only
    deployment the replica rebinds it to 127.0.0.1 (and only then)."""
    from zoi.integrations import ray as zray

    calls = []
    replica = types.ModuleType("ray.serve._private.replica")
    replica.add_port_to_grpc_server = lambda server, address: calls.append(address) or 1234
    pkg = types.ModuleType("ray.serve._private")
    pkg.replica = replica
    serve = types.ModuleType("ray.serve")
    serve._private = pkg
    ray = types.ModuleType("ray")
    ray.serve = serve
    for name, mod in (
        ("ray", ray),
        ("ray.serve", serve),
        ("ray.serve._private", pkg),
        ("ray.serve._private.replica", replica),
    ):
        monkeypatch.setitem(sys.modules, name, mod)
    monkeypatch.delenv("ZOI_RAY_LOOPBACK", raising=False)
    zray._replica_grpc_on_loopback()
    replica.add_port_to_grpc_server(None, "[::]:0")
    assert calls == ["[::]:0"]  # not a loopback deployment: Ray's own binding
    monkeypatch.setenv("ZOI_RAY_LOOPBACK", "1")
    zray._replica_grpc_on_loopback()
    zray._replica_grpc_on_loopback()  # once only
    assert replica.add_port_to_grpc_server(None, "[::]:0") == 1234
    assert calls == ["[::]:0", "127.0.0.1:0"]


def test_is_loopback():
    from zoi.integrations.ray import is_loopback

    for h in ("127.0.0.1", "127.1.2.3", "localhost", "::1", "[::1]", "LOCALHOST"):
        assert is_loopback(h), h
    for h in ("0.0.0.0", "::", "10.0.0.1", "example.org", ""):
        assert not is_loopback(h), h


# ---- Ray: nothing of a real local deployment listens beyond the loopback ----------------------
def _listening(pids: list[int]) -> list[tuple[int, str, int]]:
    """(pid, address, port) of every TCP socket the processes listen on (/proc/net/tcp{,6})."""
    inodes: dict[str, int] = {}
    for pid in pids:
        try:
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                try:
                    target = os.readlink(fd)
                except OSError:
                    continue
                if target.startswith("socket:["):
                    inodes[target[8:-1]] = pid
        except OSError:
            continue
    out = []
    for name, v6 in (("tcp", False), ("tcp6", True)):
        try:
            rows = Path(f"/proc/net/{name}").read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            f = row.split()
            if f[3] != "0A" or f[9] not in inodes:  # 0A: LISTEN
                continue
            hexaddr, hexport = f[1].split(":")
            raw = bytes.fromhex(hexaddr)
            if v6:  # four little-endian 32-bit words
                raw = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
                addr = ipaddress.IPv6Address(raw)
                addr = addr.ipv4_mapped or addr
            else:
                addr = ipaddress.IPv4Address(raw[::-1])
            out.append((inodes[f[9]], str(addr), int(hexport, 16)))
    return out


@pytest.mark.slow
def test_local_deployment_listens_on_loopback_only(ref_artifact, tmp_path):
    pytest.importorskip("ray.serve")
    from zoi.integrations.ray import RayServeProcess

    srv = RayServeProcess(
        ref_artifact,
        replicas=1,
        args=["--log-level", "warning", "--device", "reference"],
        log_path=tmp_path / "deploy.log",
        startup_timeout=240,
    )
    try:
        socks = _listening(srv.session_pids())
        assert len({p for p, _, _ in socks}) >= 3  # driver/proxy, gcs_server, raylet, ...
        exposed = [s for s in socks if not ipaddress.ip_address(s[1]).is_loopback]
        names = {p: Path(f"/proc/{p}/comm").read_text().strip() for p, _, _ in exposed}
        assert not exposed, f"listening beyond the loopback: {exposed} {names}"
        with urllib.request.urlopen(srv.url + "/info", timeout=60) as r:  # and it serves
            assert r.status == 200
    finally:
        srv.stop()


# ---- Triton: the target Python, checked up front ------------------------------------------------
def test_check_reports_numpy2_in_this_venv(tmp_path):
    """This venv has numpy 2: the check names it, the interpreter and the way out."""
    from zoi.integrations.triton import check_python

    found, problems = check_python(sys.executable)
    major = int(np.__version__.split(".")[0])
    assert found["numpy"] == np.__version__
    if major >= 2:
        text = "\n".join(problems)
        assert f"numpy {np.__version__}" in text and "numpy 1.x" in text
        assert "scripts/triton_env.sh" in text and ".venv-triton" in text
        assert sys.executable in text or os.path.realpath(sys.executable) in text
    else:
        assert problems == []


def test_export_check_command(ref_artifact, tmp_path, capsys):
    artifact = ref_artifact
    from zoi.cli import main

    repo = tmp_path / "repo"
    rc = main(["export", "triton", str(artifact), str(repo), "--check", "--python", sys.executable])
    err = capsys.readouterr().err
    if int(np.__version__.split(".")[0]) >= 2:
        assert rc == 2 and "cannot run it" in err and "numpy" in err
    else:
        assert rc == 0 and "model.py can run there" in err
    assert not repo.exists()  # --check writes nothing
    # the export itself warns, and still writes the repository
    assert main(["export", "triton", str(artifact), str(repo), "--python", sys.executable]) == 0
    assert len(list(repo.glob("*/1/model.py"))) == 1
    # a missing interpreter, a missing package
    rc = main(["export", "triton", str(artifact), str(repo), "--check", "--python", "/nope/py"])
    assert rc == 2 and "cannot run it" in capsys.readouterr().err
    empty = tmp_path / "bare"
    empty.mkdir()
    fake = empty / "python3"
    fake.write_text(f'#!/bin/sh\nexec {sys.executable} -S -I "$@"\n')
    fake.chmod(0o755)  # no site-packages: numpy, tokenizers, zoi all missing
    rc = main(["export", "triton", str(artifact), str(repo), "--check", "--python", str(fake)])
    err = capsys.readouterr().err
    assert rc == 2 and "numpy does not import" in err and "zoi does not import" in err


def test_check_passes_in_the_triton_env():
    """The documented environment passes (when scripts/triton_env.sh has built it here)."""
    from zoi.integrations.triton import check_python, default_venv

    py = default_venv() / "bin" / "python"
    if not py.exists():
        pytest.skip(f"no Triton environment at {py.parent.parent} (scripts/triton_env.sh)")
    found, problems = check_python(py)
    assert problems == [] and found["numpy"].startswith("1.")


# ---- Triton: model.py says what failed and what it needs --------------------------------------
class _Logger:
    lines: list[str] = []

    @classmethod
    def log_error(cls, msg):
        cls.lines.append(msg)


def _fake_pb_utils() -> types.ModuleType:
    pb = types.ModuleType("triton_python_backend_utils")
    pb.Logger = _Logger
    _Logger.lines = []
    return pb


def _load_model_py(path: Path):
    spec = importlib.util.spec_from_file_location("zoi_triton_model_under_test", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _model_args(model_dir: Path, **params) -> dict:
    cfg = {"parameters": {k: {"string_value": v} for k, v in params.items()}}
    return {
        "model_config": json.dumps(cfg),
        "model_repository": str(model_dir),
        "model_version": "1",
        "model_instance_kind": "CPU",
        "model_instance_device_id": "0",
    }


@pytest.fixture()
def exported(ref_artifact, tmp_path) -> Path:
    from zoi.integrations.triton import export_repository

    return export_repository(ref_artifact, tmp_path / "repo", name="m")


def test_model_py_logs_a_failed_zoi_import(exported, monkeypatch):
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", _fake_pb_utils())
    mod = _load_model_py(exported / "1" / "model.py")
    # zoi's runtime cannot be imported in this Python (None in sys.modules: ImportError)
    monkeypatch.setitem(sys.modules, "zoi.integrations.triton_runtime", None)
    with pytest.raises(ImportError) as e:
        mod.TritonPythonModel().initialize(_model_args(exported, zoi_allow_numpy2="true"))
    msg = str(e.value)
    assert "cannot import zoi" in msg and "ModuleNotFoundError" in msg
    assert sys.executable in msg and f"numpy {np.__version__}" in msg
    assert "scripts/triton_env.sh" in msg and "zoi_python_path" in msg
    assert _Logger.lines == [msg]  # in the server log, not only in the exception


def test_model_py_refuses_numpy2_with_the_reason(exported, monkeypatch):
    if int(np.__version__.split(".")[0]) < 2:
        pytest.skip("numpy 1 here")
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", _fake_pb_utils())
    mod = _load_model_py(exported / "1" / "model.py")
    with pytest.raises(RuntimeError) as e:
        mod.TritonPythonModel().initialize(_model_args(exported))
    msg = str(e.value)
    assert f"numpy {np.__version__}" in msg and "numpy 1.x" in msg
    assert ".venv-triton" in msg and "zoi_allow_numpy2" in msg
    assert _Logger.lines == [msg]
    # allowed: it goes on to load the engine (the reference device: no native core needed)
    model = mod.TritonPythonModel()
    model.initialize(_model_args(exported, zoi_allow_numpy2="true", zoi_device="reference"))
    assert model.runner.engine.device == "reference"


def test_model_py_outside_triton_says_what_it_needs(exported, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", None)
    with pytest.raises(ImportError) as e:
        _load_model_py(exported / "1" / "model.py")
    msg = str(e.value)
    assert "cannot import triton_python_backend_utils" in msg and "tritonserver" in msg
    assert "zoi model.py: cannot import triton_python_backend_utils" in capsys.readouterr().err
