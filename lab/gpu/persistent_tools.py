"""GPU tools of the persistent one-launch forward (lab code, not product; random
MiniLM-shaped fp16 model):

* ``python lab/gpu/persistent_tools.py 16 128``: per-op graph (a ``persistent_max=0``
  backend) vs the persistent forward, µs per forward and max abs difference;
* ``... --sweep 128``: a few configs around the default (difference vs the default's output);
* ``... --stages 128``: each stage timed alone (a graph of 10 launches of that stage, minus
  an empty launch), the one-launch total and the implied cost per barrier.
"""

from __future__ import annotations

import gc
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/: the PTX check

from tests.cuda_backend.ptx_helpers import compile_ahead  # noqa: E402,F401  (a tool here too)

from zoi.backends.cuda.persistent import (  # noqa: E402
    PersistentPlan,
    build_persistent_steps,
    default_cfg,
    stage_items,
)


def _stage_one(backend, tb: int, seed: int = 0):
    """Stage one sequence of tb random tokens into d_in (device), as run() would."""
    n = backend._stage_random(tb, seed, normalize=True)
    backend.d_in[:n].copy_(backend.torch.from_numpy(backend.h_in[:n].copy()))
    if not backend.eager:  # the backend's stream does not sync with the legacy default one
        backend.torch.cuda.synchronize()


def time_steps(backend, steps, tb: int, iters: int = 200) -> float:
    """Device µs per forward of a list of steps, captured in one torch CUDA graph and replayed
    back to back (CUDA events). The same measure for the persistent and the per-op steps."""
    torch = backend.torch
    _stage_one(backend, tb)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            for st in steps:
                st()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    gc.collect()
    was = gc.isenabled()
    gc.disable()
    try:
        with torch.cuda.graph(g):
            for st in steps:
                st()
    finally:
        if was:
            gc.enable()
    for _ in range(10):
        g.replay()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(iters):
        g.replay()
    e1.record()
    torch.cuda.synchronize()
    return e0.elapsed_time(e1) * 1000.0 / iters


def time_persistent(backend, tb: int, iters: int = 200, **kw) -> float:
    """Device µs per forward of the persistent kernel at bucket tb (captured graph)."""
    return time_steps(backend, build_persistent_steps(backend, tb, **kw), tb, iters)


def _minilm_backend(tb: int, model_kw: dict | None = None, persistent_max: int = 0):
    """A random MiniLM-shaped fp16 model on the GPU; the backend itself keeps the per-op
    kernels (persistent_max 0), so its _steps_for(tb) IS the per-op path."""
    from zoi.backends.cuda.backend import CudaBackend
    from zoi.graph.synthetic import random_model

    kw = dict(hidden=384, heads=12, layers=6, inter=1536, max_tokens=512, max_batch=64)
    kw.update(model_kw or {})
    be = CudaBackend(random_model("fp16", **kw), buckets=[tb], persistent_max=persistent_max)
    return be, kw


def _once(be, tb, steps):
    torch = be.torch
    _stage_one(be, tb)
    be.d_out.fill_(float("nan"))
    torch.cuda.synchronize()
    with torch.cuda.stream(be.tstream):
        for st in steps:
            st()
    torch.cuda.synchronize()
    return be.d_out[:1].clone()


def compare(
    model_kw: dict | None = None,
    tb: int = 128,
    iters: int = 500,
    cfgs: list | None = None,
    per_op: bool = True,
    budget_s: float | None = None,
) -> dict:
    """GPU: µs/forward of the persistent kernel (each cfg) vs the per-op graph on a
    minilm-shaped random fp16 model, plus the max abs difference of the outputs (one
    sequence of tb tokens) against the per-op path (per_op=False: against the first cfg)."""
    import time

    t0 = time.monotonic()
    be, kw = _minilm_backend(tb, model_kw)
    out = {"tb": tb, "layers": kw["layers"], "sm": int(be.sm)}
    want = None
    if per_op:
        steps = be._steps_for(tb)  # persistent_max=0: the 44-node per-op launch list
        want = _once(be, tb, steps)
        out["per_op_us"] = round(time_steps(be, steps, tb, iters), 2)
        out["per_op_launches"] = len(steps)
    best = None
    for cfg in cfgs or [None]:
        key = json.dumps(cfg) if cfg else "default"
        if budget_s is not None and time.monotonic() - t0 > budget_s:  # each cfg compiles ~5 s
            out.setdefault("skipped_for_time", []).append(key)
            continue
        try:
            plan = PersistentPlan(be, tb, cfg)
            pers = plan.steps()
            got = _once(be, tb, pers)
        except Exception as e:  # noqa: BLE001 - one bad config must not end the sweep
            out[key] = {"error": f"{type(e).__name__}: {e}"[:300]}
            continue
        if plan.barrier_timed_out():
            out[key] = {"error": "grid barrier timed out"}
            continue
        if want is None:
            want = got
        us = round(time_steps(be, pers, tb, iters), 2)
        out[key] = {
            "us": us,
            "max_abs_diff": float((got - want).abs().max()),
            "grid": plan.grid,
            "cfg": {k: plan.meta[k] for k in CFG_KEYS},
        }
        if best is None or us < out[best]["us"]:
            best = key
    out["best"] = best
    out["wall_s"] = round(time.monotonic() - t0, 1)
    return out


