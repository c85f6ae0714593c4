"""CPU seconds per request of each serving path (server processes only), and throughput.

On a shared machine throughput follows the CPU share a server gets (more processes, more
share); the CPU time the server's process tree spends per request does not. Each variant:
start it, warm up, then `--requests` requests from `--concurrency` clients (kserve route, the
bench's mixed-length texts); CPU = user + system seconds of the server and all its descendants
(tritonserver + stubs; Ray's driver, GCS, raylet, proxy, controller, replicas). Interleaved
over `--cycles`. Usage: python scripts/bench_scaleout_cpu.py ARTIFACT [-o OUT.jsonl]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time

from zoi.bench.loadtest import make_texts, run_load
from zoi.integrations.targets import server_pid, start_target, tree_cpu_seconds

VARIANTS = {
    "zoi": dict(target="zoi"),
    "zoi-1t": dict(target="zoi", env={"ZOI_NUM_THREADS": "1"}),
    "triton-1i": dict(target="triton", instances=1),
    "triton-2i": dict(target="triton", instances=2),
    "ray-2r": dict(target="ray", replicas=2),
    "ray-2r-haproxy": dict(target="ray", replicas=2, server_arg=["--proxy", "haproxy"]),
}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("artifact")
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS))
    ap.add_argument("--cycles", type=int, default=2)
    ap.add_argument("-c", "--concurrency", type=int, default=32)
    ap.add_argument("-n", "--requests", type=int, default=1000)
    ap.add_argument("--queue-delay-us", type=int, default=500)
    ap.add_argument("-o", "--output", default=None)
    a = ap.parse_args()
    texts = make_texts(2000, seed=0, min_words=4, max_words=60)
    rows = []
    for cycle in range(a.cycles):
        for v in a.variants:
            spec = VARIANTS[v]
            ns = argparse.Namespace(
                model=a.artifact,
                server_arg=list(spec.get("server_arg", [])),
                queue_delay_us=a.queue_delay_us,
                target=spec["target"],
                instances=spec.get("instances", 1),
                replicas=spec.get("replicas", 2),
            )
            old = {k: os.environ.get(k) for k in spec.get("env", {})}
            os.environ.update(spec.get("env", {}))
            try:
                srv = start_target(ns)
            finally:
                for k, val in old.items():
                    if val is None:
                        os.environ.pop(k, None)
                    else:
                        os.environ[k] = val
            try:
                model = srv.model or "zoi"
                if srv.model is None:
                    import urllib.request

                    with urllib.request.urlopen(srv.url + "/info") as r:
                        model = json.loads(r.read())["model_id"]
                asyncio.run(run_load(srv.url, texts, 4, 60, "kserve", model))
                time.sleep(1.0)
                pid = server_pid(srv)
                c0, t0 = tree_cpu_seconds(pid), time.perf_counter()
                res, _ = asyncio.run(
                    run_load(srv.url, texts, a.concurrency, a.requests, "kserve", model)
                )
                c1, wall = tree_cpu_seconds(pid), time.perf_counter() - t0
            finally:
                srv.stop()
            row = {
                "variant": v,
                "cycle": cycle,
                "concurrency": a.concurrency,
                "requests": a.requests,
                "ok": res.ok,
                "errors": res.errors,
                "req_per_s": res.req_per_s,
                "p50_ms": res.p50_ms,
                "p99_ms": res.p99_ms,
                "server_cpu_s": c1 - c0,
                "cpu_ms_per_req": (c1 - c0) / max(res.ok, 1) * 1e3,
                "wall_s": wall,
                "loadavg": os.getloadavg()[0],
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
            if a.output:
                with open(a.output, "a") as f:
                    f.write(json.dumps(row) + "\n")
    return 0 if all(r["errors"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
