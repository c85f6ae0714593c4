"""GPU decoder benchmark, for the H200:

  python lab/gpu/decode_bench.py [--quick] [--no-peer] [--out FILE]

* llama-3.2-1b shape, INT8 weight-only (and FP16), batch 1: per-token decode latency through
  step() (host bookkeeping included) and the decode graph replay alone; TTFT of a 128-token prompt.
  Target: <= 0.40 ms per token (INT8).
* qwen2.5-0.5b shape, 32 concurrent streams (128-token prompts, 128 new tokens each): tokens/s of
  the whole run and of the decode steps, vs transformers generate with a static cache and
  torch.compile (same shape, FP16, random init). Target: >= 3x the peer.

Random-init weights in memory (zoi.decoder.cuda.synth); greedy with ignore_eos so every stream
runs its full length. Prints one JSON document; writes it to --out, else to $OUT/ when set.
A failing workload is recorded with its error and the script exits 1 at the end.

The product benchmark is `zoi bench --device cuda --workloads qwen2.5-0.5b-decode,llama-3.2-1b-decode`
(src/zoi/bench/decode.py: the same figures from checkpoint folders, 8 and 32 streams, the
transformers peer on every workload, the same targets); `scripts/gpu_check.sh decbench` runs that.
This script stays as the lab's quick look (in-memory weights, no folder written).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))


def _sync():
    import torch

    torch.cuda.synchronize()


def batch1(name: str, precision: str, prompt: int, new: int) -> dict:
    from zoi.decoder.api import SamplingParams
    from zoi.decoder.cuda import CudaDecoderBackend
    from zoi.decoder.cuda.synth import random_weights, shape_spec

    spec = shape_spec(name)
    t0 = time.perf_counter()
    w = random_weights(spec, 0)
    be = CudaDecoderBackend(spec, w, precision=precision, max_batch=1, max_seq_len=prompt + new + 8)
    build_s = time.perf_counter() - t0
    del w
    ids = np.random.default_rng(0).integers(0, spec.vocab_size, prompt).astype(np.int32)
    out = {}
    for rep in range(2):  # the first round warms up the prefill kernels of this length
        be.add(rep, ids, SamplingParams(max_new_tokens=new, ignore_eos=True))
        t0 = time.perf_counter()
        be.step()
        ttft = time.perf_counter() - t0
        steps = []
        while be.pool().running:
            t0 = time.perf_counter()
            be.step()
            steps.append(time.perf_counter() - t0)
        out = {
            "ttft_ms": round(ttft * 1e3, 3),
            "decode_ms_median": round(float(np.median(steps)) * 1e3, 4),
            "decode_ms_p90": round(float(np.percentile(steps, 90)) * 1e3, 4),
            "tokens": len(steps) + 1,
        }
    if be.use_graphs:
        out["graph_us_ctx1"] = round(be.time_decode_graph(1, 1), 1)
        out["graph_us_ctx" + str(prompt + new)] = round(be.time_decode_graph(1, prompt + new), 1)
    out["build_s"] = round(build_s, 1)
    out["memory"] = be.memory()
    return out


def streams(name: str, precision: str, n: int, prompt: int, new: int) -> dict:
    from zoi.decoder.api import SamplingParams
    from zoi.decoder.cuda import CudaDecoderBackend
    from zoi.decoder.cuda.synth import random_weights, shape_spec

    spec = shape_spec(name)
    w = random_weights(spec, 0)
    be = CudaDecoderBackend(
        spec,
        w,
        precision=precision,
        max_batch=n,
        max_seq_len=prompt + new + 8,
        max_prefill_tokens=n * prompt,
    )
    del w
    rng = np.random.default_rng(1)
    res = {}
    for rep in range(2):
        for i in range(n):
            be.add(
                rep * n + i,
                rng.integers(0, spec.vocab_size, prompt).astype(np.int32),
                SamplingParams(max_new_tokens=new, ignore_eos=True),
            )
        t0 = time.perf_counter()
        be.step()  # all prefills (packed) + nothing to decode yet
        ttft = time.perf_counter() - t0
        t1 = time.perf_counter()
        toks = n
        while be.pool().running:
            toks += len(be.step())
        t2 = time.perf_counter()
        res = {
            "streams": n,
            "tokens": toks,
            "ttft_ms_all_prefills": round(ttft * 1e3, 2),
            "tokens_per_s": round(toks / (t2 - t0), 1),
            "decode_tokens_per_s": round((toks - n) / (t2 - t1), 1),
            "decode_step_ms": round((t2 - t1) / max(1, new - 1) * 1e3, 3),
        }
    if be.use_graphs:
        res[f"graph_us_b{n}"] = round(be.time_decode_graph(n, prompt + new // 2), 1)
    return res


def hf_peer(name: str, n: int, prompt: int, new: int) -> dict:
    """transformers generate, static cache + torch.compile, FP16, the same shape (random init)."""
    import torch
    import transformers

    from zoi.decoder.synthetic import SHAPES

    s = dict(SHAPES[name])
    cls = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config}[s["arch"]]
    cfg = cls(
        vocab_size=s["vocab"],
        hidden_size=s["hidden"],
        intermediate_size=s["inter"],
        num_hidden_layers=s["layers"],
        num_attention_heads=s["heads"],
        num_key_value_heads=s["kv_heads"],
        tie_word_embeddings=s.get("tie", False),
        rope_theta=s.get("rope_theta", 1e4),
        max_position_embeddings=prompt + new + 64,
    )
    model = (
        transformers.AutoModelForCausalLM.from_config(cfg)
        .to(device="cuda", dtype=torch.float16)
        .eval()
    )
    model.generation_config.cache_implementation = "static"
    # generate compiles the forward itself when the cache is compileable (static): wrapping
    # model.forward in torch.compile(mode="reduce-overhead") by hand made the H200 run fail
    # ("accessing tensor output of CUDAGraphs that has been overwritten by a subsequent run":
    # generate keeps step i's logits past step i+1); transformers' own compiled call marks
    # the CUDA-graph steps
    ids = torch.randint(0, s["vocab"], (n, prompt), device="cuda")
    kw = dict(
        max_new_tokens=new,
        min_new_tokens=new,
        do_sample=False,
        attention_mask=torch.ones_like(ids),
        pad_token_id=0,
    )
    res = {}
    with torch.no_grad():
        for rep in range(3):  # compile, then timed
            _sync()
            t0 = time.perf_counter()
            out = model.generate(ids, **kw)
            _sync()
            dt = time.perf_counter() - t0
            res = {
                "streams": n,
                "tokens": int(n * (out.shape[1] - prompt)),
                "tokens_per_s": round(n * new / dt, 1),
                "wall_s": round(dt, 3),
                "round": rep,
            }
    res["peer"] = (
        f"transformers {transformers.__version__} torch {torch.__version__} fp16 static cache + compile"
    )
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="shorter runs (smoke)")
    ap.add_argument("--no-peer", action="store_true", help="skip the transformers peer")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    prompt, new = (32, 32) if a.quick else (128, 128)
    doc: dict = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "prompt": prompt,
        "new": new,
        "results": {},
        "errors": {},
    }
    try:
        import torch

        doc["gpu"] = torch.cuda.get_device_name() if torch.cuda.is_available() else None
        doc["torch"] = torch.__version__
    except Exception as e:  # noqa: BLE001
        doc["errors"]["torch"] = repr(e)
    work = [
        ("llama-3.2-1b w8 b1", lambda: batch1("llama-3.2-1b", "w8", prompt, new)),
        ("llama-3.2-1b fp16 b1", lambda: batch1("llama-3.2-1b", "fp16", prompt, new)),
        ("qwen2.5-0.5b w8 x32", lambda: streams("qwen2.5-0.5b", "w8", 32, prompt, new)),
        ("qwen2.5-0.5b fp16 x32", lambda: streams("qwen2.5-0.5b", "fp16", 32, prompt, new)),
    ]
    if not a.no_peer:
        work.append(
            ("qwen2.5-0.5b transformers x32", lambda: hf_peer("qwen2.5-0.5b", 32, prompt, new))
        )
    for key, fn in work:
        t0 = time.perf_counter()
        try:
            doc["results"][key] = fn()
        except Exception as e:  # noqa: BLE001 - recorded, the others still run
            doc["errors"][key] = f"{type(e).__name__}: {e}"
            traceback.print_exc()
        print(f"# {key}: {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
        import gc

        gc.collect()
        try:
            import torch

            torch.cuda.empty_cache()
        except Exception:  # noqa: BLE001
            pass
    r = doc["results"]
    lat = r.get("llama-3.2-1b int8 b1", {}).get("decode_ms_median")
    ours = r.get("qwen2.5-0.5b int8 x32", {}).get("tokens_per_s")
    peer = r.get("qwen2.5-0.5b transformers x32", {}).get("tokens_per_s")
    doc["targets"] = {
        "llama-3.2-1b int8 b1 decode <= 0.40 ms": None
        if lat is None
        else {"ms": lat, "met": lat <= 0.40},
        "qwen2.5-0.5b x32 >= 3x transformers": None
        if not (ours and peer)
        else {"ratio": round(ours / peer, 2), "met": ours / peer >= 3.0},
    }
    text = json.dumps(doc, indent=1)
    print(text)
    out = a.out or (
        os.path.join(
            os.environ["OUT"], f"decode_bench_{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json"
        )
        if os.environ.get("OUT")
        else None
    )
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(text)
        print(f"# wrote {out}", file=sys.stderr)
    return 1 if doc["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
