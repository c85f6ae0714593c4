"""`zoi bench serve --target triton|ray|zoi`: start the server the load goes to.

zoi: `zoi serve` (the bench's own ServerProcess). triton: the artifact exported to a temporary
model repository and served by tritonserver (requests on its KServe v2 HTTP route, the same
bytes the bench sends to `zoi serve --route kserve`). ray: `zoi deploy ray` with --replicas.
A model folder (or none: the bundled MiniLM) is compiled to a temporary fp32 artifact first.
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
    if target == "zoi":
        from zoi.bench.loadtest import ServerProcess

        env = {"ZOI_MAX_QUEUE_DELAY_US": str(delay)} if delay is not None else None
        srv = ServerProcess(args.model, env=env, args=list(args.server_arg))
        return Started(srv.url, None, None, [srv])
    tmp = tempfile.mkdtemp(prefix=f"zoi-bench-{target}-")
    try:
        art = _artifact(args.model, tmp)
        if target == "triton":
            from zoi.integrations.triton import TritonServerProcess, export_repository

            kw = {} if delay is None else {"max_queue_delay_us": delay}
            name = f"zoi-{args.instances}i"  # the model name tells the variant in the results
            export_repository(art, Path(tmp) / "repo", name=name, instances=args.instances, **kw)
            cores = len(os.sched_getaffinity(0))
            threads = max(1, cores // args.instances)
            print(f"starting tritonserver ({args.instances} instances) ...", file=sys.stderr)
            srv = TritonServerProcess(Path(tmp) / "repo", env={"ZOI_NUM_THREADS": str(threads)})
            return Started(srv.url, name, "kserve", [srv], tmp)
        if target == "ray":
            from zoi.integrations.ray import RayServeProcess

            tag = "-haproxy" if "haproxy" in " ".join(args.server_arg) else ""
            extra = ["--log-level", "warning", "--served-model-name", f"ray-{args.replicas}r{tag}"]
            extra += args.server_arg
            if delay is not None:
                extra += ["--max-queue-delay-us", str(delay)]
            print(f"starting Ray Serve ({args.replicas} replicas) ...", file=sys.stderr)
            srv = RayServeProcess(art, replicas=args.replicas, args=extra)
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
