"""Configs of the pool kernel (mean + L2 normalise: 14 us at 1x128 in the first
profile, one program walking 128 rows in 16-row dependent steps).

    python lab/gpu/pool_sweep.py [--out $OUT/pool_sweep.json]
    TRITON_INTERPRET=1 python lab/gpu/pool_sweep.py --tiny     # the CPU check of this script

Each config is checked against a float64 torch mean + normalise on fresh random fp16 rows
(output poisoned), then timed as sweep_linear.gtime (median of CUDA-graph replays)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1] / "src"))


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="gpu_out/pool_sweep.json")
    ap.add_argument("--tiny", action="store_true")
    args = ap.parse_args(argv)
    import torch
    from sweep_linear import gtime

    from zoi.backends.cuda.kernels import pool as k_pool

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator(device="cpu").manual_seed(7)
    shapes = (
        [(2, 24, 40)] if args.tiny else [(b, 128, h) for h in (384, 768) for b in (1, 8, 32, 256)]
    )
    cfgs = [(16, 4), (32, 4), (32, 8), (64, 8), (64, 16), (128, 16), (8, 4), (8, 2)]
    rows = []
    for B, S, H in shapes:
        T = B * S
        x = torch.randn(T, H, generator=g).to(torch.float16).to(dev)
        cu = torch.arange(0, T + 1, S, dtype=torch.int32).to(dev)
        hdr = torch.tensor([1, B, T], dtype=torch.int32).to(dev)
        p = torch.empty(B, H, dtype=torch.float32, device=dev)
        want = x.double().view(B, S, H).mean(1)
        want = want / want.norm(dim=1, keepdim=True).clamp_min(1e-12)
        bh = 1 << (H - 1).bit_length()
        cur = k_pool.pick_config(H)
        for br, w in cfgs + [(cur["BLOCK_R"], cur["num_warps"])]:
            cfg = dict(BLOCK_R=br, BLOCK_H=bh, num_warps=w)
            p.fill_(float("nan"))

            def go(cfg=cfg, x=x, cu=cu, hdr=hdr, p=p, B=B, H=H):
                k_pool.launch_pool(x, cu, hdr, p, B, H, "mean", cfg=cfg)

            try:
                go()
                err = float((p.double() - want).abs().max())
                us = gtime(torch, go) if err < 1e-5 else float("nan")
            except Exception as e:  # noqa: BLE001 - out of resources: the config is out
                err, us = str(e).splitlines()[0][:80], float("nan")
            rows.append(dict(B=B, S=S, H=H, BLOCK_R=br, warps=w, us=us, err=err,
                             current=cfg == dict(cur, BLOCK_H=bh)))  # fmt: skip
            print(f"B={B:4d} H={H:4d} R={br:4d} w={w:2d} {us:8.2f} us err {err}", flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
