"""End-to-end A/B of kernel configurations: the same model, the same ids, in one process.

    python lab/gpu/e2e_ab.py --out $OUT/e2e.json [--models minilm] [--shapes 32x128,256x128]

"v1" builds the CudaBackend with the tile configurations of lab/gpu/configs_v1.py (the picks
before the sweep), "new" with the kernels' current pick_config; "new+mod+..." variants switch
CudaOptions (MODS below); both INT8 (the default artifact's structure: asym + act_mul,
bench.quantize_linears) and FP16; plus PyTorch FP16 + CUDA graph as the peer. Host-observed
latency (ids in host memory -> normalised embeddings in host memory, p50 over >= 200 calls) in
alternating rounds (v1, new, v1, new, ...), device time of one graph replay, and per-launch
device times summed by kind (bench.kernel_times). The runs of 2026-12-01 / 12-03 also timed
LN fused into o / ffn2 (v1 then), ffn1 writing ffn2's int8 copy ("rowq") and the quantize
launch folded into the GEMM ("fold"); all lost and left the backend (NOTES.md).
minilm uses the real all-MiniLM-L6-v2 (FP16 copy) when ZOI_MINILM_DIR names it, else random init.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
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

import configs_v1  # noqa: E402

# "new+mod+mod" variants for the small buckets: programmatic dependent launch at every bucket,
# per-op graphs only
MODS = {
    "pdl": dict(pdl_max_tokens=1 << 20),
    "perop": dict(persistent="off"),
}


def variant_mods(var: str) -> dict:
    """The CudaOptions overrides of a variant name such as "new+pdl+perop"."""
    kw: dict = {}
    for m in var.split("+")[1:]:
        if m not in MODS:
            raise SystemExit(f"unknown variant modifier {m!r} (known: {sorted(MODS)})")
        kw.update(MODS[m])
    return kw


@contextlib.contextmanager
def v1_configs():
    """Patch the kernels' pick_config with the v1 ones while an engine is built (the configs
    are fixed into the captured graphs at build time)."""
    from zoi.backends.cuda.kernels import attention as k_attn
    from zoi.backends.cuda.kernels import layernorm as k_ln
    from zoi.backends.cuda.kernels import linear as k_lin
    from zoi.backends.cuda.kernels import quantize as k_q

    saved = (k_lin.pick_config, k_attn.pick_config, k_q.pick_config, k_ln.pick_config)
    k_lin.pick_config = lambda M, N, K, quant, **kw: configs_v1.linear(M, N, K, quant, False)
    k_attn.pick_config = lambda T, D, **kw: configs_v1.attention(T, D)
    k_q.pick_config = lambda K, *a, **kw: configs_v1.quantize(K)
    k_ln.pick_config = lambda H, *a, **kw: configs_v1.layernorm(H)
    try:
        yield
    finally:
        k_lin.pick_config, k_attn.pick_config, k_q.pick_config, k_ln.pick_config = saved


def agg_kernels(kt):
    agg = {}
    for k in kt:
        name = k["launch"].split(" N=")[0].replace(" int8", "").replace(" fp16", "")
        agg[name] = agg.get(name, 0.0) + k["us"]
    return agg


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="gpu_out/e2e.json")
    ap.add_argument("--models", default="minilm")
    ap.add_argument("--shapes", default="32x128,256x128")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--variants", default="v1,new")
    ap.add_argument("--precisions", default="int8,fp16")
    ap.add_argument("--no-peer", action="store_true")
    args = ap.parse_args(argv)

    import torch

    import bench  # lab/gpu/bench.py (HERE is on sys.path)
    from zoi.backends.cuda.backend import CudaBackend
    from zoi.backends.cuda.options import CudaOptions

    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
    rng = np.random.default_rng(0)
    result = dict(
        time=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        gpu=torch.cuda.get_device_name(),
        torch=torch.__version__,
        triton=__import__("triton").__version__,
        rows=[],
        kernels={},
    )
    for name in args.models.split(","):
        cap = max(b * s for b, s in shapes)
        buckets = sorted({b * s for b, s in shapes})
        with tempfile.TemporaryDirectory() as d:
            real = os.environ.get("ZOI_MINILM_DIR") if name == "minilm" else None
            if real:
                from transformers import BertModel

                folder = real
                hf = BertModel.from_pretrained(real, add_pooling_layer=False).float().eval()
            else:
                folder = d
                hf = bench.build_hf(name, d)
            engines = {}
            for prec in args.precisions.split(","):
                for var in args.variants.split(","):
                    t0 = time.perf_counter()
                    m = bench.zoi_model(folder, prec, max_tokens=cap, max_batch=256)
                    ctx = v1_configs() if var == "v1" else contextlib.nullcontext()
                    opts = CudaOptions().replace(**variant_mods(var))
                    with ctx:
                        engines[(prec, var)] = CudaBackend(m, buckets=buckets, options=opts)
                    mem = engines[(prec, var)].memory()
                    print(f"  kernels/forward {mem['kernels_per_forward']}", flush=True)
                    print(
                        f"{name} {prec} {var}: built in {time.perf_counter() - t0:.1f}s", flush=True
                    )
            for B, S in shapes:
                ids, pos, cu = bench.inputs(rng, B, S)
                flat = ids.reshape(-1)
                tb = B * S
                outs = {k: bench.run_chunks(be, flat, pos, cu, True) for k, be in engines.items()}
                peer = None
                if not args.no_peer:
                    import copy

                    p = bench.TorchPeer(copy.deepcopy(hf).cpu(), torch.float16, B, S, graph=True)
                    want = p(ids)
                    peer = dict(
                        model=name, shape=f"{B}x{S}", provider="torch fp16 + cuda graph",
                        **bench.timed(functools.partial(p, ids)),
                    )  # fmt: skip
                    result["rows"].append(peer)
                    del p
                    torch.cuda.empty_cache()
                p50s = {k: [] for k in engines}
                for _ in range(args.rounds):
                    for k, be in engines.items():
                        t = bench.timed(
                            functools.partial(bench.run_chunks, be, flat, pos, cu, True)
                        )
                        p50s[k].append(t)
                for (prec, var), be in engines.items():
                    # per-launch times of a per-op bucket (a persistent one is one launch)
                    kt = [] if be._pplans.get(tb) is not None else bench.kernel_times(be, tb)
                    row = dict(
                        model=name,
                        shape=f"{B}x{S}",
                        provider=f"zoi {prec} {var}",
                        p50_us=float(np.median([t["p50_us"] for t in p50s[(prec, var)]])),
                        p99_us=float(np.median([t["p99_us"] for t in p50s[(prec, var)]])),
                        rounds=[t["p50_us"] for t in p50s[(prec, var)]],
                        graph_only_us=bench.graph_only_us(be, tb),
                        kernel_sum_us=sum(k["us"] for k in kt),
                        kernels_by_kind=agg_kernels(kt),
                        max_abs_vs_v1=float(
                            np.abs(
                                outs[(prec, var)] - outs.get((prec, "v1"), outs[(prec, var)])
                            ).max()
                        ),
                    )
                    if peer is not None:
                        row["cos_vs_torch_fp16"] = bench.cos_stats(outs[(prec, var)], want)
                    result["rows"].append(row)
                    result["kernels"][f"{name} {B}x{S} {prec} {var}"] = kt
                Path(args.out).parent.mkdir(parents=True, exist_ok=True)
                Path(args.out).write_text(json.dumps(result, indent=1, default=str))
            del engines
            torch.cuda.empty_cache()
    print(
        f"\n{'model':8s} {'shape':8s} {'provider':26s} {'p50 us':>8s} {'graph us':>9s} {'kern sum':>9s}  by kind"
    )
    for r in result["rows"]:
        print(
            f"{r['model']:8s} {r['shape']:8s} {r['provider']:26s} {r['p50_us']:8.1f} "
            f"{r.get('graph_only_us', float('nan')):9.1f} {r.get('kernel_sum_us', float('nan')):9.1f}  "
            + ", ".join(f"{k} {v:.0f}" for k, v in r.get("kernels_by_kind", {}).items())
            + (f"  cos min {r['cos_vs_torch_fp16']['min']:.5f}" if "cos_vs_torch_fp16" in r else "")
            + (f"  |d v1| {r['max_abs_vs_v1']:.2e}" if "max_abs_vs_v1" in r else "")
        )
    Path(args.out).write_text(json.dumps(result, indent=1, default=str))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
