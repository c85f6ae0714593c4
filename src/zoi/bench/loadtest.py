"""`zoi bench serve`: throughput and latency percentiles of a zoi server at several concurrencies.

A minimal asyncio HTTP/1.1 keep-alive client (no dependency, little CPU: on a small machine
the load generator competes with the server) sends requests from N concurrent clients, each
one request at a time, a bounded number of requests in all. Texts are synthetic, of mixed
lengths, from a fixed seed, so runs are comparable. Without --url the command starts
`zoi serve` itself on 127.0.0.1 with a free port and stops it (SIGTERM) at the end.

Wire it as `zoi bench serve` with `zoi.bench.loadtest.register_bench(bench_subparsers)`.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import random
import re
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np

from zoi.procs import ChildServer

_WORDS = (
    "the of and to in is was for on that with as by at from his her they this are be it an which "
    "or had not but have were all their one there been has more also new other some would into time "
    "year people world city first during after two water music house school river system family "
    "government history language energy market network model engine server token batch latency "
    "throughput memory kernel vector embedding search query document sentence paragraph science "
    "mountain forest ocean island village garden winter summer morning evening coffee bread horse "
    "violin guitar football election museum library hospital airport station bridge castle church"
).split()


def make_texts(n: int, seed: int = 0, min_words: int = 2, max_words: int = 120) -> list[str]:
    """n synthetic sentences whose lengths spread log-uniformly over [min_words, max_words]."""
    rng = random.Random(seed)
    lo, hi = np.log(min_words), np.log(max_words)
    out = []
    for _ in range(n):
        k = int(round(np.exp(rng.uniform(lo, hi))))
        words = [rng.choice(_WORDS) for _ in range(max(1, k))]
        out.append(" ".join(words).capitalize() + ".")
    return out


# ---- a tiny HTTP/1.1 client ----------------------------------------------------------------
class HttpError(Exception):
    pass


class Conn:
    """One keep-alive connection; requests on it go one at a time."""

    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def _open(self) -> None:
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port)

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            try:
                await self.writer.wait_closed()
            except (ConnectionError, OSError):
                pass
            self.writer = self.reader = None

    async def request(
        self, method: str, path: str, body: bytes = b"", headers: dict | None = None
    ) -> tuple[int, dict, bytes]:
        for attempt in (0, 1):  # a keep-alive connection the server closed: reconnect once
            if self.writer is None:
                await self._open()
            try:
                return await self._request(method, path, body, headers)
            except (ConnectionError, asyncio.IncompleteReadError) as e:
                await self.close()
                if attempt == 1:
                    raise HttpError(f"{method} {path}: connection failed ({e})") from e
        raise AssertionError("unreachable")

    async def _request(self, method, path, body, headers):
        h = [
            f"{method} {path} HTTP/1.1",
            f"Host: {self.host}:{self.port}",
            f"Content-Length: {len(body)}",
        ]
        h += [f"{k}: {v}" for k, v in (headers or {}).items()]
        self.writer.write(("\r\n".join(h) + "\r\n\r\n").encode() + body)
        await self.writer.drain()
        head = await self.reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        rh = {}
        for ln in lines[1:]:
            if ":" in ln:
                k, v = ln.split(":", 1)
                rh[k.strip().lower()] = v.strip()
        if "content-length" in rh:
            data = await self.reader.readexactly(int(rh["content-length"]))
        elif rh.get("transfer-encoding", "").lower() == "chunked":
            parts = []
            while True:
                size = int((await self.reader.readline()).strip().split(b";")[0], 16)
                if size == 0:
                    await self.reader.readline()
                    break
                parts.append(await self.reader.readexactly(size))
                await self.reader.readline()
            data = b"".join(parts)
        else:
            data = await self.reader.read()
            await self.close()
        if rh.get("connection", "").lower() == "close":
            await self.close()
        return status, rh, data


def split_url(url: str) -> tuple[str, int]:
    u = urlsplit(url if "://" in url else f"http://{url}")
    return u.hostname or "127.0.0.1", u.port or 80


# ---- request builders per route ------------------------------------------------------------
def build_request(route: str, texts: list[str], model: str) -> tuple[str, bytes, dict]:
    if route == "embed":
        return (
            "/embed",
            json.dumps({"inputs": texts}).encode(),
            {"Content-Type": "application/json"},
        )
    if route == "openai":
        body = {"input": texts, "model": model, "encoding_format": "base64"}
        return "/v1/embeddings", json.dumps(body).encode(), {"Content-Type": "application/json"}
    if route == "kserve":
        raw = b"".join(len(t.encode()).to_bytes(4, "little") + t.encode() for t in texts)
        head = json.dumps(
            {
                "inputs": [
                    {
                        "name": "TEXT",
                        "datatype": "BYTES",
                        "shape": [len(texts), 1],  # Triton's batch form; zoi takes it too
                        "parameters": {"binary_data_size": len(raw)},
                    }
                ],
                "outputs": [{"name": "EMBEDDING", "parameters": {"binary_data": True}}],
            }
        ).encode()
        return (
            f"/v2/models/{model}/infer",
            head + raw,
            {
                "Content-Type": "application/octet-stream",
                "Inference-Header-Content-Length": str(len(head)),
            },
        )
    raise ValueError(f"unknown route {route!r} (embed, openai, kserve)")


def parse_embeddings(route: str, status: int, headers: dict, data: bytes) -> np.ndarray:
    if status != 200:
        raise HttpError(f"HTTP {status}: {data[:300]!r}")
    if route == "embed":
        return np.asarray(json.loads(data), dtype=np.float32)
    if route == "openai":
        rows = json.loads(data)["data"]
        return np.stack([np.frombuffer(base64.b64decode(r["embedding"]), "<f4") for r in rows])
    hl = int(headers["inference-header-content-length"])
    meta = json.loads(data[:hl])
    shape = meta["outputs"][0]["shape"]
    return np.frombuffer(data[hl:], "<f4").reshape(shape)


# ---- load ------------------------------------------------------------------------------------
@dataclass
class LoadResult:
    concurrency: int
    requests: int
    texts_per_request: int
    ok: int
    errors: int
    wall_s: float
    req_per_s: float
    texts_per_s: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float
    mean_batch: float | None = None  # sequences per engine call during the run (from /metrics)
    engine_calls: int | None = None
    error_samples: list[str] = field(default_factory=list)
    rounds: int = 1
    latencies_ms: np.ndarray | None = field(default=None, repr=False)  # not written out

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("latencies_ms")
        return d


def merge(results: list[LoadResult]) -> LoadResult:
    """One result from several rounds at the same concurrency (latencies pooled)."""
    r0 = results[0]
    lat = np.concatenate([r.latencies_ms for r in results])
    wall = sum(r.wall_s for r in results)
    ok = sum(r.ok for r in results)
    pct = (lambda q: float(np.percentile(lat, q))) if len(lat) else (lambda q: float("nan"))
    out = LoadResult(
        r0.concurrency,
        sum(r.requests for r in results),
        r0.texts_per_request,
        ok,
        sum(r.errors for r in results),
        wall,
        ok / wall,
        ok * r0.texts_per_request / wall,
        pct(50),
        pct(90),
        pct(99),
        float(lat.max()) if len(lat) else float("nan"),
        error_samples=[e for r in results for e in r.error_samples][:5],
        rounds=len(results),
        latencies_ms=lat,
    )
    calls = [r for r in results if r.engine_calls]
    if calls:
        out.engine_calls = sum(r.engine_calls for r in calls)
        out.mean_batch = sum(r.mean_batch * r.engine_calls for r in calls) / out.engine_calls
    return out


async def run_load(
    url: str,
    texts: list[str],
    concurrency: int,
    requests: int,
    route: str | tuple = "embed",
    model: str = "model",
    texts_per_request: int = 1,
    collect: bool = False,
    timeout_s: float = 600.0,
):
    """Send `requests` requests from `concurrency` clients; returns (LoadResult, answers or None).

    Request i carries texts[(i*k + j) % len(texts)] for j < k (k = texts_per_request) and goes
    to route[i % len(route)] when `route` is a tuple; with collect=True answers[i] is its
    embeddings (float32 [k, H]) or None on failure.
    """
    routes = (route,) if isinstance(route, str) else tuple(route)
    host, port = split_url(url)
    lat = np.zeros(requests)
    answers: list = [None] * requests if collect else None
    errors: list[str] = []
    counter = iter(range(requests))
    before = await scrape_batches(host, port)

    async def client() -> None:
        conn = Conn(host, port)
        try:
            for i in counter:
                chunk = [
                    texts[(i * texts_per_request + j) % len(texts)]
                    for j in range(texts_per_request)
                ]
                rt = routes[i % len(routes)]
                path, body, headers = build_request(rt, chunk, model)
                t = time.perf_counter()
                try:
                    status, rh, data = await conn.request("POST", path, body, headers)
                    lat[i] = time.perf_counter() - t
                    if status != 200:
                        raise HttpError(f"HTTP {status}: {data[:200]!r}")
                    if collect:
                        answers[i] = parse_embeddings(rt, status, rh, data)
                except (HttpError, OSError, ValueError) as e:
                    lat[i] = np.nan
                    errors.append(str(e))
        finally:
            await conn.close()

    t0 = time.perf_counter()
    await asyncio.wait_for(asyncio.gather(*(client() for _ in range(concurrency))), timeout_s)
    wall = time.perf_counter() - t0
    after = await scrape_batches(host, port)
    good = lat[~np.isnan(lat)] * 1e3
    pct = (lambda q: float(np.percentile(good, q))) if len(good) else (lambda q: float("nan"))
    res = LoadResult(
        concurrency,
        requests,
        texts_per_request,
        len(good),
        len(errors),
        wall,
        len(good) / wall,
        len(good) * texts_per_request / wall,
        pct(50),
        pct(90),
        pct(99),
        float(good.max()) if len(good) else float("nan"),
        error_samples=errors[:5],
        latencies_ms=good,
    )
    if before is not None and after is not None and after[0] > before[0]:
        res.engine_calls = int(after[0] - before[0])
        res.mean_batch = (after[1] - before[1]) / (after[0] - before[0])
    return res, answers


def parse_metric(text: str, name: str) -> float | None:
    m = re.search(rf"^{re.escape(name)} ([0-9.eE+-]+)$", text, re.M)
    return float(m.group(1)) if m else None


async def scrape_batches(host: str, port: int) -> tuple[float, float] | None:
    """(engine calls, sequences) so far, from /metrics."""
    conn = Conn(host, port)
    try:
        status, _, data = await conn.request("GET", "/metrics")
    except (HttpError, OSError):
        return None
    finally:
        await conn.close()
    if status != 200:
        return None
    text = data.decode()
    c, s = parse_metric(text, "zoi_batch_size_count"), parse_metric(text, "zoi_batch_size_sum")
    return (c, s) if c is not None and s is not None else None


# ---- a server subprocess ----------------------------------------------------------------------
class ServerProcess(ChildServer):
    """`zoi serve` as a child process on 127.0.0.1 with a free port."""

    READY = re.compile(r"zoi serve: ready on (http://\S+)")

    def __init__(
        self,
        model: str | None = None,
        env: dict | None = None,
        args: list[str] | None = None,
        startup_timeout: float = 300.0,
        log_path: str | os.PathLike | None = None,
    ):
        cmd = [
            sys.executable,
            "-m",
            "zoi.serve",
            *([model] if model else []),
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            *(args or []),
        ]
        self.log_path = Path(log_path) if log_path else None
        super().__init__(cmd, env={**os.environ, **(env or {})}, log_path=log_path)
        m = self.wait_for_line(self.READY, startup_timeout)
        if m is None:
            self.kill()
            raise RuntimeError("zoi serve did not become ready:\n" + "".join(self.lines[-40:]))
        self.url = m.group(1)


# ---- the command -------------------------------------------------------------------------------
def register_bench(subparsers) -> argparse.ArgumentParser:
    """Add `serve` to a `zoi bench` sub-command group."""
    p = subparsers.add_parser(
        "serve", help="throughput and p50/p99 latency of `zoi serve` at several concurrencies"
    )
    p.add_argument(
        "model",
        nargs="?",
        default=None,
        help="model folder or artifact to serve (default: bundled MiniLM); ignored with --url",
    )
    p.add_argument(
        "--url", default=None, help="an already running server (default: start one on 127.0.0.1)"
    )
    p.add_argument("--concurrency", "-c", type=int, nargs="+", default=[1, 4, 16, 32, 64])
    p.add_argument(
        "--requests",
        "-n",
        type=int,
        default=None,
        help="requests per concurrency level (default: max(200, 30 x concurrency))",
    )
    p.add_argument("--texts-per-request", "-k", type=int, default=1)
    p.add_argument("--route", choices=["embed", "openai", "kserve"], default="embed")
    p.add_argument("--min-words", type=int, default=4)
    p.add_argument("--max-words", type=int, default=60)
    p.add_argument("--warmup", type=int, default=20, help="requests sent before measuring")
    p.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="rounds; each runs every concurrency once (interleaved, so drifting machine load "
        "spreads over all levels); results pool the rounds",
    )
    p.add_argument(
        "--server-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="extra argument for the started server (repeatable), e.g. --server-arg=--precision=int8",
    )
    p.add_argument("--output", "-o", default=None, help="append results as JSON lines to this file")
    p.add_argument("--json", action="store_true", help="print results as JSON")
    p.set_defaults(func=cmd_bench_serve)
    return p


def cmd_bench_serve(args) -> int:
    texts = make_texts(2000, seed=0, min_words=args.min_words, max_words=args.max_words)
    server = None
    url = args.url
    if url is None:
        print("starting zoi serve ...", file=sys.stderr, flush=True)
        server = ServerProcess(args.model, args=list(args.server_arg))
        url = server.url
    try:
        # a server without /info (Triton, started by zoi.integrations) names its model itself
        model = getattr(args, "served_model", None) or asyncio.run(_model_name(url))
        asyncio.run(run_load(url, texts, 4, args.warmup, args.route, model, args.texts_per_request))
        rounds = max(1, args.rounds)
        per: dict[int, list[LoadResult]] = {c: [] for c in args.concurrency}
        for k in range(rounds):
            for c in args.concurrency:
                n = max(1, (args.requests or max(200, 30 * c)) // rounds)
                r, _ = asyncio.run(
                    run_load(url, texts, c, n, args.route, model, args.texts_per_request)
                )
                per[c].append(r)
                if not args.json:
                    print(
                        f"  round {k + 1}/{rounds} c={c:<4} {r.req_per_s:8.1f} req/s  p50 {r.p50_ms:7.2f} ms  "
                        f"p99 {r.p99_ms:7.2f} ms  mean batch {r.mean_batch or 0:5.1f}  errors {r.errors}",
                        file=sys.stderr,
                        flush=True,
                    )
        results = [merge(per[c]) for c in args.concurrency]
    finally:
        if server is not None:
            server.stop()
    meta = {
        "url": url,
        "route": args.route,
        "target": getattr(args, "target", None) or "zoi serve",
        "model": model,
        "cores": os.cpu_count(),
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "server_args": args.server_arg,
    }
    rows = [{**meta, **r.to_dict()} for r in results]
    if args.output:
        with open(args.output, "a", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        _print_table(results, meta)
    return 0 if all(r.errors == 0 for r in results) else 1


async def _model_name(url: str) -> str:
    host, port = split_url(url)
    conn = Conn(host, port)
    try:
        status, _, data = await conn.request("GET", "/info")
    finally:
        await conn.close()
    if status != 200:
        raise HttpError(f"GET /info: HTTP {status}")
    return json.loads(data)["model_id"]


def _print_table(results: list[LoadResult], meta: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(
        title=f"{meta['target']}, route {meta['route']}, {meta['model']} ({meta['cores']} cores)"
    )
    for c in ("conc", "reqs", "req/s", "texts/s", "p50 ms", "p99 ms", "batch", "speed-up", "err"):
        t.add_column(c, justify="right")
    base = results[0].req_per_s if results else 1.0
    for r in results:
        t.add_row(
            str(r.concurrency),
            str(r.requests),
            f"{r.req_per_s:.1f}",
            f"{r.texts_per_s:.1f}",
            f"{r.p50_ms:.2f}",
            f"{r.p99_ms:.2f}",
            f"{r.mean_batch:.1f}" if r.mean_batch else "-",
            f"{r.req_per_s / base:.2f}x",
            str(r.errors),
        )
    Console().print(t)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="zoi-bench-serve")
    sub = ap.add_subparsers(dest="cmd", required=True)
    register_bench(sub)
    args = ap.parse_args(["serve", *(sys.argv[1:] if argv is None else argv)])
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
