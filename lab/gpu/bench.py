"""GPU benchmark: zoi's CudaBackend against the PyTorch peers of ../shared/BENCHMARKS.md,
in one process, on the same inputs (random token ids from the vocabulary), on a random-init
BERT checkpoint built with transformers (no download on the device machine).

    python lab/gpu/bench.py --out bench/results/gpu_bench.json [--quick]

Latency is host-observed: token ids in host memory -> pooled, L2-normalised embeddings in
host memory, per call; p50 / p99 over >= 200 calls after warm-up (>= 20 above 100 ms).
Also: device-only time of a graph replay, per-kernel times of one bucket, the INT8 GEMM
kernel's TOP/s, memory, and accuracy (cosine against PyTorch FP32 eager).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

SHAPES = {
    "minilm": dict(
        cfg=dict(
            hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536
        ),
        shapes=[(1, 16), (1, 128), (8, 128), (32, 128), (256, 128)],
    ),
    "bert-base": dict(
        cfg=dict(
            hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072
        ),
        shapes=[(1, 128), (32, 128), (256, 128)],
    ),
}


def _pct(ts):
    a = np.asarray(ts) * 1e6
    return {
        "p50_us": float(np.percentile(a, 50)),
        "p99_us": float(np.percentile(a, 99)),
        "mean_us": float(a.mean()),
        "n": int(len(a)),
    }


def timed(fn, min_calls=200, warm=10):
    for _ in range(warm):
        fn()
    t0 = time.perf_counter()
    fn()
    one = time.perf_counter() - t0
    n = 20 if one > 0.1 else max(min_calls, int(min(2000, 1.0 / max(one, 1e-6))))
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return _pct(ts)


def build_hf(name: str, folder: str, seed: int = 0):
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(seed)
    cfg = BertConfig(
        vocab_size=30522,
        max_position_embeddings=512,
        type_vocab_size=2,
        hidden_act="gelu",
        layer_norm_eps=1e-12,
        **SHAPES[name]["cfg"],
    )
    model = BertModel(cfg, add_pooling_layer=False).eval()
    # BERT's init (std 0.02) gives near-constant LN inputs; widen it a little so that the
    # activations have the spread of a trained model's (outliers included)
    with torch.no_grad():
        for n_, p in model.named_parameters():
            if p.dim() == 2 and "embeddings" not in n_:
                p.normal_(0, 1.0 / p.shape[1] ** 0.5)
    model.save_pretrained(folder, safe_serialization=True)
    return model


def quantize_linears(weights, scheme="dynamic_asym"):
    """INT8 linears with the structure of zoi.quant's default artifact (no calibration: random
    weights): per-token asymmetric activations, and SmoothQuant act_mul on qkv / ffn1 / ffn2
    (the o projection's folds into V, as in zoi.quant), W' = W / act_mul so that the product
    is unchanged. The kernels run exactly as for a calibrated artifact. scheme="dynamic": the
    symmetric scheme without transforms (the GPU's only scheme before the port)."""
    from zoi.graph.compiled import LinearQuant
    from zoi.numerics import primitives as qp

    rng = np.random.default_rng(5)
    out, quant = dict(weights), {}
    for k in list(weights):
        if k.endswith(".w") and k.split(".")[1] in ("qkv", "o", "ffn1", "ffn2"):
            p = k[:-2]
            w = np.asarray(out.pop(k), np.float32)
            if scheme == "dynamic_asym" and k.split(".")[1] != "o":
                m = rng.uniform(0.5, 2.0, w.shape[1]).astype(np.float32)
                out[f"{p}.act_mul"] = m
                w = w / m[None, :]
            out[f"{p}.w_q"], out[f"{p}.w_scale"] = qp.quantize_weight(w)
            quant[p] = LinearQuant(scheme)
    return out, quant


def zoi_model(folder, precision, max_tokens, max_batch, scheme="dynamic_asym"):
    from zoi.frontend.checkpoint import load_spec, load_weights
    from zoi.graph.compiled import CompiledModel

    spec = load_spec(folder).replace(pooling="mean", normalize=True)
    w = load_weights(Path(folder), spec)
    quant = {}
    if precision == "int8":
        w, quant = quantize_linears(w, scheme)
    elif precision == "fp8":  # nothing to calibrate: both scales dynamic (zoi.quant.fp8)
        from zoi.quant.fp8 import fp8_quant

        quant = fp8_quant(spec)
    return CompiledModel.build(spec, w, precision, max_tokens, max_batch, quant)


def run_chunks(be, flat, pos, cu, normalize=True):
    """be.run over whole sequences in chunks of at most be.max_tokens tokens / max_batch
    sequences (what Engine.run_packed does), for engines smaller than the call."""
    B, out, i = len(cu) - 1, [], 0
    while i < B:
        j = i + 1
        while j < B and j - i < be.max_batch and cu[j + 1] - cu[i] <= be.max_tokens:
            j += 1
        a, b = int(cu[i]), int(cu[j])
        out.append(be.run(flat[a:b], pos[a:b], cu[i : j + 1] - cu[i], normalize))
        i = j
    return out[0] if len(out) == 1 else np.concatenate(out)


def inputs(rng, B, S, V=30522):
    ids = rng.integers(1000, V, size=(B, S)).astype(np.int32)
    ids[:, 0], ids[:, -1] = 101, 102
    pos = np.tile(np.arange(S, dtype=np.int32), B)
    cu = (np.arange(B + 1) * S).astype(np.int32)
    return ids, pos, cu


class TorchPeer:
    """HF BertModel + mean pooling + L2 normalise, host ids -> host embeddings."""

    def __init__(self, model, dtype, B, S, graph=False, compiled=False):
        import torch

        self.torch = torch
        self.m = model.to("cuda", dtype).eval()
        self.B, self.S = B, S
        self.ids = torch.zeros((B, S), dtype=torch.long, device="cuda")
        self.mask = torch.ones((B, S), dtype=torch.long, device="cuda")
        self.h_ids = torch.zeros((B, S), dtype=torch.long).pin_memory()
        fwd = self._fwd
        if compiled:
            fwd = torch.compile(self._fwd, mode="reduce-overhead")
        self.fwd = fwd
        self.graph = None
        if graph:
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s), torch.no_grad():
                for _ in range(3):
                    self.out = self._fwd()
            torch.cuda.current_stream().wait_stream(s)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph), torch.no_grad():
                self.out = self._fwd()

    def _fwd(self):
        torch = self.torch
        h = self.m(input_ids=self.ids, attention_mask=self.mask).last_hidden_state
        m = self.mask.unsqueeze(-1).to(h.dtype)
        p = (h * m).sum(1) / m.sum(1)
        return torch.nn.functional.normalize(p.float(), dim=-1)

    def __call__(self, ids_np):
        torch = self.torch
        self.h_ids.copy_(torch.from_numpy(ids_np))
        self.ids.copy_(self.h_ids, non_blocking=True)
        with torch.no_grad():
            if self.graph is not None:
                self.graph.replay()
                out = self.out
            else:
                out = self.fwd()
        return out.cpu().numpy()


