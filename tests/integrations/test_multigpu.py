"""One engine per GPU on the scale-out paths, checked without a GPU: the Triton
repository `zoi export triton --gpus 0,1` writes and the device each instance picks, and the
Ray Serve deployment `zoi deploy ray --gpus` builds (without starting a cluster)."""

from __future__ import annotations

import re

import pytest

from zoi.integrations.gpus import ALL
from zoi.integrations.triton_runtime import instance_device, open_runner


def _groups(cfg: str) -> list[str]:
    block = cfg.split("instance_group [", 1)[1].split("]\n", 1)[0] + "]"
    return re.findall(r"\{ count: (\d+) kind: (KIND_\w+)(?: gpus: \[ ([\d, ]+) \])? \}", block)


def test_export_triton_one_instance_group_per_gpu(artifact, tmp_path, capsys):
    from zoi.cli import main

    rc = main(["export", "triton", str(artifact), str(tmp_path / "r"), "--gpus", "1,0",
               "--instances", "2", "--name", "emb"])  # fmt: skip
    assert rc == 0
    model = tmp_path / "r" / "emb"
    cfg = (model / "config.pbtxt").read_text()
    assert cfg == capsys.readouterr().out
    assert _groups(cfg) == [("2", "KIND_GPU", "0"), ("2", "KIND_GPU", "1")]
    assert cfg.count("{") == cfg.count("}") and "KIND_CPU" not in cfg
    # model.py hands Triton's instance kind and device id to the runtime, which picks the GPU
    src = (model / "1" / "model.py").read_text()
    assert 'args.get("model_instance_device_id"' in src and 'args.get("model_instance_kind"' in src
    rc = main(["export", "triton", str(artifact), str(tmp_path / "r"), "--gpus", "all",
               "--name", "every"])  # fmt: skip
    assert rc == 0
    assert _groups((tmp_path / "r" / "every" / "config.pbtxt").read_text()) == [
        ("1", "KIND_GPU", "")
    ]
    capsys.readouterr()
    assert main(["export", "triton", str(artifact), str(tmp_path / "r"), "--gpus", "0,0"]) == 2
    assert "listed twice" in capsys.readouterr().err


def test_triton_instance_device():
    assert instance_device({}, "GPU", "1") == "cuda:1"
    assert instance_device({}, "GPU", 0) == "cuda:0"
    assert instance_device({}, "CPU", "0") == "cpu"
    assert instance_device({"zoi_device": "cpu"}, "GPU", "1") == "cpu"
    assert instance_device({"zoi_device": "cuda"}, "GPU", "3") == "cuda:3"
    with pytest.raises(ValueError, match="not a GPU id"):
        instance_device({}, "GPU", "x")


def test_open_runner_loads_each_instance_on_its_gpu(artifact, engine, tmp_path, monkeypatch):
    import zoi

    seen = []

    def fake_load(path, device=None, max_tokens=None):
        seen.append((str(path), device, max_tokens))
        return engine  # a CPU engine stands in for the GPU one

    monkeypatch.setattr(zoi, "load", fake_load)
    model_dir = tmp_path / "m" / "1"
    r1 = open_runner(model_dir, {"zoi_artifact": str(artifact)}, "GPU", "1")
    r0 = open_runner(model_dir, {"zoi_max_tokens": "512"}, "GPU", "0")
    rc = open_runner(model_dir, {}, "CPU", "0")
    assert [s[1] for s in seen] == ["cuda:1", "cuda:0", "cpu"]
    assert seen[0][0] == str(artifact) and seen[1][0] == str(model_dir / "artifact")
    assert seen[1][2] == 512
    out = r1.run([["two GPUs", "one engine each"]])[0]
    assert out.shape == (2, 384)
    assert r0.engine is rc.engine is engine


ray_serve = pytest.importorskip("ray.serve")


