"""Prefill-linear sweep: tiles of the "dot" kernel (linear_decode.linear_kernel) at
the prefill call sites of Qwen2.5-0.5B and Llama-3.2-1B (INT8 weights), M = 512 / 4096 packed
tokens, then the end-to-end effect of the winners on Qwen2.5-0.5B x32 (32 prompts of 128 tokens
prefilled in one pass: time to first token and tokens/s, the same backend with PREFILL_TABLE
empty and filled).

    python lab/gpu/sweep_prefill.py --out $OUT/prefill_sweep.json

Each (site, M, config): fresh random inputs, output poisoned with NaN, checked against a torch
float64 reference (max |err| / max |ref| < 1e-2), then timed as a CUDA graph of 10 launches
(median of 5 replays, us per launch). Writes the rows, the best per (model, site, M) and
"table" lines for linear_table.PREFILL_TABLE.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

CONFIGS = [  # block_m, block_n, block_k, warps, stages
    (64, 64, 64, 4, 3),
    (128, 64, 64, 4, 3),
    (64, 128, 64, 4, 3),
    (128, 128, 64, 4, 3),
    (128, 128, 64, 8, 3),
    (128, 128, 32, 8, 4),
    (128, 256, 64, 8, 3),
    (64, 64, 128, 4, 3),
]
SHAPES = {  # site: (N, K, rms, bias, res, swiglu)
    "qwen2.5-0.5b": {
        "qkv": (1152, 896, True, True, False, False),
        "o": (896, 896, False, False, True, False),
        "gu": (4864, 896, True, False, False, True),
        "down": (896, 4864, False, False, True, False),
    },
    "tiny": {  # TRITON_INTERPRET=1 --models tiny --ms 40 --no-e2e: the script's CPU check
        "qkv": (48, 32, True, True, False, False),
        "gu": (40, 32, True, False, False, True),
        "down": (32, 40, False, False, True, False),
    },
    "llama-3.2-1b": {
        "qkv": (3072, 2048, True, False, False, False),
        "o": (2048, 2048, False, False, True, False),
        "gu": (8192, 2048, True, False, False, True),
        "down": (2048, 8192, False, False, True, False),
    },
}


def case(torch, kl, M, N, K, rms, bias, res, swiglu, cfg, time_it=True):
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator(device=dev).manual_seed(M + N + K)
    nw = 2 * N if swiglu else N
    x = torch.randn(M, K, device=dev, generator=g)
    x = x if rms else x.half()
    w = torch.randn(nw, K, device=dev, generator=g) / K**0.5
    s = w.abs().amax(1).clamp_min(1e-12) / 127
    q = torch.round(w / s[:, None]).clamp(-127, 127).to(torch.int8)
    b = torch.randn(N, device=dev, generator=g) if bias else None
    r = torch.randn(M, N, device=dev, generator=g) if res else None
    y = x.half().double() @ (q.double() * s.double()[:, None]).T
    if rms:
        y = y / torch.sqrt((x.double() ** 2).mean(1, keepdim=True) + 1e-5)
    if swiglu:
        y = y[:, :N] / (1 + torch.exp(-y[:, :N])) * y[:, N:]
    if bias:
        y = y + b.double()
    if res:
        y = y + r.double()
    out = torch.full(
        (M, N), float("nan"), device=dev, dtype=torch.float32 if res else torch.float16
    )

    def launch(reset=True):
        if res and reset:
            out.copy_(r)
        kl.linear(
            x, q, out, M, N, K, cfg, scale=s, bias=b, res=out if res else None,
            rms_eps=1e-5 if rms else None, swiglu=swiglu,
        )  # fmt: skip

    launch()
    err = float((out.double() - y).abs().max() / y.abs().max())
    if not time_it or not err < 1e-2 or dev == "cpu":
        return err, None
    st = torch.cuda.Stream()
    st.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(st):
        for _ in range(2):
            launch(False)
    torch.cuda.current_stream().wait_stream(st)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(10):  # the residual accumulates: timing only, no reset copy in the graph
            launch(False)
    ts = []
    for _ in range(5):
        a, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        e.record()
        e.synchronize()
        ts.append(a.elapsed_time(e) * 1e3 / 10)
    ts.sort()
    return err, ts[len(ts) // 2]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ms", default="512,4096")
    ap.add_argument("--models", default="qwen2.5-0.5b,llama-3.2-1b")
    ap.add_argument("--no-e2e", action="store_true")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    import torch

    from zoi.backends.cuda.kernels import linear_decode as kl
    from zoi.backends.cuda.kernels import linear_table as lt

    sms = (
        torch.cuda.get_device_properties(0).multi_processor_count
        if torch.cuda.is_available()
        else 8
    )
    rows, best = [], {}
    t0 = time.time()
    for model in a.models.split(","):
        for site, (N, K, rms, bias, res, swiglu) in SHAPES[model].items():
            for M in map(int, a.ms.split(",")):
                base = lt.pick_dot(M, N, K, sms, 1, swiglu)
                for bm, bn, bk, nw, st in CONFIGS:
                    if swiglu and bm * bn > 128 * 128:
                        continue  # two accumulators of that size spill
                    cfg = lt.LinearConfig(bm, bn, bk, 1, nw, st)
                    try:
                        err, us = case(torch, kl, M, N, K, rms, bias, res, swiglu, cfg)
                    except Exception as e:  # noqa: BLE001 - a config that does not compile
                        err, us = None, None
                        print(f"# {model} {site} {M} {cfg}: {type(e).__name__}: {e}"[:300])
                    if err is not None and err < 1e-2 and us is None:
                        us = 0.0  # the interpreter: checked, not timed
                    row = dict(model=model, site=site, M=M, N=N, K=K, cfg=[bm, bn, bk, nw, st],
                               err=err, us=us, base=cfg == base)  # fmt: skip
                    rows.append(row)
                    print(json.dumps(row), flush=True)
                    key = (model, site, M)
                    if us is not None and (key not in best or us < best[key]["us"]):
                        best[key] = row
    doc = {"when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
           "sweep_s": round(time.time() - t0, 1), "rows": rows, "best": list(best.values())}  # fmt: skip
    table = []
    for (model, site, M), r in best.items():
        base = next(
            (
                x
                for x in rows
                if x["model"] == model and x["site"] == site and x["M"] == M and x["base"]
            ),
            None,
        )
        bm, bn, bk, nw, st = r["cfg"]
        key = (site, lt.prefill_bucket(M), r["N"], r["K"], "int8")
        lt.PREFILL_TABLE[key] = lt.LinearConfig(bm, bn, bk, 1, nw, st)
        table.append(f'    {key!r}: LinearConfig({bm}, {bn}, {bk}, 1, {nw}, {st}),  # {model} {r["us"]:.1f} us'
                     f' (64x64x64: {base["us"] if base and base["us"] else float("nan"):.1f})')  # fmt: skip
    doc["table"] = table
    print("\n".join(table))
    if not a.no_e2e:
        import decode_ab  # noqa: E402

        from zoi.decoder.cuda import CudaDecoderBackend
        from zoi.decoder.cuda.synth import random_weights, shape_spec

        spec = shape_spec("qwen2.5-0.5b")
        be = CudaDecoderBackend(spec, random_weights(spec, 0), precision="w8", max_batch=32,
                                max_seq_len=128 + 128 + 8, max_prefill_tokens=32 * 128)  # fmt: skip
        saved = dict(lt.PREFILL_TABLE)
        e2e = {}
        for label, tab in (
            ("pick_dot", {}),
            ("swept", saved),
            ("pick_dot again", {}),
            ("swept again", saved),
        ):
            lt.PREFILL_TABLE.clear()
            lt.PREFILL_TABLE.update(tab)
            t = time.perf_counter()
            r = decode_ab.many_streams(be, spec, 32, 128, 128, len(e2e))
            r["wall_s"] = round(time.perf_counter() - t, 3)
            import numpy as np

            from zoi.decoder.api import SamplingParams

            rng = np.random.default_rng(9)
            for i in range(32):
                be.add(10_000 + i, rng.integers(0, spec.vocab_size, 128).astype(np.int32),
                       SamplingParams(max_new_tokens=1, ignore_eos=True))  # fmt: skip
            t = time.perf_counter()
            while be.pool().running:
                be.step()
            r["ttft_ms_32x128"] = round((time.perf_counter() - t) * 1e3, 2)
            e2e[label] = r
            print(label, json.dumps(r), flush=True)
        doc["e2e_qwen_x32"] = e2e
    out = a.out or (
        os.path.join(os.environ["OUT"], "prefill_sweep.json") if os.environ.get("OUT") else None
    )
    if out:
        Path(out).write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
