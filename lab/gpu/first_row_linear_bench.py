"""One INT8 linear (QUANT 4, the measured tile of its shape) with and without the first-row
term (kernels/linear.py FIRST_ROW): device time per launch, 50 launches captured in one CUDA
graph and replayed (no host launch cost), MiniLM shapes, one sequence (its first row in tile
0), 8 sequences, and the term compiled in but no first row in the call ("none").
Prints one JSON line."""

import json

import torch

from zoi.backends.cuda.kernels import linear as k_lin


def bench(M, N, K, nseq, first_row, none=False):
    dev = "cuda"
    a = torch.randint(-127, 128, (M, K), dtype=torch.int8, device=dev)
    x = torch.randn(M, K, dtype=torch.float16, device=dev)
    sc = torch.rand(M, device=dev) * 0.01 + 0.001
    w = torch.randint(-127, 128, (N, K), dtype=torch.int8, device=dev)
    ws = torch.rand(N, device=dev) * 0.01
    b = torch.zeros(N, device=dev)
    y = torch.empty(M, N, dtype=torch.float16, device=dev)
    fr_map = torch.full((M,), -1, dtype=torch.int32, device=dev)
    step = max(1, M // nseq)
    for s in range(0 if none else nseq):
        fr_map[s * step] = s
    cfg = k_lin.pick_config(M, N, K, True)
    fr = (fr_map, x) if first_row else None

    def go():
        k_lin.launch_linear(a, sc, w, ws, b, None, y, None, M, N, K, quant=4, cfg=cfg, first_row=fr)

    for _ in range(3):
        go()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(50):
            go()
    g.replay()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(4):
        g.replay()
    e1.record()
    torch.cuda.synchronize()
    return round(e0.elapsed_time(e1) / 200 * 1000, 2), cfg


def main() -> None:
    out = {"card": torch.cuda.get_device_name()}
    for M, nseq in ((16, 1), (128, 1), (1024, 8)):
        for N, K in ((1152, 384), (384, 384), (1536, 384), (384, 1536)):
            off, cfg = bench(M, N, K, nseq, False)
            on, _ = bench(M, N, K, nseq, True)
            none, _ = bench(M, N, K, nseq, True, none=True)
            out[f"M{M}/B{nseq} N{N} K{K}"] = {
                "off_us": off,
                "on_us": on,
                "none_us": none,
                "cfg": cfg,
            }
            print(f"M{M} B{nseq} N{N} K{K}: off {off} on {on} none {none} us, {cfg}", flush=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
