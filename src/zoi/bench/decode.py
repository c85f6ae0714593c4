"""Decode benchmarks (`zoi bench --workloads smollm2-135m-decode,...`): random-init checkpoints
of real models' shapes (zoi.decoder.synthetic.SHAPES, written once into the bench cache), the
same prompt token ids for every provider.

Figures per provider: time to first token (a prompt of `prompt_len` tokens: prefill + the first
token), per-token decode latency at batch 1 (median of the steps after the first), and tokens/s
of `streams` concurrent streams (prompts admitted together, every generated token counted,
prefill included; one figure per count in `by_streams`, the largest count in
`streams` / `tokens_per_s_streams`).

Provider names carry zoi's precision words: int8 = W8A8 (INT8 weights and activations), w8 =
weight-only INT8 (`precision_words` in the JSON). Result files written before these words have no
`precision_words`: there zoi-int8 / zoi-cuda-int8 were weight-only and zoi-w8a8 / zoi-cuda-w8a8
W8A8; their rows are kept as written. `--providers zoi-w8a8` / `zoi-cuda-w8a8` still select
zoi-int8 / zoi-cuda-int8 (the same W8A8 path).

CPU providers (`--device cpu`, the default without a GPU): zoi fp32 / int8 (CPU backend),
transformers FP32 generate (greedy, dynamic cache, torch threads = threads), llama.cpp
(llama-cpp-python, GGUF Q8_0 written by zoi.decoder.gguf_export; one sequence, so no streams
figure). Streams: 8.

GPU providers (`--device cuda`): zoi-cuda-w8 / -int8 / -fp16 (CudaDecoderBackend
through compile_decoder(device="cuda"); batch-1 steps through step(), host bookkeeping included;
per streams count also the decode-only tokens/s and `time_decode_graph_us`, the CUDA-graph replay
of one decode step alone) and transformers-cuda-fp16 (generate, FP16, static cache, which
compiles itself; TTFT = max_new_tokens=1). Streams: 8 and 32; 128 new tokens. The JSON's
`targets` say whether the decoder's GPU targets are met. Under TRITON_INTERPRET=1 without a GPU the
zoi-cuda providers run through the Triton interpreter (the CPU test; no graphs).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import numpy as np

WORKLOADS = {
    "smollm2-135m-decode": "smollm2-135m",
    "qwen2.5-0.5b-decode": "qwen2.5-0.5b",
    "llama-3.2-1b-decode": "llama-3.2-1b",
}
CPU_PROVIDERS = ("zoi-fp32", "zoi-int8", "transformers-fp32", "llamacpp-q8_0")
CUDA_PROVIDERS = ("zoi-cuda-w8", "zoi-cuda-int8", "zoi-cuda-fp16", "transformers-cuda-fp16")
PROVIDERS = CPU_PROVIDERS + CUDA_PROVIDERS
# the earlier names of the W8A8 providers (compile_decoder's alias "w8a8" of "int8")
PROVIDER_ALIASES = {"zoi-w8a8": "zoi-int8", "zoi-cuda-w8a8": "zoi-cuda-int8"}
PRECISION_WORDS = "int8 = W8A8 (INT8 weights and activations), w8 = weight-only INT8"
STREAMS = {"cpu": (8,), "cuda": (8, 32)}  # default concurrent streams per device
NEW_TOKENS = {"cpu": 64, "cuda": 128}  # default new tokens (the run's largest device wins)
# the decoder's GPU targets: (workload, provider, what, bound)
# (weight-only INT8: the GPU's fastest INT8 path, batch 1 and 32 rows)
TARGET_B1 = ("llama-3.2-1b-decode", "zoi-cuda-w8", 0.40)  # batch-1 decode ms per token, <=
TARGET_X32 = ("qwen2.5-0.5b-decode", "zoi-cuda-w8", "transformers-cuda-fp16", 32, 3.0)  # >=


def device_of(provider: str) -> str:
    return "cuda" if "-cuda-" in provider else "cpu"


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
    folder: Path, precision: str, prompts, new_tokens: int, streams: list[int], threads: int
) -> dict:
    from zoi.decoder.api import SamplingParams
    from zoi.decoder.compile import compile_decoder

    L = len(prompts[0]) + new_tokens
    nmax = max(streams)
    g = compile_decoder(
        folder,
        precision=precision,
        max_seq_len=L + 1,
        max_batch=nmax,
        kv_blocks=nmax * (-(-L // 16)) + 1,
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
    by = {}
    for n in streams:
        t0 = time.perf_counter()
        for i in range(n):
            be.add(10 + i, prompts[i % len(prompts)], p)
        toks = 0
        while True:
            ev = be.step()
            if not ev:
                break
            toks += len(ev)
        by[str(n)] = {
            "streams": n,
            "tokens": toks,
            "tokens_per_s": toks / (time.perf_counter() - t0),
        }
    return {
        "ttft_ms": 1e3 * float(np.median(ttft)),
        "decode_ms_per_token": 1e3 * float(np.median(steps)),
        "decode_ms_p90": 1e3 * float(np.percentile(steps, 90)),
        **_largest(by),
        "precision": precision,
        "isa": be.isa,
        "threads": be.engine.nthreads,
    }


def _largest(by: dict) -> dict:
    """The CPU rows' `streams` / `tokens_per_s_streams` (the largest count) and every count."""
    top = by[str(max(int(k) for k in by))]
    return {
        "streams": top["streams"],
        "tokens_per_s_streams": top["tokens_per_s"],
        "by_streams": by,
    }