def cos_stats(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    c = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    return {"mean": float(c.mean()), "min": float(c.min())}


def graph_only_us(be, tb, reps=50):
    """Device time of one forward: back-to-back graph launches, one sync (no host in the loop)."""
    cu, chk = be._cu, be.drv.check
    chk(cu.cuStreamSynchronize(be.stream))
    t0 = time.perf_counter()
    for _ in range(reps):
        chk(cu.cuGraphLaunch(be._graphs[tb][1], be.stream))
    chk(cu.cuStreamSynchronize(be.stream))
    return (time.perf_counter() - t0) / reps * 1e6


def kernel_times(be, tb, reps=20):
    """Per-launch device time: each launch captured `reps` times in its own graph (driver API,
    as the backend captures), median over replays, divided by reps (the one launch + sync per
    replay adds < 0.5 us per kernel)."""
    drv, cu = be.drv, be._cu
    out = []
    import gc

    gc.collect()
    for L, step in zip(be.plan_for(tb)["launches"], be._steps[tb], strict=True):
        gc.disable()
        drv.begin_capture(be.stream)
        try:
            with be.torch.cuda.stream(be.tstream):
                for _ in range(reps):
                    step()
        finally:
            graph, gexec, _ = drv.end_capture(be.stream)
            gc.enable()
        ts = []
        for i in range(13):
            t0 = time.perf_counter()
            drv.check(cu.cuGraphLaunch(gexec, be.stream))
            drv.check(cu.cuStreamSynchronize(be.stream))
            if i >= 3:
                ts.append(time.perf_counter() - t0)
        drv.check(cu.cuGraphExecDestroy(gexec))
        drv.check(cu.cuGraphDestroy(graph))
        name = L.kind
        if L.kind == "linear":
            name += f" {L.extra['prefix'].split('.', 1)[1]} {'int8' if L.quant else 'fp16'} N={L.n} K={L.k}"
        out.append({"launch": name, "us": float(np.median(ts)) / reps * 1e6})
    return out


def gemm_bench():
    """The INT8 linear kernel (QUANT 4: int8 A; QUANT 1: fp16 A quantised on load) vs torch._int_mm."""
    import torch
    import triton.testing as tt

    from zoi.backends.cuda.kernels import linear as k_lin

    res = []
    big = dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=128, GROUP_M=8, num_warps=8, num_stages=3)
    cases = [("8192^3", 8192, 8192, 8192, 4, big)]
    T = 256 * 128
    for nm, N, K in (("qkv", 1152, 384), ("o", 384, 384), ("ffn1", 1536, 384), ("ffn2", 384, 1536)):
        cases.append((f"minilm 256x128 {nm}", T, N, K, 4, None))  # int8 A (as qkv / ffn1 run now)
        cases.append(
            (f"minilm 256x128 {nm}", T, N, K, 1, None)
        )  # fp16 A quantised on load (o / ffn2)
    for label, M, N, K, quant, cfg in cases:
        a8 = torch.randint(-127, 128, (M, K), dtype=torch.int8, device="cuda")
        a16 = torch.randn((M, K), dtype=torch.float16, device="cuda")
        # QUANT 1 reads the row amax, QUANT 4 the row a_scale (amax / 127)
        amax = a16.abs().amax(1).float() if quant == 1 else torch.ones((M,), device="cuda")
        w = torch.randint(-127, 128, (N, K), dtype=torch.int8, device="cuda")
        ws = torch.rand(N, device="cuda") * 0.01
        b = torch.zeros(N, device="cuda")
        y = torch.empty((M, N), dtype=torch.float16, device="cuda")
        a = a8 if quant == 4 else a16
        fn = functools.partial(
            k_lin.launch_linear,
            a,
            amax,
            w,
            ws,
            b,
            None,
            y,
            None,
            M,
            N,
            K,
            quant=quant,
            cfg=cfg,
        )
        ms = tt.do_bench(fn, warmup=25, rep=100, return_mode="median")
        row = {
            "shape": label,
            "M": M,
            "N": N,
            "K": K,
            "a": "int8" if quant == 4 else "fp16->int8 on load",
            "cfg": cfg or k_lin.pick_config(M, N, K, True),
            "us": ms * 1e3,
            "TOPs": 2 * M * N * K / ms / 1e9,
        }
        if quant == 4:
            ms2 = tt.do_bench(
                functools.partial(torch._int_mm, a8, w.t()),
                warmup=25,
                rep=100,
                return_mode="median",
            )
            row["torch_int_mm_TOPs"] = 2 * M * N * K / ms2 / 1e9
        res.append(row)
        c = row["cfg"]
        print(
            f"gemm {label:24s} {row['a']:18s} {c['BLOCK_M']}x{c['BLOCK_N']}x{c['BLOCK_K']} w{c['num_warps']}"
            f"s{c['num_stages']} {row['us']:9.1f} us {row['TOPs']:7.1f} TOP/s"
            + (
                f"  (torch._int_mm {row['torch_int_mm_TOPs']:.0f})"
                if "torch_int_mm_TOPs" in row
                else ""
            ),
            flush=True,
        )
        del a8, a16, w, y
    try:  # is it IGMMA? look for wgmma in the PTX of the compiled big-tile kernel
        kern = k_lin.linear_kernel
        ptx = [v.asm.get("ptx", "") for c in kern.device_caches.values() for v in c[0].values()]
        res.append({"wgmma_in_ptx": [("wgmma" in p) for p in ptx]})
    except Exception as e:  # noqa: BLE001
        res.append({"wgmma_in_ptx": f"unknown ({e})"})
    return res


