"""What the epilogue's activation costs the ffn1 GEMM: one INT8 linear (asym int8 A,
the backend's config) at the MiniLM / bert-base ffn1 shapes, timed with each activation.

    python lab/gpu/act_cost.py [--out $OUT/act_cost.json]
    TRITON_INTERPRET=1 python lab/gpu/act_cost.py --tiny     # the CPU check of this script

Every output is checked against the float64 GELU (erf) / the activation's formula first
(outputs poisoned), then timed as sweep_linear.gtime (median of CUDA-graph replays)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1] / "src"))


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="gpu_out/act_cost.json")
    ap.add_argument("--tiny", action="store_true")
    args = ap.parse_args(argv)
    import torch
    from sweep_linear import Ctx, Linear, gtime, rel

    from zoi.backends.cuda.kernels import linear as k_lin

    shapes = [(48, 96, 48)] if args.tiny else [(32768, 1536, 384), (4096, 1536, 384),
                                               (32768, 3072, 768)]  # fmt: skip
    acts = ["none", "relu", "gelu", "gelu_tanh"]
    ctx = Ctx(int(time.time()) % 100000)
    rows = []
    for M, N, K in shapes:
        lin = Linear(ctx, "int8", "plain", N, K, M)
        cfg = k_lin.pick_config(M, N, K, True)
        base = lin.ref()  # float64, no activation
        for act in acts:
            lin.poison()

            def go(act=act, lin=lin, M=M, N=N, K=K, cfg=cfg):
                k_lin.launch_linear(
                    lin.a, lin.a_sc, lin.w, lin.ws, lin.b, None, lin.y, None, M, N, K,
                    quant=4, act=act, cfg=cfg, a_zp=lin.a_zp, colsum=lin.cs,
                )  # fmt: skip

            go()
            if act == "gelu":
                want = 0.5 * base * (1.0 + torch.erf(base * 0.7071067811865476))
            elif act == "gelu_tanh":
                want = torch.nn.functional.gelu(base, approximate="tanh")
            elif act == "relu":
                want = base.clamp_min(0)
            else:
                want = base
            err = rel(torch, lin.y, want)
            us = gtime(torch, go)
            rows.append(dict(M=M, N=N, K=K, act=act, us=us, rel=err, cfg=cfg))
            print(f"M={M:6d} N={N:5d} K={K:4d} {act:10s} {us:9.1f} us  rel {err:.2e}", flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(
        json.dumps(
            dict(
                rows=rows, gpu=torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
            ),
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
