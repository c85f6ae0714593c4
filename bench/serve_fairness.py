"""Head-of-line blocking of `zoi serve`: the latency of a one-sentence client while a bulk client
sends big /embed requests.

The bulk client sends one request at a time, back to back: `--bulk-texts` texts of about
`--bulk-chars` characters each (the defaults, 512 x 3800 characters, make a body just under the
default 2 MB payload limit; each text is truncated to the model's positions, 256 tokens for
MiniLM). The small client sends one sentence every `--interval` seconds (open loop: it does not
wait for the previous answer, so a blocked server shows up as long latencies, not as fewer
samples) for `--seconds` seconds, starting once the first bulk request is queued. It prints the
small client's p50 / p90 / p99 / max and the bulk requests' times, as one JSON line.

    .venv/bin/python bench/serve_fairness.py                      # starts a server itself
    .venv/bin/python bench/serve_fairness.py --server-arg=--max-batch-tokens=1024
    .venv/bin/python bench/serve_fairness.py --url http://127.0.0.1:8080

`--health-probe` measures something else: how long `GET /health` (polled every 20 ms) takes
while the server answers one `/embed_all` of 40 texts of 256 tokens (3.9 million floats), i.e.
whether building a big answer holds the event loop.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time

import numpy as np

from zoi.bench.loadtest import Conn, ServerProcess, split_url

SMALL = b'{"inputs": "A man is eating food."}'
WORDS = (
    "the river runs past an old mill where children play in summer and the engine of a small "
    "boat hums while a violin plays in the church on the hill near the station library museum"
).split()


def bulk_body(n: int, chars: int, seed: int = 0) -> bytes:
    rng = random.Random(seed)
    texts = []
    for _ in range(n):
        words: list[str] = []
        size = 0
        while size < chars:
            w = rng.choice(WORDS)
            words.append(w)
            size += len(w) + 1
        texts.append(" ".join(words)[:chars])
    return json.dumps({"inputs": texts}).encode()


async def queued_tokens(host: str, port: int) -> float:
    conn = Conn(host, port)
    try:
        _, _, data = await conn.request("GET", "/metrics")
    finally:
        await conn.close()
    for line in data.decode().splitlines():
        if line.startswith("zoi_queue_tokens "):
            return float(line.split()[1])
    return 0.0


async def measure(url: str, args) -> dict:
    host, port = split_url(url)
    body = bulk_body(args.bulk_texts, args.bulk_chars)
    hdr = {"Content-Type": "application/json"}
    stop = asyncio.Event()
    bulk_s: list[float] = []
    small_ms: list[float] = []
    errors: list[str] = []

    async def bulk() -> None:
        conn = Conn(host, port)
        try:
            while not stop.is_set():
                t = time.perf_counter()
                status, _, data = await conn.request("POST", "/embed", body, hdr)
                if status != 200:
                    errors.append(f"bulk: HTTP {status}: {data[:200]!r}")
                    return
                bulk_s.append(time.perf_counter() - t)
        finally:
            await conn.close()

    async def one_small() -> None:
        conn = Conn(host, port)
        try:
            t = time.perf_counter()
            status, _, data = await conn.request("POST", "/embed", SMALL, hdr)
            if status != 200:
                errors.append(f"small: HTTP {status}: {data[:200]!r}")
            else:
                small_ms.append((time.perf_counter() - t) * 1e3)
        finally:
            await conn.close()

    bulk_task = asyncio.ensure_future(bulk())
    t0 = time.perf_counter()
    while await queued_tokens(host, port) == 0:  # the bulk request is queued
        if bulk_task.done() or time.perf_counter() - t0 > 60:
            raise RuntimeError(f"the bulk request never queued: {errors}")
        await asyncio.sleep(0.05)
    smalls = []
    t_end = time.perf_counter() + args.seconds
    while time.perf_counter() < t_end:
        smalls.append(asyncio.ensure_future(one_small()))
        await asyncio.sleep(args.interval)
    await asyncio.gather(*smalls)
    stop.set()
    await bulk_task
    lat = np.array(small_ms)
    pct = {f"p{q}_ms": round(float(np.percentile(lat, q)), 1) for q in (50, 90, 99)}
    return {
        "small_requests": len(lat),
        **pct,
        "max_ms": round(float(lat.max()), 1),
        "bulk_requests": len(bulk_s),
        "bulk_s": [round(x, 1) for x in bulk_s],
        "bulk_body_bytes": len(body),
        "errors": errors[:5],
    }


async def health_probe(url: str) -> dict:
    host, port = split_url(url)
    body = json.dumps({"inputs": [f"{i} " + "the river runs past an old mill " * 80
                                  for i in range(40)]}).encode()  # fmt: skip
    hdr = {"Content-Type": "application/json"}
    conn, probe_conn = Conn(host, port), Conn(host, port)
    stop = asyncio.Event()
    lat: list[float] = []

    async def probe() -> None:
        while not stop.is_set():
            t = time.perf_counter()
            await probe_conn.request("GET", "/health")
            lat.append((time.perf_counter() - t) * 1e3)
            await asyncio.sleep(0.02)

    try:
        await conn.request("POST", "/embed_all", b'{"inputs": ["warm up"]}', hdr)
        task = asyncio.ensure_future(probe())
        t = time.perf_counter()
        status, _, data = await conn.request("POST", "/embed_all", body, hdr)
        took = time.perf_counter() - t
        stop.set()
        await task
    finally:
        await conn.close()
        await probe_conn.close()
    return {
        "status": status,
        "answer_mb": round(len(data) / 1e6, 1),
        "request_s": round(took, 2),
        "health_p50_ms": round(float(np.percentile(lat, 50)), 1),
        "health_max_ms": round(max(lat), 1),
        "probes": len(lat),
        "errors": [] if status == 200 else [data[:200].decode(errors="replace")],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", help="a running server (default: start one)")
    ap.add_argument("--server-arg", action="append", default=[], help="passed to zoi serve")
    ap.add_argument("--bulk-texts", type=int, default=512)
    ap.add_argument("--bulk-chars", type=int, default=3800)
    ap.add_argument("--interval", type=float, default=0.5, help="seconds between small requests")
    ap.add_argument("--seconds", type=float, default=60.0, help="how long the small client sends")
    ap.add_argument(
        "--health-probe", action="store_true", help="/health latency during a big /embed_all"
    )
    args = ap.parse_args(argv)

    def run(url: str) -> dict:
        return asyncio.run(health_probe(url) if args.health_probe else measure(url, args))

    if args.url:
        res = run(args.url)
    else:
        with ServerProcess(env={"ZOI_LOG_LEVEL": "warning"}, args=args.server_arg) as srv:
            res = run(srv.url)
    res["server_args"] = args.server_arg
    print(json.dumps(res))
    return 0 if not res["errors"] else 1


if __name__ == "__main__":
    sys.exit(main())
