"""Where a small call's host-observed time goes: the parts of CudaBackend.run.

    python lab/gpu/hostpath.py --out $OUT/hostpath.json [--shapes 1x16,1x128,8x128]

Per shape and precision, p50 / p99 µs over >= 2000 calls of
  full       be.run(ids, pos, cu, normalize=True): what run_packed pays
  stage      the host staging alone (numpy writes into the pinned input)
  api        the driver sequence alone (H2D, graph launch, D2H, sync) with the bucket's graph
  api_1k     the same sequence with a graph of ONE tiny kernel (a
             torch fill of one output row):
             the fixed cost of a call whatever the forward does
  launch_1k  graph launch + sync of that one-kernel graph (no copies)
  h2d / d2h  one copy + sync
  graph      back-to-back replays of the bucket's graph (device time of the forward)
so that full - graph = host path, api_1k - launch_1k = what the two copies add, and so on.
minilm: the real all-MiniLM-L6-v2 (FP16 copy) when ZOI_MINILM_DIR names it, else random init.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1] / "src"))


def pct(fn, n=2000, warm=50):
    for _ in range(warm):
        fn()
    ts = np.empty(n)
    for i in range(n):
        t0 = time.perf_counter()
        fn()
        ts[i] = time.perf_counter() - t0
    return dict(p50_us=float(np.median(ts) * 1e6), p99_us=float(np.percentile(ts, 99) * 1e6))


PARTS = ("full", "stage", "api", "api_1k", "launch_1k", "h2d", "d2h", "graph")


def measure(be, torch, bench, rng, B, S) -> dict:
    """The parts of one shape's call (see the module doc)."""
    from zoi.backends.cuda.capture import capture, destroy

    cu, chk, s = be._cu, be.drv.check, be.stream
    st, call = be.staging, be.call
    ids, pos, cuq = bench.inputs(rng, B, S)
    flat, tb = ids.reshape(-1), B * S
    persistent = be._pplans.get(tb) is not None
    n, _ = be._stage(flat, pos, cuq, True, tb)
    gexec = be._graphs[tb][1]
    one = capture(be.drv, torch, s, be.tstream, [lambda: be.d_out[:1].zero_()])
    nb = B * be.spec.hidden * 4
    flag = be._pplans[tb].bar[1:] if persistent else None

    def h2d():
        chk(cu.cuMemcpyHtoDAsync(call.d_in_ptr, st.p_in.ptr, n * 4, s))
        chk(cu.cuStreamSynchronize(s))

    def d2h():
        chk(cu.cuMemcpyDtoHAsync(st.p_out.ptr, call.d_out_ptr, nb, s))
        chk(cu.cuStreamSynchronize(s))

    def launch_1k():
        chk(cu.cuGraphLaunch(one[1], s))
        chk(cu.cuStreamSynchronize(s))

    row = dict(
        shape=f"{B}x{S}",
        persistent=persistent,
        nodes=be._graphs[tb][2],
        full=pct(lambda: be.run(flat, pos, cuq, True)),
        stage=pct(lambda: be._stage(flat, pos, cuq, True, tb)),
        api=pct(lambda: call.run(st, gexec, n, B, flag)),
        api_1k=pct(lambda: call.run(st, one[1], n, B)),
        launch_1k=pct(launch_1k),
        h2d=pct(h2d),
        d2h=pct(d2h),
        graph=dict(p50_us=bench.graph_only_us(be, tb, reps=200)),
    )
    destroy(be.drv, one)
    return row


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="gpu_out/hostpath.json")
    ap.add_argument("--shapes", default="1x16,1x128,8x128")
    ap.add_argument("--precisions", default="int8,fp16")
    args = ap.parse_args(argv)

    import torch

    import bench  # lab/gpu/bench.py
    from zoi.backends.cuda.backend import CudaBackend

    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
    buckets = sorted({b * s for b, s in shapes})
    rng = np.random.default_rng(0)
    res = dict(time=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
               gpu=torch.cuda.get_device_name(), rows=[])  # fmt: skip
    with tempfile.TemporaryDirectory() as d:
        folder = os.environ.get("ZOI_MINILM_DIR") or d
        if folder == d:
            bench.build_hf("minilm", d)
        for prec in args.precisions.split(","):
            m = bench.zoi_model(folder, prec, max_tokens=max(buckets), max_batch=256)
            be = CudaBackend(m, buckets=buckets)
            for B, S in shapes:
                row = measure(be, torch, bench, rng, B, S)
                row["precision"] = prec
                res["rows"].append(row)
                print(
                    f"{prec} {B}x{S} nodes {row['nodes']} persistent {row['persistent']}: "
                    + ", ".join(f"{k} {row[k]['p50_us']:.1f}" for k in PARTS),
                    flush=True,
                )
                Path(args.out).parent.mkdir(parents=True, exist_ok=True)
                Path(args.out).write_text(json.dumps(res, indent=1))
            del be
            torch.cuda.empty_cache()
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