def _hf_generate_s(m, batch, n: int, device: str) -> float:
    """Seconds of one greedy transformers generate of exactly n new tokens over batch (prompt
    id arrays of one length) on device (synchronised around the call on cuda)."""
    import torch

    ids = torch.tensor(np.stack(batch).astype(np.int64), device=device)
    with torch.no_grad():
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        m.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=n,
            min_new_tokens=n,
            do_sample=False,
            pad_token_id=0,
        )
        if device == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t0


def bench_transformers(
    folder: Path, prompts, new_tokens: int, streams: list[int], threads: int
) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(threads)
    m = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()

    def gen(batch, n):
        return _hf_generate_s(m, batch, n, "cpu")

    gen(prompts[:1], 2)
    t1 = [gen(prompts[:1], 1) for _ in range(3)]
    tn = [gen(prompts[:1], new_tokens) for _ in range(2)]
    by = {}
    for n in streams:
        ts = gen([prompts[i % len(prompts)] for i in range(n)], new_tokens)
        by[str(n)] = {"streams": n, "tokens": n * new_tokens, "tokens_per_s": n * new_tokens / ts}
    return {
        "ttft_ms": 1e3 * float(np.median(t1)),
        "decode_ms_per_token": 1e3
        * (float(np.median(tn)) - float(np.median(t1)))
        / (new_tokens - 1),
        **_largest(by),
        "torch": torch.__version__,
    }


