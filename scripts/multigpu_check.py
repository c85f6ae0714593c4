"""One engine per GPU, end to end on the GPUs there are (`scripts/gpu_check.sh multigpu`).

On any CUDA machine (one GPU is enough):
  1. zoi.compile(device="cuda:N") for every visible GPU: the backend is built on that GPU
     (memory()["device_index"]), and its embeddings match the CPU engine's (fp16: cosine);
  2. `zoi serve --device cuda --gpus 0` (and `--gpus all` when there are two or more GPUs) as a
     subprocess: concurrent load over HTTP, every answer equal to the CPU engine's, /info's
     per-engine figures (every engine used when there are several), /metrics per device,
     SIGTERM -> exit 0 with nothing cut off;
  3. the --gpus errors: an id past the last GPU, duplicates.
Writes a JSON report (--out) and exits 1 on any failed check.
Usage: python scripts/multigpu_check.py [--model DIR] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time

import numpy as np


def cosine_rows(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)


def texts(n: int) -> list[str]:
    from zoi.bench.loadtest import make_texts

    return make_texts(n, seed=5, min_words=3, max_words=80)


class Checks:
    def __init__(self):
        self.rows: list[dict] = []

    def check(self, name: str, ok: bool, detail="") -> bool:
        self.rows.append({"check": name, "ok": bool(ok), "detail": detail})
        print(
            f"  {'ok  ' if ok else 'FAIL'} {name}" + (f": {detail}" if detail else ""), flush=True
        )
        return ok

    @property
    def failed(self) -> list[dict]:
        return [r for r in self.rows if not r["ok"]]


def serve_check(
    ck: Checks, model, gpus: str, ref_engine, n_gpus: int, tmp: str, cpu: bool = False
) -> dict:
    import httpx

    from zoi.bench.loadtest import ServerProcess

    tx = texts(192)
    ref = ref_engine.encode(tx)
    t0 = time.perf_counter()
    where = ["--device", "cuda", "--gpus", gpus, "--precision", "fp16"]
    if cpu:  # --dry-run-cpu: the same checks on CPU replicas (the script's own test)
        where = ["--device", "cpu", "--replicas", str(n_gpus)]
    srv = ServerProcess(
        model,
        args=[*where, "--max-queue-delay-us", "500", "--log-level", "warning"],
        log_path=os.path.join(tmp, f"serve_gpus_{gpus.replace(',', '_')}.log"),
    )  # fmt: skip
    start_s = time.perf_counter() - t0
    try:

        async def load():
            async with httpx.AsyncClient(base_url=srv.url, timeout=300) as c:
                sem = asyncio.Semaphore(32)

                async def one(i):
                    async with sem:
                        r = await c.post("/embed", json={"inputs": tx[i : i + 3]})
                        return i, r

                t = time.perf_counter()
                out = await asyncio.gather(*[one(i) for i in range(0, len(tx), 3)])
                return out, time.perf_counter() - t

        res, wall = asyncio.run(load())
        info = httpx.get(srv.url + "/info").json()
        metrics = httpx.get(srv.url + "/metrics").text
    finally:
        rc = srv.stop()
    tag = f"--gpus {gpus}"
    ok = all(r.status_code == 200 for _, r in res)
    ck.check(
        f"{tag}: every request 200",
        ok,
        "" if ok else str([r.text[:200] for _, r in res if r.status_code != 200][:3]),
    )
    if ok:
        got = np.array([v for _, r in sorted(res, key=lambda x: x[0]) for v in r.json()])
        cmin = float(cosine_rows(got, ref).min())
        ck.check(
            f"{tag}: answers equal the CPU engine's, in order",
            cmin > 0.999,
            f"min cosine {cmin:.6f}",
        )
    engines = info.get("engines", [])
    want = n_gpus if gpus == "all" or cpu else len(gpus.split(","))
    ck.check(f"{tag}: /info lists {want} engine(s)", len(engines) == want, json.dumps(engines))
    ck.check(
        f"{tag}: every engine ran batches",
        bool(engines) and all(e["batches"] > 0 for e in engines),
        ", ".join(f"{e['device']} {e['batches']} batches {e['sequences']} seqs" for e in engines),
    )
    ck.check(f"{tag}: no engine failed", all(e["failures"] == 0 for e in engines))
    ck.check(
        f"{tag}: /metrics per device", all(f'device="{e["device"]}"' in metrics for e in engines)
    )
    ck.check(
        f"{tag}: SIGTERM -> exit 0, nothing cut off",
        rc == 0 and "none cut off" in srv.log(),
        f"rc {rc}",
    )
    return {"gpus": gpus, "start_s": round(start_s, 1), "wall_s": round(wall, 3),
            "texts_per_s": round(len(tx) / wall, 1), "info": info}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.environ.get("ZOI_MINILM_DIR") or None)
    ap.add_argument("--out", default=None)
    ap.add_argument(
        "--dry-run-cpu",
        action="store_true",
        help="no GPU: run the serving checks on 2 CPU replicas (tests this script)",
    )
    a = ap.parse_args()
    import tempfile

    import zoi
    from zoi.backends.devices import visible_gpu_count

    ck = Checks()
    n = 2 if a.dry_run_cpu else visible_gpu_count()
    print(f"multigpu check: {n} GPU(s) visible, model {a.model or 'bundled MiniLM'}", flush=True)
    if not a.dry_run_cpu and not ck.check("a GPU is visible", n >= 1):
        return 1
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as e:  # the CUDA image has neither: carry them (gpu_check.sh installs .whl/)
        ck.check("zoi serve's packages", False, f"{e}: carry them, e.g. `pip download --no-deps "
                 "starlette==1.10.0 uvicorn==0.54.0 -d .whl` and name .whl in carry")  # fmt: skip
        return 1
    cpu = zoi.compile(a.model, device="cpu")
    tx = texts(40)
    ref = cpu.encode(tx)
    report: dict = {"gpus": n, "engines": [], "serve": []}
    for i in range(0 if a.dry_run_cpu else n):
        e = zoi.compile(a.model, device=f"cuda:{i}", precision="fp16")
        mem = e.memory()
        ck.check(
            f"zoi.compile(device='cuda:{i}') built on GPU {i}",
            mem.get("device_index") == i,
            repr(e),
        )
        cmin = float(cosine_rows(e.encode(tx), ref).min())
        ck.check(
            f"cuda:{i} embeddings equal the CPU engine's", cmin > 0.999, f"min cosine {cmin:.6f}"
        )
        report["engines"].append(
            {
                "device": f"cuda:{i}",
                "memory": {k: v for k, v in mem.items() if "bytes" in k},
                "min_cosine": cmin,
            }
        )
        del e
    with tempfile.TemporaryDirectory() as tmp:
        if a.dry_run_cpu:
            report["serve"].append(serve_check(ck, a.model, "cpu", cpu, n, tmp, cpu=True))
        else:
            report["serve"].append(serve_check(ck, a.model, "0", cpu, n, tmp))
        if n >= 2 and not a.dry_run_cpu:
            report["serve"].append(serve_check(ck, a.model, "all", cpu, n, tmp))
    bad_gpus = [("0,0", "listed twice")]
    if not a.dry_run_cpu:  # without CUDA an id is refused for that, not for its range
        bad_gpus.insert(0, (str(n), "does not exist here"))
    for bad, why in bad_gpus:
        r = subprocess.run([sys.executable, "-m", "zoi.serve", "--device", "cuda", "--gpus", bad, "--port", "0"],
                           capture_output=True, text=True, timeout=120)  # fmt: skip
        ck.check(
            f"--gpus {bad} refused: {why}",
            r.returncode == 2 and why in r.stderr,
            r.stderr.strip()[-300:],
        )
    report["checks"] = ck.rows
    if a.out:
        with open(a.out, "w") as f:
            json.dump(report, f, indent=1, default=str)
    print(f"multigpu check: {len(ck.rows) - len(ck.failed)}/{len(ck.rows)} ok", flush=True)
    return 1 if ck.failed else 0


if __name__ == "__main__":
    sys.exit(main())