def _write(path, result):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(result, f, indent=1, default=str)


def sanitize():
    """One small forward per precision, for compute-sanitizer (memcheck / racecheck)."""
    from zoi.backends.cuda.backend import CudaBackend
    from zoi.backends.cuda.options import CudaOptions

    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as d:
        build_hf("minilm", d)
        # every path: per-op INT8 (default artifact structure) and FP16 graphs, and the
        # persistent one-launch FP16 forward (forced, not timed: the sanitizer slows both)
        for prec, path in (("int8", "per-op"), ("fp16", "per-op"), ("fp16", "persistent")):
            opts = CudaOptions(persistent="force" if path == "persistent" else "off")
            m = zoi_model(d, prec, max_tokens=128, max_batch=8)
            be = CudaBackend(m, buckets=[128], options=opts)
            assert be.memory()["bucket_paths"][128]["path"] == path
            ids, pos, cu = inputs(rng, 2, 37)
            out = be.run(ids.reshape(-1), pos, cu, True)
            print(prec, path, "forward ok:", out.shape, bool(np.isfinite(out).all()), flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench/results/gpu_bench.json")
    ap.add_argument("--quick", action="store_true", help="minilm 1x128 and 32x128 only")
    ap.add_argument(
        "--compile-shapes",
        default="",
        help="shapes that also get the torch.compile reduce-overhead peer, e.g. minilm:1x128",
    )
    ap.add_argument("--models", default="minilm,bert-base")
    ap.add_argument("--shapes", default="", help="only these shapes, e.g. 256x128,1x128")
    ap.add_argument(
        "--max-tokens",
        type=int,
        default=0,
        help="cap the engines' max_tokens (bigger calls run in chunks): the memory/speed trade",
    )
    ap.add_argument(
        "--precisions", default="int8,fp16", help="zoi engines to time: int8, fp16, fp8 (sm_89+)"
    )
    ap.add_argument("--no-gemm", action="store_true")
    ap.add_argument("--no-variants", action="store_true")
    ap.add_argument(
        "--sanitize", action="store_true", help="one small forward (for compute-sanitizer)"
    )
    args = ap.parse_args(argv)
    if args.sanitize:
        return sanitize()

    import torch
    import triton

    from zoi.backends.cuda.backend import CudaBackend

    rng = np.random.default_rng(0)
    result = {
        "machine": {
            "gpu": torch.cuda.get_device_name(),
            "host": platform.node(),
            "python": sys.version.split()[0],
            "torch": torch.__version__,
            "triton": triton.__version__,
            "note": "lent H200, scripts/gpu_check.sh",
        },
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "rows": [],
        "kernels": {},
    }
    try:
        import cuda.bindings

        result["machine"]["cuda_bindings"] = cuda.bindings.__version__
    except Exception:  # noqa: BLE001
        pass
    if not args.no_gemm:
        result["gemm"] = gemm_bench()
        _write(args.out, result)
    for name in args.models.split(","):
        shapes = SHAPES[name]["shapes"]
        if args.quick:
            shapes = [s for s in shapes if s in ((1, 128), (32, 128))]
        if args.shapes:
            shapes = [s for s in shapes if f"{s[0]}x{s[1]}" in args.shapes.split(",")]
        cap = args.max_tokens or max(b * s for b, s in shapes)
        with tempfile.TemporaryDirectory() as d:
            hf = build_hf(name, d)
            engines = {}
            variants = [(p_, p_, {}) for p_ in args.precisions.split(",")]
            if name == "minilm" and not args.no_variants:
                variants += [
                    ("int8 sym", "int8", dict(scheme="dynamic")),
                    ("int8 no-pdl", "int8", dict(pdl=False)),
                ]
            for prec, mprec, kw in variants:
                t0 = time.perf_counter()
                kw = dict(kw)
                scheme = kw.pop("scheme", "dynamic_asym")
                m = zoi_model(d, mprec, max_tokens=cap, max_batch=256, scheme=scheme)
                buckets = sorted({min(b * s, cap) for b, s in shapes})
                torch.cuda.synchronize()
                r0 = torch.cuda.memory_reserved()
                engines[prec] = CudaBackend(m, buckets=buckets, **kw)
                mem = engines[prec].memory()
                mem["build_s"] = time.perf_counter() - t0
                result["rows"].append(
                    {
                        "model": name,
                        "provider": f"zoi {prec}",
                        "memory": mem,
                        "torch_reserved_delta": torch.cuda.memory_reserved() - r0,
                    }
                )
                print(
                    f"{name} zoi {prec}: built in {mem['build_s']:.1f}s, weights {mem['weights_bytes'] / 1e6:.1f} MB, "
                    f"arena {mem['arena_bytes'] / 1e6:.1f} MB, device used {mem['device_bytes_used'] / 1e6:.1f} MB, "
                    f"torch reserved +{mem['torch_reserved_bytes'] / 1e6:.1f} MB, "
                    f"kernels/forward {mem['kernels_per_forward']}",
                    flush=True,
                )
            for B, S in shapes:
                ids, pos, cu = inputs(rng, B, S)
                flat = ids.reshape(-1)
                ref32 = TorchPeer(hf, torch.float32, B, S)
                want = ref32(ids)
                row_ref = {
                    "model": name,
                    "shape": f"{B}x{S}",
                    "provider": "torch eager fp32",
                    **timed(functools.partial(ref32, ids)),
                }
                result["rows"].append(row_ref)
                del ref32
                torch.cuda.empty_cache()
                peers = [
                    ("torch eager fp16", dict()),
                    ("torch fp16 + cuda graph", dict(graph=True)),
                ]
                if f"{name}:{B}x{S}" in args.compile_shapes.split(","):
                    peers.append(("torch.compile reduce-overhead fp16", dict(compiled=True)))
                for pname, kw in peers:
                    import copy

                    torch.cuda.synchronize()
                    a0 = torch.cuda.memory_allocated()
                    torch.cuda.reset_peak_memory_stats()
                    p = TorchPeer(copy.deepcopy(hf).cpu(), torch.float16, B, S, **kw)
                    got = p(ids)
                    row = {
                        "model": name,
                        "shape": f"{B}x{S}",
                        "provider": pname,
                        **timed(functools.partial(p, ids)),
                        "cos_vs_fp32": cos_stats(got, want),
                        "torch_peak_allocated_bytes": torch.cuda.max_memory_allocated() - a0,
                    }
                    result["rows"].append(row)
                    del p
                    torch.cuda.empty_cache()
                for prec, be in engines.items():
                    if " " in prec and B * S > 4096:
                        continue
                    got = run_chunks(be, flat, pos, cu, True)
                    tb = next(b for b in be.buckets if b >= min(B * S, be.max_tokens))
                    row = {
                        "model": name,
                        "shape": f"{B}x{S}",
                        "provider": f"zoi {prec}",
                        **timed(functools.partial(run_chunks, be, flat, pos, cu, True)),
                        "graph_only_us": graph_only_us(be, tb),
                        "cos_vs_fp32": cos_stats(got, want),
                        "bucket": tb,
                        "chunks": -(-B * S // be.max_tokens),
                    }
                    result["rows"].append(row)
                    if (
                        prec == "int8"
                        and (B, S) in ((1, 16), (1, 128), (32, 128), (256, 128))
                        and B * S <= be.max_tokens
                    ):
                        kt = kernel_times(be, tb)
                        result["kernels"][f"{name} {B}x{S} {prec}"] = kt
                        agg = {}
                        for k in kt:
                            key = (
                                k["launch"]
                                .split(" N=")[0]
                                .replace(" int8", "")
                                .replace(" fp16", "")
                            )
                            agg[key] = agg.get(key, 0.0) + k["us"]
                        print(
                            f"  kernels {name} {B}x{S} {prec} (sum {sum(k['us'] for k in kt):.1f} us): "
                            + ", ".join(f"{k} {v:.1f}" for k, v in agg.items()),
                            flush=True,
                        )
                _write(args.out, result)
                n_rows = 1 + len(peers) + sum(1 for p_ in engines if " " not in p_ or B * S <= 4096)
                for r in result["rows"][-n_rows:]:
                    if "p50_us" in r:
                        print(
                            f"{name:9s} {B:3d}x{S:<4d} {r['provider']:36s} p50 {r['p50_us']:9.1f} us  "
                            f"p99 {r['p99_us']:9.1f} us"
                            + (
                                f"  graph {r['graph_only_us']:8.1f} us"
                                if "graph_only_us" in r
                                else ""
                            )
                            + (
                                f"  cos mean {r['cos_vs_fp32']['mean']:.5f} min {r['cos_vs_fp32']['min']:.5f}"
                                if "cos_vs_fp32" in r
                                else ""
                            ),
                            flush=True,
                        )
            del engines
            torch.cuda.empty_cache()
        _write(args.out, result)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1, default=str)
    print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
