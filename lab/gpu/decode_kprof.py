"""Per-kernel device time of one GPU decode step: torch.profiler (CUPTI) over replays
of a bucket's CUDA graph; kernels grouped by name (the site is in the launch order), the sum of
kernel times against the graph's wall time (the rest: launch gaps and tails).

    python lab/gpu/decode_kprof.py --model qwen2.5-0.5b --batch 32 [--pdl 0|1]
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen2.5-0.5b")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--ctx", type=int, default=192)
    ap.add_argument("--pdl", type=int, default=0)
    ap.add_argument("--reps", type=int, default=20)
    a = ap.parse_args(argv)
    from torch.profiler import ProfilerActivity, profile

    from zoi.decoder.cuda import CudaDecoderBackend
    from zoi.decoder.cuda.synth import random_weights, shape_spec

    spec = shape_spec(a.model)
    be = CudaDecoderBackend(
        spec,
        random_weights(spec, 0),
        precision="w8",  # weight-only INT8
        max_batch=a.batch,
        max_seq_len=a.ctx + 64,
        pdl=bool(a.pdl),
    )
    wall = be.time_decode_graph(a.batch, a.ctx)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        be.time_decode_graph(a.batch, a.ctx, n=a.reps)
    evs = sorted(
        (e for e in prof.events() if e.device_type.name == "CUDA"), key=lambda e: e.time_range.start
    )
    starts = [i for i, e in enumerate(evs) if e.name.startswith("embed_kernel")]
    if len(starts) < 2:
        raise SystemExit(f"profile holds {len(starts)} decode steps (embed_kernel launches)")
    # one step: from an embed launch to the next. Sites by kernel name; the linears (gemv /
    # mma kernels) by their order in the step: [qkv, o, gate_up, down] per layer, then lm_head
    # (robust to fused RoPE, split-attention merges and PDL, which change the launch count).
    per_step = starts[1] - starts[0]
    steps = [evs[s : s + per_step] for s in starts if s + per_step <= len(evs)]
    steps = [st for st in steps if [e.name for e in st] == [e.name for e in steps[0]]]
    reps = len(steps)
    lin = ["qkv", "o", "gate_up", "down"]
    site = defaultdict(lambda: [0.0, 0, ""])
    for st in steps:
        n_lin = 0
        for e in st:
            kname = e.name.split("(")[0][:40]
            if kname.startswith(("gemv_kernel", "mma_kernel", "linear_kernel")):
                nm = lin[n_lin % 4] if n_lin < 4 * spec.num_layers else "lm_head"
                n_lin += 1
            else:
                nm = kname.replace("_kernel", "")
            t = getattr(e, "device_time", None) or e.cuda_time
            site[nm][0] += t / reps
            site[nm][1] += 1.0 / reps
            site[nm][2] = kname
    rows = sorted(
        (
            {"site": k, "us_per_step": round(t, 1), "launches": round(c), "kernel": n}
            for k, (t, c, n) in site.items()
        ),
        key=lambda r: -r["us_per_step"],
    )
    span = steps[-1][-1].time_range.end - steps[-1][0].time_range.start
    total = sum(r["us_per_step"] for r in rows)
    print(json.dumps({
        "model": a.model, "batch": a.batch, "ctx": a.ctx, "pdl": bool(a.pdl),
        "graph_wall_us": round(wall, 1), "kernels_per_step": per_step,
        "last_step_span_us": round(span, 1), "kernel_sum_us": round(total, 1), "sites": rows,
    }, indent=1))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
