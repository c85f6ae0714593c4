"""The shared setup of the in-process engine A/Bs (amx_engine_ab.py, yscratch_ab.py): the common
arguments (--shapes, --threads, --rounds, --json), the MiniLM-shaped INT8 model with random weights
sized for the shapes, the batches, warm-up, calls per round, one timed round of `run_repeat` and
the JSON record. Not a script."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "cpu"))
from helpers import batch, make_model, minilm_spec  # noqa: E402

from zoi import _cpu  # noqa: E402

MODEL = "minilm-shape int8 random weights, 6 layers"


def parser(shapes: str) -> argparse.ArgumentParser:
    """The arguments every engine A/B takes (`shapes`: the default of --shapes, "BxS,...")."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default=shapes)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", default="")
    return ap


def parse_shapes(s: str) -> list[tuple[int, int]]:
    """The shapes "32x128,8x128" -> [(32, 128), (8, 128)] (sequences x tokens each)."""
    return [tuple(int(v) for v in x.split("x")) for x in s.split(",")]


def minilm_int8(shapes: list[tuple[int, int]]):
    """(spec, CompiledModel): MiniLM's shape, INT8, random weights, max_tokens / max_batch the
    largest of the shapes'."""
    spec = minilm_spec()
    model = make_model(
        spec, "int8", max_tokens=max(b * s for b, s in shapes), max_batch=max(b for b, _ in shapes)
    )
    return spec, model


def shape_batch(spec, b: int, s: int):
    """(ids, positions, cu_seqlens) of b sequences of s tokens (seed 1: the same in every A/B)."""
    return batch([s] * b, spec.vocab_size, seed=1)


def calls_per_round(b: int, s: int) -> int:
    """run_repeat calls per timed round: ~1200 tokens, at least 3."""
    return max(3, int(round(400 / (b * s) * 3)))


def warm(bes: dict, ids, pos, cu, rows: int, cols: int) -> dict:
    """Two calls of each backend (pages, caches); returns {key: its output array [rows, cols]}."""
    outs = {}
    for k, be in bes.items():
        outs[k] = np.empty((rows, cols), np.float32)
        be.engine.run_repeat(ids, pos, cu, True, outs[k], 2)
    return outs


def timed(be, ids, pos, cu, out, n: int) -> dict:
    """n calls in C++ (run_repeat): ms per call of wall time, of the calling thread's CPU time (1
    thread: the whole forward runs on it) and of the process's CPU time (the pool's spins too)."""
    w0, t0, p0 = time.perf_counter(), time.thread_time(), time.process_time()
    be.engine.run_repeat(ids, pos, cu, True, out, n)
    w1, t1, p1 = time.perf_counter(), time.thread_time(), time.process_time()
    return {"wall": (w1 - w0) / n * 1e3, "thread": (t1 - t0) / n * 1e3, "proc": (p1 - p0) / n * 1e3}


def cpu_brand() -> str:
    return _cpu.cpu_info()["brand"]


def write_json(path: str, rows: list, **extra) -> None:
    """{"cpu", "model", **extra, "rows"} to path (nothing when path is empty)."""
    if not path:
        return
    with open(path, "w") as f:
        json.dump({"cpu": cpu_brand(), "model": MODEL, **extra, "rows": rows}, f, indent=1)
