"""GPU placement and the Triton repository, checked without a server or a GPU."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from zoi.integrations.gpus import ALL, parse_gpus, resolve_gpus
from zoi.integrations.ray import deployment_options
from zoi.integrations.triton import export_repository, instance_groups, render_config


def test_parse_gpus():
    assert parse_gpus(None) is None and parse_gpus("") is None and parse_gpus("cpu") is None
    assert parse_gpus("all") == ALL and parse_gpus(" ALL ") == ALL
    assert parse_gpus("1,0") == [0, 1] and parse_gpus("3") == [3] and parse_gpus("0 2") == [0, 2]
    for bad, why in (("0,x", "not an integer"), ("-1", ">= 0"), ("0,0", "twice"), (",", "no GPU")):
        with pytest.raises(ValueError, match=why):
            parse_gpus(bad)


def test_resolve_gpus_for_any_count():
    assert resolve_gpus(None, 0) == []
    assert resolve_gpus(ALL, 8) == list(range(8))
    assert resolve_gpus([1, 3], 4) == [1, 3]
    with pytest.raises(ValueError, match="GPU 2 does not exist here .2 visible"):
        resolve_gpus([0, 2], 2)
    with pytest.raises(ValueError, match="no CUDA GPU is visible"):
        resolve_gpus(ALL, 0)


def test_instance_groups_cpu_and_per_gpu():
    assert instance_groups(3) == [{"count": 3, "kind": "KIND_CPU"}]
    assert instance_groups(1, ALL) == [{"count": 1, "kind": "KIND_GPU"}]
    got = instance_groups(2, [0, 1, 5])
    assert got == [{"count": 2, "kind": "KIND_GPU", "gpus": [g]} for g in (0, 1, 5)]
    with pytest.raises(ValueError, match="--instances"):
        instance_groups(0)
    with pytest.raises(ValueError, match="empty list"):
        instance_groups(1, [])


def test_render_config_text():
    text = render_config("m", 384, instance_groups(1, [0, 1]), 64, 750, 8, {"zoi_artifact": 'a"b'})
    assert 'backend: "python"' in text and "max_batch_size: 64" in text
    assert '{ name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] }' in text
    assert '{ name: "EMBEDDING" data_type: TYPE_FP32 dims: [ 384 ] }' in text
    assert "max_queue_delay_microseconds: 750" in text and "max_queue_size: 8" in text
    assert "timeout_action: REJECT" in text
    assert "{ count: 1 kind: KIND_GPU gpus: [ 0 ] }," in text
    assert "{ count: 1 kind: KIND_GPU gpus: [ 1 ] }\n]" in text
    assert 'string_value: "a\\"b"' in text
    assert text.count("{") == text.count("}")
    with pytest.raises(ValueError, match="max-queue-delay-us"):
        render_config("m", 384, instance_groups(1), max_queue_delay_us=-1)


def test_export_repository_layout(artifact, tmp_path):
    model = export_repository(artifact, tmp_path / "repo", instances=2, max_queue_delay_us=100)
    assert model.name == "all-MiniLM-L6-v2"
    files = sorted(p.relative_to(model).as_posix() for p in model.rglob("*") if p.is_file())
    assert files == [
        "1/artifact/tokenizer.json",
        "1/artifact/weights.safetensors",
        "1/artifact/zoi.json",
        "1/model.py",
        "config.pbtxt",
    ]
    cfg = (model / "config.pbtxt").read_text()
    assert 'name: "all-MiniLM-L6-v2"' in cfg and "{ count: 2 kind: KIND_CPU }" in cfg
    w = model / "1" / "artifact" / "weights.safetensors"
    assert w.stat().st_size == (artifact / "weights.safetensors").stat().st_size
    assert "class TritonPythonModel" in (model / "1" / "model.py").read_text()
    m2 = export_repository(
        artifact,
        tmp_path / "repo",
        name="m2",
        python_path=[str(tmp_path / "lib"), "rel"],
        normalize=False,
        truncate=False,
        max_tokens=512,
    )
    cfg2 = (m2 / "config.pbtxt").read_text()
    want = os.pathsep.join([str((tmp_path / "lib").resolve()), str(Path("rel").resolve())])
    assert f'key: "zoi_python_path" value: {{ string_value: "{want}" }}' in cfg2
    for k, v in (("zoi_normalize", "false"), ("zoi_truncate", "false"), ("zoi_max_tokens", "512")):
        assert f'key: "{k}" value: {{ string_value: "{v}" }}' in cfg2
    with pytest.raises(FileNotFoundError, match="not a zoi artifact"):
        export_repository(tmp_path, tmp_path / "r2")
    with pytest.raises(ValueError, match="model name"):
        export_repository(artifact, tmp_path / "r3", name="a b")


def test_export_cli_writes_per_gpu_groups(artifact, tmp_path, capsys):
    from zoi.cli import main

    rc = main(
        [
            "export",
            "triton",
            str(artifact),
            str(tmp_path / "r"),
            "--gpus",
            "0,1",
            "--name",
            "emb",
            "--max-queue-delay-us",
            "250",
        ]
    )
    assert rc == 0
    cfg = (tmp_path / "r" / "emb" / "config.pbtxt").read_text()
    assert cfg == capsys.readouterr().out
    assert "gpus: [ 0 ]" in cfg and "gpus: [ 1 ]" in cfg and "KIND_CPU" not in cfg
    assert main(["export", "triton", str(artifact), str(tmp_path / "r"), "--gpus", "x"]) == 2


def test_ray_deployment_options_cpu_and_gpu():
    o = deployment_options(2, threads_per_replica=1)
    assert o["num_replicas"] == 2 and o["max_ongoing_requests"] >= 64
    assert o["ray_actor_options"]["runtime_env"]["env_vars"] == {"ZOI_NUM_THREADS": "1"}
    assert "num_gpus" not in o["ray_actor_options"]
    cores = len(os.sched_getaffinity(0))
    assert deployment_options(1)["ray_actor_options"]["runtime_env"]["env_vars"] == {
        "ZOI_NUM_THREADS": str(cores)
    }
    g = deployment_options(1, [0, 1, 2, 3], gpu_count=4)
    assert g["num_replicas"] == 4 and g["ray_actor_options"]["num_gpus"] == 1.0
    assert deployment_options(1, ALL, gpu_count=8)["num_replicas"] == 8
    assert deployment_options(2, [0, 1], gpu_count=2)["num_replicas"] == 2
    with pytest.raises(ValueError, match="one replica per GPU means 2 replicas"):
        deployment_options(3, [0, 1], gpu_count=2)
    with pytest.raises(ValueError, match="--replicas"):
        deployment_options(0)


def test_cli_parses_deploy_ray_and_bench_targets():
    from zoi.cli import build_parser

    ap = build_parser()
    a = ap.parse_args(
        ["deploy", "ray", "ART", "--replicas", "3", "--port", "9000", "--max-queue-delay-us", "100"]
    )
    assert (a.artifact, a.replicas, a.port, a.max_queue_delay_us) == ("ART", 3, 9000, 100)
    assert a.func.__name__ == "cmd_deploy_ray" and a.gpus is None
    b = ap.parse_args(["bench", "serve", "--target", "triton", "--instances", "2"])
    assert (b.target, b.instances, b.replicas) == ("triton", 2, 2)
    assert ap.parse_args(["bench", "serve"]).target == "zoi"
    c = ap.parse_args(["export", "triton", "ART", "REPO", "--instances", "4", "--gpus", "all"])
    assert (c.instances, c.gpus, c.max_queue_delay_us) == (4, "all", 500)


def test_deploy_ray_freezes_each_replicas_heap(artifact):
    """`zoi deploy ray` takes --gc-freeze / --no-gc-freeze for its replicas (their processes are
    Ray's, so zoi serve's start-up freeze runs in the replica's constructor)."""
    import dataclasses
    import gc

    from zoi.cli import build_parser
    from zoi.integrations.ray import ZoiReplica
    from zoi.serve.cli import PROCESS_OPTIONS, config_from_args

    ap = build_parser()
    on = config_from_args(ap.parse_args(["deploy", "ray", "ART"]), skip=PROCESS_OPTIONS)
    off = config_from_args(
        ap.parse_args(["deploy", "ray", "ART", "--no-gc-freeze"]), skip=PROCESS_OPTIONS
    )
    assert on.gc_freeze and not off.gc_freeze
    try:
        for cfg, frozen in ((off, False), (on, True)):
            gc.unfreeze()
            fields = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}
            rep = ZoiReplica(str(artifact), fields, None, "cpu")
            rep.service.close()
            assert (gc.get_freeze_count() > 0) is frozen
    finally:
        gc.unfreeze()
