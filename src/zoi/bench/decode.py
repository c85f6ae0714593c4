"""Decode benchmarks (`zoi bench --workloads smollm2-135m-decode,...`): random-init checkpoints
of real models' shapes (zoi.decoder.synthetic.SHAPES, written once into the bench cache), the
same prompt token ids for every provider.

Figures per provider: time to first token (a prompt of `prompt_len` tokens: prefill + the first
token), per-token decode latency at batch 1 (median of the steps after the first), and tokens/s
of `streams` concurrent streams (prompts admitted together, every generated token counted,
prefill included). Providers: zoi fp32 / int8 / w8a8 (CPU backend), transformers FP32 generate
(greedy, dynamic cache, torch threads = threads), llama.cpp (llama-cpp-python, GGUF Q8_0 written
by zoi.decoder.gguf_export; one sequence, so no streams figure).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np

WORKLOADS = {
    "smollm2-135m-decode": "smollm2-135m",
    "qwen2.5-0.5b-decode": "qwen2.5-0.5b",
    "llama-3.2-1b-decode": "llama-3.2-1b",
}
PROVIDERS = ("zoi-fp32", "zoi-int8", "zoi-w8a8", "transformers-fp32", "llamacpp-q8_0")


def model_folder(shape: str, cache: Path) -> Path:
    from zoi.decoder.synthetic import write_shape

    d = cache / "decoders" / shape
    if not (d / "config.json").exists():
        tmp = d.with_name(d.name + ".tmp")
        write_shape(tmp, shape)
        tmp.rename(d)
    return d


def _prompts(vocab: int, n: int, length: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, min(vocab, 20000), length).astype(np.int32) for _ in range(n)]


def bench_zoi(
    folder: Path, precision: str, prompts, new_tokens: int, streams: int, threads: int
) -> dict:
    from zoi.decoder.api import SamplingParams
    from zoi.decoder.compile import compile_decoder

    L = len(prompts[0]) + new_tokens
    g = compile_decoder(
        folder,
        precision=precision,
        max_seq_len=L + 1,
        max_batch=streams,
        kv_blocks=streams * (-(-L // 16)) + 1,
        threads=threads,
    )
    be = g.backend
    p = SamplingParams(max_new_tokens=new_tokens, ignore_eos=True)
    # warm-up
    be.add(0, prompts[0], SamplingParams(max_new_tokens=4, ignore_eos=True))
    while be.step():
        pass
    ttft, steps = [], []
    for r in range(3):
        t0 = time.perf_counter()
        be.add(1, prompts[r % len(prompts)], p)
        be.step()
        ttft.append(time.perf_counter() - t0)
        while True:
            t0 = time.perf_counter()
            ev = be.step()
            steps.append(time.perf_counter() - t0)
            if not ev or ev[0].finish is not None:
                break
    t0 = time.perf_counter()
    for i in range(streams):
        be.add(10 + i, prompts[i % len(prompts)], p)
    n = 0
    while True:
        ev = be.step()
        if not ev:
            break
        n += len(ev)
    dt = time.perf_counter() - t0
    return {
        "ttft_ms": 1e3 * float(np.median(ttft)),
        "decode_ms_per_token": 1e3 * float(np.median(steps)),
        "decode_ms_p90": 1e3 * float(np.percentile(steps, 90)),
        "streams": streams,
        "tokens_per_s_streams": n / dt,
        "isa": be.isa,
        "threads": be.model.nthreads,
    }


def bench_transformers(folder: Path, prompts, new_tokens: int, streams: int, threads: int) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(threads)
    m = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()

    def gen(batch, n):
        ids = torch.tensor(np.stack(batch).astype(np.int64))
        with torch.no_grad():
            t0 = time.perf_counter()
            m.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=n,
                min_new_tokens=n,
                do_sample=False,
                pad_token_id=0,
            )
            return time.perf_counter() - t0

    gen(prompts[:1], 2)
    t1 = [gen(prompts[:1], 1) for _ in range(3)]
    tn = [gen(prompts[:1], new_tokens) for _ in range(2)]
    ts = gen([prompts[i % len(prompts)] for i in range(streams)], new_tokens)
    return {
        "ttft_ms": 1e3 * float(np.median(t1)),
        "decode_ms_per_token": 1e3
        * (float(np.median(tn)) - float(np.median(t1)))
        / (new_tokens - 1),
        "streams": streams,
        "tokens_per_s_streams": streams * new_tokens / ts,
        "torch": torch.__version__,
    }


def bench_llamacpp(folder: Path, cache: Path, prompts, new_tokens: int, threads: int) -> dict:
    import llama_cpp

    from zoi.decoder.gguf_export import write_gguf

    f = cache / "decoders" / f"{folder.name}.q8_0.gguf"
    if not f.exists():
        write_gguf(folder, f.with_suffix(".tmp"), "Q8_0").rename(f)
    L = len(prompts[0]) + new_tokens
    llm = llama_cpp.Llama(
        model_path=str(f),
        n_ctx=L + 8,
        n_batch=512,
        n_threads=threads,
        n_threads_batch=threads,
        verbose=False,
    )
    ttft, steps = [], []
    for r in range(4):
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(prompts[r % len(prompts)].tolist())
        tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        ttft.append(time.perf_counter() - t0)
        for _ in range(new_tokens - 1):
            t0 = time.perf_counter()
            llm.eval([tok])
            tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
            steps.append(time.perf_counter() - t0)
    return {
        "ttft_ms": 1e3 * float(np.median(ttft[1:])),
        "decode_ms_per_token": 1e3 * float(np.median(steps)),
        "decode_ms_p90": 1e3 * float(np.percentile(steps, 90)),
        "streams": None,
        "tokens_per_s_streams": None,
        "llama_cpp_python": llama_cpp.__version__,
        "system": llama_cpp.llama_print_system_info().decode(),
    }


def run(
    workloads: list[str],
    providers: list[str] | None = None,
    threads: int = 2,
    prompt_len: int = 128,
    new_tokens: int = 64,
    streams: int = 8,
    cache: Path | None = None,
    out: Path | None = None,
) -> dict:
    from zoi.bench.models import default_cache_dir
    from zoi.bench.sysinfo import cpu_info, loadavg

    cache = Path(cache or default_cache_dir())
    bad = [w for w in workloads if w not in WORKLOADS]
    if bad:
        raise ValueError(f"unknown decode workload(s) {bad}; known: {sorted(WORKLOADS)}")
    provs = providers or list(PROVIDERS)
    res = {
        "kind": "decode",
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "cpu": cpu_info(),
        "threads": threads,
        "prompt_len": prompt_len,
        "new_tokens": new_tokens,
        "streams": streams,
        "loadavg_before": loadavg(),
        "rows": [],
    }
    for wl in workloads:
        folder = model_folder(WORKLOADS[wl], cache)
        cfg = json.loads((folder / "config.json").read_text())
        prompts = _prompts(cfg["vocab_size"], streams, prompt_len)
        for pv in provs:
            t0 = time.time()
            la = loadavg()
            try:
                if pv.startswith("zoi-"):
                    r = bench_zoi(folder, pv.split("-")[1], prompts, new_tokens, streams, threads)
                elif pv == "transformers-fp32":
                    r = bench_transformers(folder, prompts, new_tokens, streams, threads)
                elif pv == "llamacpp-q8_0":
                    r = bench_llamacpp(folder, cache, prompts, new_tokens, threads)
                else:
                    raise ValueError(f"unknown provider {pv!r}; known: {', '.join(PROVIDERS)}")
            except ImportError as e:
                r = {"error": f"not installed: {e}"}
            except Exception as e:  # one provider failing does not end the run; the row says why
                r = {"error": f"{type(e).__name__}: {e}"}
            r.update(
                workload=wl, provider=pv, wall_s=round(time.time() - t0, 1), loadavg_at_start=la
            )
            res["rows"].append(r)
            print(
                json.dumps(
                    {
                        k: (round(v, 3) if isinstance(v, float) else v)
                        for k, v in r.items()
                        if k not in ("system",)
                    }
                ),
                flush=True,
            )
    res["loadavg_after"] = loadavg()
    if out is not None:
        out = Path(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(res, indent=1))
        print(out)
    return res


def run_from_args(args) -> int:
    out = args.out
    if out is None:
        d = args.out_dir or Path(os.environ.get("ZOI_BENCH_OUT", "bench/results"))
        out = Path(d) / (time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + "_cpu_decode.json")
    provs = None
    if args.providers:
        import fnmatch

        provs = [p for p in PROVIDERS if any(fnmatch.fnmatch(p, pat) for pat in args.providers)]
    run(args.workloads, provs, threads=args.threads, cache=args.cache_dir, out=out)
    return 0