CFG_KEYS = (
    "BM", "BN_WIDE", "BN_NARROW", "BK", "BK_F2", "KSPLIT_O", "KSPLIT_F2", "ATT_BN", "POOL_BR", "BM_LN", "KST_H", "KST_F2", "KST_POOL",
    "num_warps", "num_stages",
)  # fmt: skip


def stage_times(tb: int = 128, iters: int = 100, reps: int = 10, cfg: dict | None = None) -> dict:
    """GPU: the stage-time breakdown of the default plan at bucket tb. Each stage alone
    (launch(s, s + 1), no barrier) ``reps`` times in one captured graph, replayed; minus the
    same for an empty launch (launch(0, 0): the per-launch cost). The one-launch total minus
    the stage sum is what the barriers (and the lost overlap) cost."""
    import time

    t0 = time.monotonic()
    be, kw = _minilm_backend(tb)
    plan = PersistentPlan(be, tb, cfg, split=False)
    _once(be, tb, plan.steps())  # valid activations in every buffer
    total = time_steps(be, plan.steps(), tb, iters)
    empty = time_steps(be, [lambda: plan.launch(0, 0)] * reps, tb, iters) / reps
    kinds = ["qkv", "attention", "o", "ffn1", "ffn2"]
    per, by_kind = [], {k: 0.0 for k in kinds + ["final_ln", "pool"]}
    for s in range(plan.n_stages):
        t = time_steps(be, [lambda s=s: plan.launch(s, s + 1)] * reps, tb, iters) / reps - empty
        kind = {plan.n_stages - 1: "pool", plan.n_stages - 2: "final_ln"}.get(s) or kinds[s % 5]
        per.append({"stage": s, "kind": kind, "us": round(t, 2)})
        by_kind[kind] += t
    ssum = sum(x["us"] for x in per)
    n_bar = plan.n_stages - 1
    return {
        "tb": tb,
        "layers": kw["layers"],
        "grid": plan.grid,
        "cfg": {k: plan.meta[k] for k in CFG_KEYS},
        "one_launch_us": round(total, 2),
        "empty_launch_us": round(empty, 2),
        "stage_sum_us": round(ssum, 2),
        "per_barrier_us": round((total - ssum - empty) / n_bar, 2),
        "by_kind_us": {k: round(v, 2) for k, v in by_kind.items()},
        "stages": per,
        "wall_s": round(time.monotonic() - t0, 1),
        "items": stage_items(tb, plan.meta["H"], plan.meta["I"], plan.meta["NHEAD"],
                             min(be.max_batch, tb), plan.meta),
    }  # fmt: skip


def sweep_cfgs(tb: int) -> list:
    """A handful of alternatives around default_cfg(tb) (each compiles in ~5 s; num_warps 4
    with the one-shot BK 512 spills hundreds of bytes at BM 32: not worth a slot)."""
    c = default_cfg(tb, None, H=384, I=1536, heads=12)
    alts = [
        None,
        {"KSPLIT_F2": 1},  # no split-K
        {"KSPLIT_F2": 4 if c["KSPLIT_F2"] == 2 else 2},
        {"BK": 128, "num_warps": 4},  # the chunked LN path (k loop over 128, pipelined)
        {"num_stages": 2},
    ]
    if tb <= 64:
        alts.append({"BN_WIDE": 64 if c["BN_WIDE"] == 32 else 32})
    else:
        alts.append({"BM": 16})
    if tb >= 256:  # ffn1 / qkv in one round: wider N tiles through the chunked-K path
        alts.append({"BN_WIDE": 128, "BK": 128})
    return alts


if __name__ == "__main__":
    # python lab/gpu/persistent_tools.py [tb ...]          per-op vs persistent (default cfg)
    # python lab/gpu/persistent_tools.py --sweep [tb ...]  a few cfgs (vs the default's output)
    # python lab/gpu/persistent_tools.py --stages [tb ...] per-stage breakdown
    import sys

    args = sys.argv[1:]
    tbs = [int(a) for a in args if not a.startswith("--")] or [16, 128]
    for tb in tbs:
        if "--stages" in args:
            r = stage_times(tb)
        elif "--sweep" in args:
            r = compare(tb=tb, cfgs=sweep_cfgs(tb), per_op=False, iters=200, budget_s=45)
        else:
            r = compare(tb=tb)
        print(json.dumps(r), flush=True)
