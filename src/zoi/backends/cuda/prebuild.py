"""Triton's kernels compiled in several processes before a cold build.

A cold GPU build spends most of its time in Triton compiling the kernels of every token
bucket, one after another: the compile holds the GIL, so threads do not help (measured: 6
kernels, 1.8 s serial vs 2.0 s on two threads). Before the first build of a model's shapes on
this GPU and software, the buckets are therefore split over a few worker processes
(``python -m zoi.backends.cuda.prebuild_worker``), each of which builds a backend of its buckets and
exits; what they compile lands in Triton's on-disk cache, so the build that follows in this
process finds every kernel compiled. The workers only warm that cache: their failures are
logged and ignored, and this process builds (and checks) everything itself as before.

Done once per shape: a "kernels" entry in the path cache file (pathcache.py, the same key
without the bucket) marks the shapes as built, so warm builds start no process.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

log = logging.getLogger("zoi")

WORKER_TIMEOUT_S = 900  # a worker that hangs never holds the build up for longer
MAX_WORKERS = 8
# a worker costs seconds of start-up (Python, torch, triton, a CUDA context): with few buckets
# (a small max_tokens) the serial compile is short and workers would not pay for themselves
MIN_BUCKETS = 6


def worker_count(opts, buckets: list[int], per_worker_bytes: int, free_bytes: int) -> int:
    """Processes for a cold build: opts.parallel_build (None: one per bucket, at most
    MAX_WORKERS and half the CPUs, none under MIN_BUCKETS buckets), capped so that every worker's weights and arena fit in
    half of the GPU's free memory. 0 or 1: no workers."""
    want = opts.parallel_build
    if want is None and len(buckets) < MIN_BUCKETS:
        return 0
    if want is None:
        want = min(MAX_WORKERS, max(1, (os.cpu_count() or 2) // 2))
    n = min(int(want), len(buckets))
    if per_worker_bytes > 0:
        n = min(n, int(free_bytes // 2 // per_worker_bytes))
    return n if n >= 2 else 0


def split(buckets: list[int], n: int) -> list[list[int]]:
    """Buckets dealt round-robin, smallest first (each worker gets small and large ones)."""
    parts = [sorted(buckets)[i::n] for i in range(n)]
    return [p for p in parts if p]


def _write_model(model, folder: Path) -> None:
    from safetensors.numpy import save_file

    meta = {
        "spec": model.spec.to_dict(),
        "precision": model.precision,
        "max_tokens": int(model.plan.max_tokens),
        "max_batch": int(model.plan.max_batch),
        "quant": {k: v.to_dict() for k, v in model.quant.items()},
        "meta": model.meta,
    }
    (folder / "model.json").write_text(json.dumps(meta, default=str))
    save_file(
        {k: np.ascontiguousarray(v) for k, v in model.weights.items()},
        str(folder / "weights.safetensors"),
    )


def _read_model(folder: Path):
    from safetensors.numpy import load_file

    from zoi.frontend.spec import ModelSpec
    from zoi.graph.compiled import CompiledModel, LinearQuant

    meta = json.loads((folder / "model.json").read_text())
    model = CompiledModel.build(
        ModelSpec.from_dict(meta["spec"]),
        load_file(str(folder / "weights.safetensors")),
        meta["precision"],
        meta["max_tokens"],
        meta["max_batch"],
        {k: LinearQuant.from_dict(v) for k, v in meta["quant"].items()},
    )
    model.meta = meta["meta"]
    return model


def prebuild(model, opts, buckets: list[int], n: int, device_index: int) -> dict:
    """Run n workers over the buckets and wait for them (each bounded by WORKER_TIMEOUT_S).
    Returns what happened (for memory()["prebuild"]); never raises for a worker's failure."""
    parts = split(buckets, n)
    t0 = time.perf_counter()
    wopts = dataclasses.replace(opts, path_cache=None, parallel_build=0, device_index=None)
    log.info("zoi: compiling the GPU kernels of %d buckets in %d processes", len(buckets), n)
    with tempfile.TemporaryDirectory(prefix="zoi-prebuild-") as d:
        folder = Path(d)
        _write_model(model, folder)
        (folder / "options.json").write_text(json.dumps(dataclasses.asdict(wopts)))
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "zoi.backends.cuda.prebuild_worker",
                    str(folder),
                    ",".join(map(str, p)),
                    str(device_index),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )  # fmt: skip
            for p in parts
        ]
        failed = []
        for p, part in zip(procs, parts, strict=True):
            try:
                _, err = p.communicate(
                    timeout=max(1.0, WORKER_TIMEOUT_S - (time.perf_counter() - t0))
                )
            except subprocess.TimeoutExpired:
                p.kill()
                _, err = p.communicate()
                failed.append(part)
                log.warning("zoi: a kernel-compiling process (buckets %s) timed out", part)
                continue
            if p.returncode != 0:
                failed.append(part)
                tail = (err or b"").decode(errors="replace").strip().splitlines()[-3:]
                log.warning(
                    "zoi: a kernel-compiling process (buckets %s) failed (exit %s): %s; "
                    "this process compiles them itself", part, p.returncode, " | ".join(tail),
                )  # fmt: skip
    return {
        "processes": len(parts),
        "seconds": round(time.perf_counter() - t0, 2),
        "failed_buckets": [b for part in failed for b in part],
    }


def maybe_prebuild(be) -> dict | None:
    """Before the first build of these shapes on this GPU and software (no "kernels" entry in
    the path cache): compile the buckets' kernels in worker processes. Not in the interpreter,
    nor without a path cache (tests building many small backends), nor with parallel_build 0."""
    opts = be.opts
    if be.eager or not opts.path_cache or opts.parallel_build == 0:
        return None
    from zoi.backends.cuda import pathcache

    if pathcache.lookup(opts.path_cache, _key(be)) == "kernels":
        return None
    n = worker_count(opts, be.buckets, be.weights_bytes + be.arena_bytes, be.drv.mem_info()[0])
    return prebuild(be.model, opts, be.buckets, n, be.device_index) if n else None


def mark_built(be) -> None:
    """Every bucket built: these shapes' kernels are in Triton's cache from now on."""
    if be.eager or not be.opts.path_cache:
        return
    from zoi.backends.cuda import pathcache

    pathcache.store(be.opts.path_cache, _key(be), "kernels")


def _key(be) -> str:
    from zoi.backends.cuda import pathcache

    # the bucket -1: the whole model's kernels (bucket entries are >= 16)
    return pathcache.cache_key(be.device_name, be.capability, be.precision, be.spec, be.opts, -1)