def bench_zoi_cuda(
    folder: Path, precision: str, prompts, new_tokens: int, streams: list[int], rounds: int = 3
) -> dict:
    """The GPU decoder (CudaDecoderBackend through compile_decoder(device="cuda")), one backend
    for every figure (decode buckets up to max(streams), each a CUDA graph): batch 1 through
    step() (`rounds` timed after one warm-up round, which compiles the prefill kernels of this
    length), then per streams count two runs of n prompts admitted together (the first warms
    up; the second is reported)."""
    from zoi.decoder.api import SamplingParams
    from zoi.decoder.compile import compile_decoder

    P = len(prompts[0])
    L = P + new_tokens
    nmax = max(streams)
    t0 = time.perf_counter()
    g = compile_decoder(
        folder,
        device="cuda",
        precision=precision,
        max_seq_len=L + 8,
        max_batch=nmax,
        kv_blocks=nmax * (-(-(L + 8) // 16)) + 1,
        max_tokens=nmax * P,  # every stream's prompt in one packed prefill
    )
    be = g.backend
    build_s = time.perf_counter() - t0
    p = SamplingParams(max_new_tokens=new_tokens, ignore_eos=True)
    sid = iter(range(1 << 30))
    ttft, steps = [], []
    for r in range(rounds + 1):
        be.add(next(sid), prompts[r % len(prompts)], p)
        t0 = time.perf_counter()
        be.step()  # prefill + the first token
        t = time.perf_counter() - t0
        st = []
        while be.pool().running:
            t0 = time.perf_counter()
            be.step()
            st.append(time.perf_counter() - t0)
        if r:
            ttft.append(t)
            steps += st
    row = {
        "ttft_ms": 1e3 * float(np.median(ttft)),
        "decode_ms_per_token": 1e3 * float(np.median(steps)),
        "decode_ms_p90": 1e3 * float(np.percentile(steps, 90)),
    }
    ctx = P + new_tokens // 2  # the mean context of a run
    if be.use_graphs:
        row["time_decode_graph_us_b1"] = be.time_decode_graph(1, ctx)
    by = {}
    for n in streams:
        for _ in range(2):
            for i in range(n):
                be.add(next(sid), prompts[i % len(prompts)], p)
            t0 = time.perf_counter()
            toks = len(be.step())  # every prefill (packed) and each stream's first token
            t1 = time.perf_counter()
            while be.pool().running:
                toks += len(be.step())
            t2 = time.perf_counter()
        by[str(n)] = {
            "streams": n,
            "tokens": toks,
            "ttft_ms_all_prefills": 1e3 * (t1 - t0),
            "tokens_per_s": toks / (t2 - t0),
            "decode_tokens_per_s": (toks - n) / (t2 - t1),
            "decode_step_ms": 1e3 * (t2 - t1) / max(1, new_tokens - 1),
        }
        if be.use_graphs:
            by[str(n)]["time_decode_graph_us"] = be.time_decode_graph(n, ctx)
    row.update(_largest(by))
    row["decode_tokens_per_s_streams"] = row["by_streams"][str(row["streams"])][
        "decode_tokens_per_s"
    ]
    row.update(
        precision=precision,
        device=be.device_name,
        graphs=be.use_graphs,
        build_s=build_s,
        memory=be.memory(),
    )
    return row


def bench_transformers_cuda(folder: Path, prompts, new_tokens: int, streams: list[int]) -> dict:
    """transformers generate on the GPU: the same checkpoint, FP16, static cache, greedy. TTFT:
    max_new_tokens=1; batch-1 per token: (t(new_tokens) - t(1)) / (new_tokens - 1); tokens/s per
    streams count (prefill included). Every shape runs twice untimed first (compiles)."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float16).to("cuda").eval()
    m.generation_config.cache_implementation = "static"
    # generate compiles the forward itself when the cache is compileable (static): wrapping
    # model.forward in torch.compile(mode="reduce-overhead") by hand made the H200 run fail
    # ("accessing tensor output of CUDAGraphs that has been overwritten by a subsequent run":
    # generate keeps step i's logits past step i+1); transformers' own compiled call marks
    # the CUDA-graph steps

    def gen(batch, n) -> float:
        return _hf_generate_s(m, batch, n, "cuda")

    def timed(batch, n, reps: int) -> float:
        for _ in range(2):  # compile, then once more (a recompile with dynamic shapes)
            gen(batch, n)
        return float(np.median([gen(batch, n) for _ in range(reps)]))

    t1 = timed(prompts[:1], 1, 3)
    tn = timed(prompts[:1], new_tokens, 3)
    by = {}
    for n in streams:
        ts = timed([prompts[i % len(prompts)] for i in range(n)], new_tokens, 2)
        by[str(n)] = {"streams": n, "tokens": n * new_tokens, "tokens_per_s": n * new_tokens / ts}
    return {
        "ttft_ms": 1e3 * t1,
        "decode_ms_per_token": 1e3 * (tn - t1) / (new_tokens - 1),
        **_largest(by),
        "device": torch.cuda.get_device_name(),
        "peer": f"transformers {transformers.__version__} torch {torch.__version__} fp16 "
        "static cache (generate compiles the decode step)",
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


def cuda_missing(provider: str) -> str | None:
    """Why a GPU provider cannot run here (None: it can). zoi-cuda-* runs through the Triton
    interpreter under TRITON_INTERPRET=1 (the CPU test)."""
    if provider.startswith("zoi-") and os.environ.get("TRITON_INTERPRET") == "1":
        return None
    try:
        import torch
    except ImportError as e:
        return f"not installed: {e}"
    if not torch.cuda.is_available():
        return "no CUDA GPU visible to torch (device='cuda'; run on a GPU machine)"
    return None


def select(patterns: list[str] | None, devices: set[str]) -> list[str]:
    """The providers of `devices` matching the fnmatch patterns (all of them when None)."""
    import fnmatch

    own = [p for p in PROVIDERS if device_of(p) in devices]
    if not patterns:
        return own
    patterns = [PROVIDER_ALIASES.get(p, p) for p in patterns]
    return [p for p in own if any(fnmatch.fnmatch(p, pat) for pat in patterns)]


def targets(rows: list[dict]) -> dict:
    """The decoder's GPU targets, from this run's rows (None: a row is missing or failed)."""

    def row(wl, pv):
        return next(
            (r for r in rows if r["workload"] == wl and r["provider"] == pv and "error" not in r),
            None,
        )

    wl, pv, bound = TARGET_B1
    r = row(wl, pv)
    lat = r and r["decode_ms_per_token"]
    wl2, ours, peer, n, ratio = TARGET_X32
    a, b = row(wl2, ours), row(wl2, peer)
    ta = a and a["by_streams"].get(str(n), {}).get("tokens_per_s")
    tb = b and b["by_streams"].get(str(n), {}).get("tokens_per_s")
    return {
        f"{wl} {pv} batch-1 decode <= {bound:.2f} ms": None
        if lat is None
        else {"ms": round(lat, 4), "met": lat <= bound},
        f"{wl2} {ours} x{n} >= {ratio:g}x {peer}": None
        if not (ta and tb)
        else {
            "ratio": round(ta / tb, 2),
            "tokens_per_s": round(ta, 1),
            "peer_tokens_per_s": round(tb, 1),
            "met": ta / tb >= ratio,
        },
    }


def _free() -> None:
    """Release a GPU provider's memory before the next one (they share this process)."""
    import gc

    gc.collect()
    if "torch" in sys.modules:
        try:
            import torch

            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        except Exception:  # noqa: BLE001 - best effort
            pass


def run(
    workloads: list[str],
    providers: list[str] | None = None,
    threads: int = 2,
    prompt_len: int = 128,
    new_tokens: int | None = None,
    streams: list[int] | dict | None = None,
    cache: Path | None = None,
    out: Path | None = None,
    devices: set[str] | None = None,
    command: str | None = None,
) -> dict:
    """Every (workload, provider) pair as one row; a provider that fails (or cannot run here)
    gives a row with `error`, the others still run. `streams`: counts for every provider, or
    {device: counts}; default STREAMS. The JSON is rewritten after each row (a run cut short by a
    timeout keeps what it measured)."""
    from zoi.bench.models import default_cache_dir
    from zoi.bench.sysinfo import cpu_info, gpu_info, loadavg, versions

    cache = Path(cache or default_cache_dir())
    bad = [w for w in workloads if w not in WORKLOADS]
    if bad:
        raise ValueError(f"unknown decode workload(s) {bad}; known: {sorted(WORKLOADS)}")
    provs = [PROVIDER_ALIASES.get(p, p) for p in providers or CPU_PROVIDERS]
    devices = set(devices or {device_of(p) for p in provs if p in PROVIDERS} or {"cpu"})
    if new_tokens is None:
        new_tokens = max(NEW_TOKENS[d] for d in devices)
    if new_tokens < 2:
        raise ValueError(
            "new_tokens must be >= 2 (the per-token figure is of steps after the first)"
        )
    if not isinstance(streams, dict):
        streams = {d: list(streams or STREAMS[d]) for d in sorted(devices)}
    streams = {d: sorted(set(int(n) for n in v)) for d, v in streams.items()}
    if any(n < 1 for v in streams.values() for n in v):
        raise ValueError(f"streams must be >= 1, not {streams}")
    res = {
        "kind": "decode",
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": command,
        "devices": sorted(devices),
        "cpu": cpu_info(),
        "gpu": gpu_info() if "cuda" in devices else None,
        "versions": versions(),
        "triton_interpret": os.environ.get("TRITON_INTERPRET") == "1",
        "threads": threads,
        "prompt_len": prompt_len,
        "new_tokens": new_tokens,
        "streams": streams,
        "precision_words": PRECISION_WORDS,
        "loadavg_before": loadavg(),
        "rows": [],
    }
    why = {}  # provider -> why it cannot run here
    for pv in provs:
        if pv not in PROVIDERS:
            why[pv] = f"unknown provider {pv!r}; known: {', '.join(PROVIDERS)}"
        elif device_of(pv) == "cuda":
            why[pv] = cuda_missing(pv)
    out = Path(out) if out is not None else None

    def save():
        if out is not None:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(res, indent=1))

    for wl in workloads:
        folder = prompts = None
        for pv in provs:
            t0 = time.time()
            la = loadavg()
            try:
                if why.get(pv):
                    raise RuntimeError(why[pv])
                if folder is None:  # written only when a provider can run
                    folder = model_folder(WORKLOADS[wl], cache)
                    cfg = json.loads((folder / "config.json").read_text())
                    n_prompts = max(n for v in streams.values() for n in v)
                    prompts = _prompts(cfg["vocab_size"], n_prompts, prompt_len)
                ns = streams.get(device_of(pv)) or STREAMS[device_of(pv)]
                if pv.startswith("zoi-cuda-"):
                    r = bench_zoi_cuda(folder, pv.split("-")[2], prompts, new_tokens, ns)
                elif pv == "transformers-cuda-fp16":
                    r = bench_transformers_cuda(folder, prompts, new_tokens, ns)
                elif pv.startswith("zoi-"):
                    r = bench_zoi(folder, pv.split("-")[1], prompts, new_tokens, ns, threads)
                elif pv == "transformers-fp32":
                    r = bench_transformers(folder, prompts, new_tokens, ns, threads)
                elif pv == "llamacpp-q8_0":
                    r = bench_llamacpp(folder, cache, prompts, new_tokens, threads)
                else:  # pragma: no cover - `why` caught it
                    raise ValueError(f"unknown provider {pv!r}")
            except ImportError as e:
                r = {"error": f"not installed: {e}"}
            except Exception as e:  # one provider failing does not end the run; the row says why
                r = {"error": f"{type(e).__name__}: {e}"}
            r.update(
                workload=wl,
                provider=pv,
                device=r.get("device", device_of(pv) if pv in PROVIDERS else None),
                wall_s=round(time.time() - t0, 1),
                loadavg_at_start=la,
            )
            res["rows"].append(r)
            if device_of(pv) == "cuda":
                _free()
            print(
                json.dumps(
                    {
                        k: (round(v, 3) if isinstance(v, float) else v)
                        for k, v in r.items()
                        if k not in ("system", "memory", "by_streams")
                    }
                ),
                flush=True,
            )
            save()
    if "cuda" in devices:
        res["targets"] = targets(res["rows"])
        print(json.dumps({"targets": res["targets"]}), flush=True)
    res["loadavg_after"] = loadavg()
    save()
    if out is not None:
        print(out)
    return res


def devices_of(device: str) -> set[str]:
    """`zoi bench --device` as a set (auto: the CPU, plus CUDA when torch sees a GPU)."""
    if device == "auto":
        from zoi.bench.harness import cuda_available

        return {"cpu", "cuda"} if cuda_available() else {"cpu"}
    if device == "all":
        return {"cpu", "cuda"}
    return {device}


def _ints(tokens) -> list[int] | None:
    """--streams 8 32 / --streams 8,32."""
    if not tokens:
        return None
    return [int(x) for t in tokens for x in str(t).split(",") if x.strip()]


def run_from_args(args) -> int:
    devices = devices_of(getattr(args, "device", "cpu") or "cpu")
    provs = select(args.providers, devices)
    if not provs:
        known = ", ".join(f"{p} ({device_of(p)})" for p in PROVIDERS)
        print(
            f"zoi bench: no decode provider matches {args.providers} on --device "
            f"{getattr(args, 'device', 'cpu')} ({', '.join(sorted(devices))}); known: {known}",
            file=sys.stderr,
        )
        return 2
    quick = getattr(args, "quick", False)
    out = args.out
    if out is None:
        d = args.out_dir or Path(os.environ.get("ZOI_BENCH_OUT", "bench/results"))
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        kind = "_".join(sorted(devices))
        out = Path(d) / f"{stamp}_{kind}_decode{'_quick' if quick else ''}.json"
    argv = getattr(args, "_argv", None)
    try:
        res = run(
            args.workloads,
            provs,
            threads=args.threads,
            prompt_len=getattr(args, "prompt_len", None) or (32 if quick else 128),
            new_tokens=getattr(args, "new_tokens", None) or (32 if quick else None),
            streams=_ints(getattr(args, "streams", None)),
            cache=args.cache_dir,
            out=out,
            devices=devices,
            command=" ".join(
                ["zoi", "bench", *argv] if argv is not None else ["zoi", *sys.argv[1:]]
            ),
        )
    except ValueError as e:
        print(f"zoi bench: {e}", file=sys.stderr)
        return 2
    return 0 if any("error" not in r for r in res["rows"]) else 1
