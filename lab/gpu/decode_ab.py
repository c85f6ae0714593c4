"""A/B of the GPU decoder's launch options: programmatic dependent launch (pdl), the L2
prefetch of W before the wait (prefetch) and the pipelined step (pipeline: the next decode step
launched before the host reads this one's tokens), on the Llama-3.2-1B shape at batch 1 and the
Qwen2.5-0.5B shape at 32 streams, INT8, random weights. One backend per (pdl, prefetch); pipeline
is switched on the same backend. Prints one JSON line per case and a summary.

    python lab/gpu/decode_ab.py [--prompt 128] [--new 128] [--out R.json]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import time

import numpy as np

VARIANTS = [  # (label, pdl, prefetch)
    ("base", False, False),
    ("pdl", True, False),
    ("pdl+prefetch", True, True),
]


def one_stream(be, spec, prompt, new, rep):
    from zoi.decoder.api import SamplingParams

    ids = np.random.default_rng(0).integers(0, spec.vocab_size, prompt).astype(np.int32)
    be.add(rep, ids, SamplingParams(max_new_tokens=new, ignore_eos=True))
    be.step()
    steps = []
    while be.pool().running:
        t0 = time.perf_counter()
        be.step()
        steps.append(time.perf_counter() - t0)
    return {"decode_ms_median": round(float(np.median(steps)) * 1e3, 4)}


def many_streams(be, spec, n, prompt, new, rep):
    from zoi.decoder.api import SamplingParams

    rng = np.random.default_rng(1)
    for i in range(n):
        be.add(
            rep * 1000 + i,
            rng.integers(0, spec.vocab_size, prompt).astype(np.int32),
            SamplingParams(max_new_tokens=new, ignore_eos=True),
        )
    t0 = time.perf_counter()
    toks = len(be.step())
    t1 = time.perf_counter()
    while be.pool().running:
        toks += len(be.step())
    t2 = time.perf_counter()
    return {
        "tokens_per_s": round(toks / (t2 - t0), 1),
        "decode_tokens_per_s": round((toks - n) / (t2 - t1), 1),
        "decode_step_ms": round((t2 - t1) / max(1, new - 1) * 1e3, 4),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--streams", type=int, default=32)
    ap.add_argument("--models", default="llama-3.2-1b,qwen2.5-0.5b")
    ap.add_argument("--variants", default="base,pdl,pdl+prefetch")
    ap.add_argument("--precision", default="w8", help="w8 (weight-only INT8), int8 (W8A8) or fp16")
    ap.add_argument(
        "--kw",
        default="",
        help="backend options, one variant each per ';', e.g. "
        "'fuse_rope=0;fuse_rope=1,attn_min_per=2' (applied on top of every --variants entry)",
    )
    ap.add_argument("--pipeline-only", action="store_true", help="skip the unpipelined run")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    want = a.variants.split(",")
    kws = [
        {k: int(v) for k, v in (p.split("=") for p in c.split(",") if p)}
        for c in (a.kw.split(";") if a.kw else [""])
    ]
    import torch

    from zoi.decoder.cuda import CudaDecoderBackend
    from zoi.decoder.cuda.synth import random_weights, shape_spec

    rows = []
    for name in a.models.split(","):
        spec = shape_spec(name)
        w = random_weights(spec, 0)
        n = 1 if name.startswith("llama") else a.streams
        runs = [
            (label + "".join(f",{k}={v}" for k, v in kw.items()), pdl, pf, kw)
            for label, pdl, pf in VARIANTS
            if label in want
            for kw in kws
        ]
        for label, pdl, pf, kw in runs:
            t0 = time.perf_counter()
            be = CudaDecoderBackend(
                spec,
                w,
                precision=a.precision,
                max_batch=n,
                max_seq_len=a.prompt + a.new + 8,
                max_prefill_tokens=n * a.prompt,
                pdl=pdl,
                prefetch=pf,
                **kw,
            )
            build = time.perf_counter() - t0
            ctx = a.prompt + a.new // 2
            g = [be.time_decode_graph(n, ctx) for _ in range(3)]
            for pipe in (True,) if a.pipeline_only else (False, True):
                be.pipeline = pipe
                res = []
                for rep in range(2):  # the first warms the prefill kernels of this length
                    f = one_stream if n == 1 else many_streams
                    args = (
                        (be, spec, a.prompt, a.new, rep)
                        if n == 1
                        else (be, spec, n, a.prompt, a.new, rep)
                    )
                    res.append(f(*args))
                row = {
                    "model": name,
                    "batch": n,
                    "variant": label + ("+pipeline" if pipe else ""),
                    "precision": a.precision,
                    "graph_us": round(min(g), 1),
                    "build_s": round(build, 1),
                    **res[-1],
                }
                rows.append(row)
                print(json.dumps(row), flush=True)
            del be
            gc.collect()
            torch.cuda.empty_cache()
        del w
        gc.collect()
    doc = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "gpu": torch.cuda.get_device_name(),
        "prompt": a.prompt,
        "new": a.new,
        "rows": rows,
    }
    out = a.out or (
        os.path.join(os.environ["OUT"], "decode_ab.json") if os.environ.get("OUT") else None
    )
    if out:
        with open(out, "w") as f:
            json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
