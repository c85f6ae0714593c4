"""`zoi bench serve --target triton|ray|zoi`: start the server the load goes to.

zoi: `zoi serve` (the bench's own ServerProcess). triton: the artifact exported to a temporary
model repository and served by tritonserver (requests on its KServe v2 HTTP route, the same
bytes the bench sends to `zoi serve --route kserve`). ray: `zoi deploy ray` with --replicas.
A model folder (or none: the bundled MiniLM) is compiled to a temporary fp32 artifact first.
`--gpus` puts one engine per GPU on each target: `zoi serve --device cuda --gpus`,
a Triton instance group per GPU, a Ray replica per GPU.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

TARGETS = ("zoi", "triton", "ray")


def add_target_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--target",
        choices=TARGETS,
        default="zoi",
        help="server to start: zoi serve, Triton Inference Server (zoi export triton) or Ray "
        "Serve (zoi deploy ray) [default zoi]; ignored with --url",
    )
    p.add_argument("--replicas", type=int, default=2, help="--target ray: replicas [default 2]")
    p.add_argument(
        "--instances", type=int, default=1, help="--target triton: model instances [default 1]"
    )
    p.add_argument(
        "--gpus",
        default=None,
        help="one engine per GPU ('all' or ids like 0,1): zoi serve --device cuda --gpus, a "
        "Triton instance group per GPU, a Ray replica per GPU [default: the CPU]",
    )
    p.add_argument(
        "--queue-delay-us",
        type=int,
        default=None,
        help="batching queue delay of the started server (default: its own default)",
    )


@dataclass
class Started:
    url: str
    model: str | None  # the name requests use (None: ask the server's /info)
    route: str | None  # a route the target needs (None: the bench's --route)
    handles: list = field(default_factory=list)
    tmp: str | None = None

    def stop(self) -> None:
        for h in reversed(self.handles):
            h.stop()
        if self.tmp:
            shutil.rmtree(self.tmp, ignore_errors=True)


def _artifact(model: str | None, tmp: str) -> Path:
    import zoi
    from zoi.engine import is_artifact

    if model and is_artifact(model):
        return Path(model)
    out = Path(tmp) / "artifact"
    print("compiling the model to a temporary artifact ...", file=sys.stderr, flush=True)
    zoi.compile(model, device="cpu").save(out)
    return out


def start_target(args) -> Started:
    target = getattr(args, "target", "zoi")
    delay = getattr(args, "queue_delay_us", None)
    gpus_opt = getattr(args, "gpus", None)
    from zoi.integrations.gpus import parse_gpus

    gpus = parse_gpus(gpus_opt)
    gtag = (
        "" if gpus is None else "-g" + ("all" if isinstance(gpus, str) else "".join(map(str, gpus)))
    )
    if target == "zoi":
        from zoi.bench.loadtest import ServerProcess

        env = {"ZOI_MAX_QUEUE_DELAY_US": str(delay)} if delay is not None else None
        extra = [] if gpus is None else ["--device", "cuda", "--gpus", str(gpus_opt)]
        srv = ServerProcess(args.model, env=env, args=extra + list(args.server_arg))
        return Started(srv.url, None, None, [srv])
    tmp = tempfile.mkdtemp(prefix=f"zoi-bench-{target}-")
    try:
        art = _artifact(args.model, tmp)
        if target == "triton":
            from zoi.integrations.triton import TritonServerProcess, export_repository

            kw = {} if delay is None else {"max_queue_delay_us": delay}
            name = f"zoi-{args.instances}i{gtag}"  # the model name tells the variant in the results
            export_repository(
                art, Path(tmp) / "repo", name=name, instances=args.instances, gpus=gpus, **kw
            )
            cores = len(os.sched_getaffinity(0))
            threads = max(1, cores // args.instances)
            where = "" if gpus is None else f" per GPU, --gpus {gpus_opt}"
            print(f"starting tritonserver ({args.instances} instances{where}) ...", file=sys.stderr)
            env = {"ZOI_NUM_THREADS": str(threads)} if gpus is None else {}
            srv = TritonServerProcess(Path(tmp) / "repo", env=env)
            return Started(srv.url, name, "kserve", [srv], tmp)
        if target == "ray":
            from zoi.integrations.ray import RayServeProcess

            tag = "-haproxy" if "haproxy" in " ".join(args.server_arg) else ""
            replicas = args.replicas if gpus is None else 1  # with --gpus: one per GPU
            label = f"ray-{replicas}r{tag}" if gpus is None else f"ray{gtag}{tag}"
            extra = ["--log-level", "warning", "--served-model-name", label]
            if gpus is not None:
                extra += ["--gpus", str(gpus_opt)]
            extra += args.server_arg
            if delay is not None:
                extra += ["--max-queue-delay-us", str(delay)]
            print(f"starting Ray Serve ({label}) ...", file=sys.stderr)
            srv = RayServeProcess(art, replicas=replicas, args=extra)
            return Started(srv.url, None, None, [srv], tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    raise ValueError(f"unknown target {target!r} ({', '.join(TARGETS)})")


def tree_cpu_seconds(root: int) -> float:
    """User + system CPU seconds of process `root` and all its live descendants (Linux /proc).

    On a shared machine, throughput depends on the CPU share the server gets; CPU seconds per
    request does not, so the paths are compared on both.
    """
    procs: dict[int, tuple[int, float]] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            f = (d / "stat").read_text().rsplit(")", 1)[1].split()
            procs[int(d.name)] = (int(f[1]), (int(f[11]) + int(f[12])) / tick)
        except (OSError, ValueError, IndexError):
            continue
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in procs.items():
        children.setdefault(ppid, []).append(pid)
    total, stack = 0.0, [root]
    while stack:
        p = stack.pop()
        if p in procs:
            total += procs[p][1]
        stack.extend(children.get(p, []))
    return total


def server_pid(started: Started) -> int:
    return started.handles[0].proc.pid