def test_ray_deployment_one_replica_per_gpu(artifact):
    from zoi.integrations.ray import make_deployment
    from zoi.serve.config import ServeConfig

    dep, args = make_deployment(artifact, 1, ALL, ServeConfig(max_queue_delay_us=300), gpu_count=2)
    assert dep.num_replicas == 2
    assert dep.ray_actor_options["num_gpus"] == 1.0
    assert "runtime_env" not in dep.ray_actor_options  # no CPU thread split on GPU replicas
    path, fields, name, device = args
    assert path == str(artifact.resolve()) and device == "cuda" and name is None
    assert fields["max_queue_delay_us"] == 300 and fields["gpus"] is None
    dep4, _ = make_deployment(artifact, 4, [0, 1, 2, 3], gpu_count=4)
    assert dep4.num_replicas == 4 and dep4.ray_actor_options["num_gpus"] == 1.0
    cpu, cargs = make_deployment(artifact, 2, None, threads_per_replica=1)
    assert cpu.num_replicas == 2 and "num_gpus" not in cpu.ray_actor_options
    assert cargs[3] == "cpu"
    with pytest.raises(ValueError, match="GPU 2 does not exist here"):
        make_deployment(artifact, 1, [0, 2], gpu_count=2)
    with pytest.raises(ValueError, match="one replica per GPU means 2 replicas"):
        make_deployment(artifact, 3, ALL, gpu_count=2)


def test_deploy_ray_cli_takes_gpus_and_every_serve_option():
    from zoi.cli import build_parser
    from zoi.serve.cli import PROCESS_OPTIONS, config_from_args

    a = build_parser().parse_args(
        ["deploy", "ray", "ART", "--gpus", "all", "--max-batch-tokens", "8192", "--port", "0"]
    )
    assert (a.gpus, a.replicas, a.max_batch_tokens) == ("all", 1, 8192)
    cfg = config_from_args(a, env={"ZOI_GPUS": "0,1", "ZOI_REPLICAS": "3"}, skip=PROCESS_OPTIONS)
    assert cfg.gpus is None and cfg.replicas is None and cfg.max_batch_tokens == 8192


def test_bench_multigpu_summary_ratios_and_target(tmp_path):
    import importlib.util
    import json

    from .conftest import REPO

    spec = importlib.util.spec_from_file_location(
        "bench_multigpu_summary", REPO / "scripts" / "bench_multigpu_summary.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)

    def row(target, model, c, tps, p99, errors=0):
        return {"target": target, "model": model, "concurrency": c, "texts_per_s": tps,
                "p99_ms": p99, "p50_ms": p99 / 2, "errors": errors}  # fmt: skip

    rows = [
        row("zoi", "zoi-g0", 16, 1000.0, 50.0), row("zoi", "zoi-g01", 16, 1900.0, 45.0),
        row("zoi", "zoi-g0", 16, 1100.0, 52.0), row("zoi", "zoi-g01", 16, 2000.0, 44.0),
        row("triton", "zoi-1i-g0", 16, 1000.0, 50.0), row("triton", "zoi-1i-g01", 16, 1500.0, 40.0),
        row("ray", "ray-g0", 64, 800.0, 90.0), row("ray", "ray-g01", 64, 1700.0, 95.0),
        row("zoi", "zoi-cpu", 16, 1.0, 1.0),  # no -g: not a variant of this bench
    ]  # fmt: skip
    s = mod.summarize(rows)
    z = s["zoi"]["16"]
    assert z["1gpu"]["texts_per_s"] == 1050.0 and z["2gpu"]["texts_per_s"] == 1950.0
    assert z["speedup_2_vs_1"] == round(1950 / 1050, 3) and z["target_met"] is True
    assert s["triton"]["16"]["target_met"] is False  # 1.5x
    assert s["ray"]["64"]["p99_no_worse"] is False and s["ray"]["64"]["target_met"] is False
    f = tmp_path / "rows.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "skip.txt").write_text("ray: ray[serve] is not installed\n")
    import subprocess
    import sys

    r = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "bench_multigpu_summary.py"), str(f),
         "--skipped", str(tmp_path / "skip.txt"), "--out", str(tmp_path / "s.json")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    doc = json.loads((tmp_path / "s.json").read_text())
    assert doc["summary"]["zoi"]["16"]["target_met"] and doc["skipped"] == [
        "ray: ray[serve] is not installed"
    ]
    assert "MET" in r.stderr
