"""Load test of the generate routes: tokens/s and time to first token at N concurrent streams.

    python -m zoi.bench.decoder_load FOLDER --concurrency 8 32 --max-tokens 64 --out R.json

Starts `zoi serve FOLDER` (or uses --url), runs N clients, each streaming `--requests` completions
one after another (greedy, ignore_eos, `stream_options.include_usage` for exact token counts), and
reports per concurrency: generated tokens/s over the wall time, time to first token p50/p90, the
gap between chunks p50 seen by a client (text
chunks: a random-init model's byte tokens that cut a UTF-8 character are held until it completes),
the server's mean time to the first token (from /metrics), and the same prompts through the Generator in-process
(`generate()` of N prompts at once: the backend without HTTP) for comparison.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import time

import numpy as np

PROMPT_WORDS = "kazo mira te lu ne so pi da gro ven shi qua ber zo mi ra".split()


def prompts(n: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(PROMPT_WORDS, int(rng.integers(4, 24)))) for _ in range(n)]


async def _one(client, prompt: str, max_tokens: int) -> dict:
    import httpx  # noqa: F401 - the client's module

    body = {
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    t0 = time.perf_counter()
    first = None
    stamps = []
    usage = None
    async with client.stream("POST", "/v1/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {(await r.aread())[:300]!r}")
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            now = time.perf_counter()
            c = json.loads(line[6:])
            if c.get("usage"):
                usage = c["usage"]
            elif c["choices"] and c["choices"][0]["text"]:
                if first is None:
                    first = now - t0
                stamps.append(now)
    gaps = np.diff(stamps).tolist() if len(stamps) > 1 else []
    return {
        "ttft": first,
        "tokens": usage["completion_tokens"],
        "gaps": gaps,
        "total": time.perf_counter() - t0,
    }


async def run_level(url: str, concurrency: int, requests: int, max_tokens: int) -> dict:
    import httpx

    ps = prompts(concurrency * requests, seed=concurrency)
    limits = httpx.Limits(max_connections=concurrency + 4)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:
        await _one(client, ps[0], 4)  # warm
        m0 = await _ttft_metric(client)

        async def worker(i):
            return [await _one(client, ps[i * requests + k], max_tokens) for k in range(requests)]

        t0 = time.perf_counter()
        res = await asyncio.gather(*(worker(i) for i in range(concurrency)))
        wall = time.perf_counter() - t0
        m1 = await _ttft_metric(client)
    flat = [r for rs in res for r in rs]
    toks = sum(r["tokens"] for r in flat)
    ttft = [r["ttft"] for r in flat if r["ttft"] is not None]
    gaps = [g for r in flat for g in r["gaps"]]
    return {
        "concurrency": concurrency,
        "requests": len(flat),
        "max_tokens": max_tokens,
        "tokens": toks,
        "wall_s": round(wall, 3),
        "tokens_per_s": round(toks / wall, 1),
        "ttft_p50_ms": round(float(np.percentile(ttft, 50)) * 1e3, 1),
        "ttft_p90_ms": round(float(np.percentile(ttft, 90)) * 1e3, 1),
        "gap_p50_ms": round(float(np.percentile(gaps, 50)) * 1e3, 2) if gaps else None,
        # the server's own time to the first token (not text): mean over this level's requests
        "server_ttft_mean_ms": round((m1[0] - m0[0]) / max(1, m1[1] - m0[1]) * 1e3, 1),
    }


async def _ttft_metric(client) -> tuple[float, float]:
    """(sum, count) of zoi_decoder_time_to_first_token_seconds from /metrics."""
    text = (await client.get("/metrics")).text
    out = [0.0, 0.0]
    for line in text.splitlines():
        for i, k in enumerate(("_sum ", "_count ")):
            if line.startswith("zoi_decoder_time_to_first_token_seconds" + k):
                out[i] = float(line.split()[1])
    return out[0], out[1]


def in_process(folder: str, concurrency: int, max_tokens: int, opts: dict) -> dict:
    """The same work through Generator.generate (no HTTP, no scheduler thread)."""
    import zoi

    gen = zoi.compile(folder, **opts)
    ps = prompts(concurrency, seed=concurrency)
    gen.generate(ps[:1], max_new_tokens=4)
    t0 = time.perf_counter()
    outs = gen.generate(ps, max_new_tokens=max_tokens, ignore_eos=True)
    wall = time.perf_counter() - t0
    toks = sum(len(o.token_ids) for o in outs)
    return {
        "concurrency": concurrency,
        "tokens": toks,
        "wall_s": round(wall, 3),
        "tokens_per_s": round(toks / wall, 1),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m zoi.bench.decoder_load")
    ap.add_argument("folder", nargs="?", help="decoder folder to serve (ignored with --url)")
    ap.add_argument("--url", default=None)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[8, 32])
    ap.add_argument("--requests", type=int, default=2, help="streams per client, one at a time")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--max-running", type=int, default=32, help="--max-running-requests")
    ap.add_argument("--max-seq-len", type=int, default=256)
    ap.add_argument("--kv-blocks", type=int, default=None)
    ap.add_argument("--precision", default="fp32")
    ap.add_argument("--no-in-process", action="store_true")
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    a = ap.parse_args(argv)
    kv_blocks = a.kv_blocks or a.max_running * -(-a.max_seq_len // 16)
    direct = []
    if a.folder and not a.no_in_process:
        opts = {
            "max_batch": a.max_running,
            "max_seq_len": a.max_seq_len,
            "kv_blocks": kv_blocks,
            "precision": a.precision,
        }
        for c in a.concurrency:
            d = in_process(a.folder, c, a.max_tokens, opts)
            print(json.dumps({"in_process": d}), flush=True)
            direct.append(d)
    srv = None
    url = a.url
    if url is None:
        from zoi.bench.loadtest import ServerProcess

        srv = ServerProcess(
            a.folder,
            env={
                "ZOI_LOG_LEVEL": "warning",
                "ZOI_MAX_RUNNING_REQUESTS": str(a.max_running),
                "ZOI_MAX_SEQ_LEN": str(a.max_seq_len),
                "ZOI_KV_BLOCKS": str(kv_blocks),
                "ZOI_PRECISION": a.precision,
            },
        )
        url = srv.url
    rows = []
    try:
        for c in a.concurrency:
            row = asyncio.run(run_level(url, c, a.requests, a.max_tokens))
            print(json.dumps(row), flush=True)
            rows.append(row)
    finally:
        if srv is not None:
            srv.stop()
    if a.out:
        try:
            load = os.getloadavg()
        except OSError:  # pragma: no cover
            load = None
        doc = {
            "what": "zoi serve /v1/completions streaming load test",
            "folder": a.folder,
            "precision": a.precision,
            "max_running": a.max_running,
            "max_seq_len": a.max_seq_len,
            "kv_blocks": kv_blocks,
            "server": rows,
            "in_process_generate": direct,
            "machine": {
                "cpus": os.cpu_count(),
                "platform": platform.platform(),
                "python": sys.version.split()[0],
                "loadavg_at_end": load,
            },
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        with open(a.out, "w") as f:
            json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
