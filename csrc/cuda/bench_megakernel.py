"""The megakernel's GPU check: the cubin's build report, then MiniLM-shaped FP16 (random
weights, lab/gpu/bench.py's HF model) p50 us per call at 1x16 / 1x128 / 8x128 for the
megakernel, the per-op CUDA graph and PyTorch FP16 + CUDA graph, one process, same ids,
with the agreement of the outputs. JSON to --out. Run by ``scripts/gpu_check.sh mega``."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "lab" / "gpu"), str(ROOT)]


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", default="1x16,1x128,8x128")
    ap.add_argument("--sanitize", action="store_true", help="3 small forwards (compute-sanitizer)")
    ap.add_argument("--hops", action="store_true", help="the cost of a dependency hop alone")
    args = ap.parse_args(argv)
    if args.sanitize:
        return sanitize()
    if args.hops:
        return hops(args.out)
    import torch

    from bench import TorchPeer, build_hf, cos_stats, graph_only_us, inputs, timed, zoi_model
    from zoi.backends.cuda import megakernel as mk
    from zoi.backends.cuda.backend import CudaBackend
    from zoi.backends.cuda.options import CudaOptions

    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    res = {
        "gpu": torch.cuda.get_device_name(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "rows": [],
    }
    log = Path(args.out).with_suffix(".ptxas.txt")
    if log.exists():
        res["ptxas"] = mk.ptxas_report(log.read_text())
    cap = max(b * s for b, s in shapes)
    buckets = sorted({max(16, 1 << (b * s - 1).bit_length()) for b, s in shapes})
    with tempfile.TemporaryDirectory() as d:
        hf = build_hf("minilm", d)
        model = zoi_model(d, "fp16", cap, max(b for b, _ in shapes))
        t0 = time.perf_counter()
        mega = CudaBackend(model, buckets=buckets, options=CudaOptions(megakernel="on"))
        res["build_s_megakernel"] = time.perf_counter() - t0
        per_op = CudaBackend(model, buckets=buckets, options=CudaOptions(megakernel="off"))
        res["bucket_paths"] = {str(k): v for k, v in mega.bucket_paths.items()}
        print("megakernel bucket paths:", mega.bucket_paths, flush=True)
        for tb, plan in mega._pplans.items():
            st = mk.check_program(plan.prog)
            print(
                f"bucket {tb}: {st['instructions']} instructions, {st['counters']} counters, "
                f"{plan.n_blocks} blocks, load max/mean "
                f"{max(st['load']) / (sum(st['load']) / len(st['load'])):.2f}",
                flush=True,
            )
        rng = np.random.default_rng(0)
        for B, S in shapes:
            ids, pos, cu = inputs(rng, B, S)
            flat = ids.reshape(-1)
            row = {"shape": f"{B}x{S}"}
            a = mega.run(flat, pos, cu, True)
            b = per_op.run(flat, pos, cu, True)
            row["cos_mega_vs_per_op"] = cos_stats(a, b)
            tb = next(t for t in mega.buckets if t >= len(flat))
            if tb in mega._pplans and B * S <= 128:  # the emulation of this call, buffer by buffer
                plan = mega._pplans[tb]
                mega.run(flat, pos, cu, True)
                torch.cuda.synchronize()
                out = np.zeros((mega.max_batch, a.shape[1]), np.float32)
                wb = mega.wbuf.cpu().numpy().view(np.uint8)
                _, sc = mk.emulate(plan.prog, wb, mega.d_in.cpu().numpy(), mega.hdr_ints, out, True)
                rep = mk.compare_scratch(plan.prog, plan.scratch.cpu().numpy(), sc, len(flat))
                bad = [r for r in rep if r["first_bad"]]
                row["emulation_first_bad"] = bad[0] if bad else None
                prof = mk.MegakernelPlan(mega, tb, profile=True)  # the same call, timed inside
                for _ in range(5):  # warm (instruction lists, scratch in L2): the last one counts
                    prof.launch()
                torch.cuda.synchronize()
                row["profile"] = prof.profile_report()
                print(
                    f"minilm {B}x{S} profile (us from the first start): {row['profile']}",
                    flush=True,
                )
                print(f"minilm {B}x{S}: GPU vs emulation, first bad buffer: {row['emulation_first_bad']}"
                      f"; max abs per buffer {[(r['buffer'], round(r['max_abs'], 4)) for r in rep]}",
                      flush=True)  # fmt: skip
            if tb in mega._pplans:
                row["variants"] = variants(mega, tb, flat, pos, cu, a)
                print(f"minilm {B}x{S} program variants (device us per forward): "
                      f"{row['variants']}", flush=True)  # fmt: skip
            for name, be in (("megakernel", mega), ("per_op", per_op)):
                try:
                    row[f"{name}_graph_only_us"] = graph_only_us(be, tb, reps=200)
                except Exception as e:  # noqa: BLE001  (a lab figure, not a result)
                    row[f"{name}_graph_only_us"] = repr(e)
            peer = TorchPeer(hf, torch.float16, B, S, graph=True)
            c = peer(ids)
            row["cos_mega_vs_torch"] = cos_stats(a, c)
            # alternate the three (same process, same ids), twice
            fns = (
                ("megakernel", lambda f=flat, p=pos, c=cu: mega.run(f, p, c, True)),
                ("per_op", lambda f=flat, p=pos, c=cu: per_op.run(f, p, c, True)),
                ("torch_fp16_graph", lambda pr=peer, i=ids: pr(i)),
            )
            for _ in range(2):
                for name, fn in fns:
                    t = timed(fn)
                    row.setdefault(name, []).append(t)
            for name in ("megakernel", "per_op", "torch_fp16_graph"):
                row[f"{name}_p50_us"] = min(t["p50_us"] for t in row[name])
            res["rows"].append(row)
            print(
                f"minilm {B}x{S}: megakernel {row['megakernel_p50_us']:.1f} us, per-op "
                f"{row['per_op_p50_us']:.1f}, torch fp16 graph {row['torch_fp16_graph_p50_us']:.1f}"
                f"; cos vs per-op min {row['cos_mega_vs_per_op']['min']:.6f}, vs torch "
                f"{row['cos_mega_vs_torch']['min']:.6f}",
                flush=True,
            )
            Path(args.out).write_text(json.dumps(res, indent=1))
            del peer, fns
    Path(args.out).write_text(json.dumps(res, indent=1))


VARIANTS = {  # (fuse_ln, fuse_attn): the builder's default and the fusions taken apart
    "default": (None, None),
    "unfused": (False, False),
    "ln_only": (True, False),
    "attn_only": (False, True),
}


def variants(be, tb, flat, pos, cu, want, reps=300):
    """Each program variant of bucket tb as its own plan (own counters and scratch), same staged
    input: device us per forward over back-to-back launches, its profile span and the cosine
    of its output to the captured default's."""
    import torch

    from bench import cos_stats
    from zoi.backends.cuda import megakernel as mk

    out = {}
    be.run(flat, pos, cu, True)  # stages this call's input on the device
    torch.cuda.synchronize()
    base = be._pplans[tb]
    for name, (fl, fa) in VARIANTS.items():
        prog = mk.build_program(base.desc, tb, base.n_blocks, max_seq=min(be.max_batch, tb),
                                fuse_ln=fl, fuse_attn=fa)  # fmt: skip
        r = {"instructions": len(prog.rows), "ops": sorted(set(prog.rows[:, mk.F_OP].tolist()))}
        try:
            plan = mk.MegakernelPlan(be, tb, program=prog)
            be.d_out.fill_(float("nan"))
            plan.launch()
            torch.cuda.synchronize()
            got = be.d_out[: len(want)].cpu().numpy()
            r["cos_vs_default"] = cos_stats(got, want)
            r["finite"] = bool(np.isfinite(got).all())
            for _ in range(20):
                plan.launch()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(reps):
                plan.launch()
            torch.cuda.synchronize()
            r["device_us"] = round((time.perf_counter() - t0) / reps * 1e6, 2)
            r["timed_out"] = plan.barrier_timed_out()
            prof = mk.MegakernelPlan(be, tb, program=prog, profile=True)
            for _ in range(5):
                prof.launch()
            torch.cuda.synchronize()
            rep = prof.profile_report()
            r["span_us"] = round(rep["span_us"], 2)
            r["phases_layer0"] = {k: v for k, v in rep["phases"].items() if k.endswith("0")}
        except Exception as e:  # noqa: BLE001  (one variant's failure is a lab figure)
            r["error"] = repr(e)[:500]
        out[name] = r
    be.run(flat, pos, cu, True)
    torch.cuda.synchronize()
    return out


def hops(out_path):
    """What one dependency costs with no work in it: programs of NOP instructions only (each
    waits on its counter, bumps its own), timed over back-to-back launches. "chain2": n
    instructions alternating between two blocks on different SMs, each waiting for the
    previous one (a counter round trip between SMs); "queue": the same n in one block's queue
    (instruction overhead, no cross-SM wait); "phases W": n / W phases of W instructions on W
    blocks, each waiting for all W of the previous phase (a GEMM phase's fan-in)."""
    import dataclasses

    import torch

    from zoi.backends.cuda import megakernel as mk
    from zoi.backends.cuda.backend import CudaBackend
    from zoi.backends.cuda.megakernel_program import F_SELF, F_WAIT_PER_CALL, N_FIELDS, Program
    from zoi.graph.compiled import CompiledModel
    from zoi.graph.synthetic import random_weights, synthetic_spec

    spec = dataclasses.replace(
        synthetic_spec(hidden=64, heads=2, layers=1, inter=96), max_positions=64
    )
    model = CompiledModel.build(spec, random_weights(spec, 0), "fp16", 64, None, {})
    be = CudaBackend(model, buckets=[16], options=mk_options())
    be.run(
        np.arange(5, dtype=np.int32), np.arange(5, dtype=np.int32), np.array([0, 5], np.int32), True
    )
    nb = int(be.sm)

    def program(n_phases, width, blocks_of):
        rows, queues, per_call, names = [], [[] for _ in range(nb)], [], []
        for k in range(n_phases):
            per_call.append(width)
            for j in range(width):
                r = np.zeros(N_FIELDS, np.int32)
                r[mk.F_OP] = 0
                r[mk.F_WAIT] = k - 1 if k else -1
                r[mk.F_WAIT_N] = width if k else 0
                r[mk.F_SIGNAL] = k
                r[F_SELF] = len(rows)
                queues[blocks_of(k, j)].append(len(rows))
                rows.append(r)
                names.append(f"p{k} {j}")
        R = np.stack(rows)
        for r in R:
            if r[mk.F_WAIT] >= 0:
                r[F_WAIT_PER_CALL] = per_call[r[mk.F_WAIT]]
        n = len(rows)
        return Program(16, 16, R, queues, per_call, {}, 0, [([], [])] * n, [1.0] * n, names)

    res = {"gpu": torch.cuda.get_device_name(), "sms": nb, "rows": {}}
    cases = {
        "chain2": program(120, 1, lambda k, j: (k % 2) * (nb // 2)),
        "queue": program(60, 1, lambda k, j: 0),
        "phases 6": program(60, 6, lambda k, j: (k % 2) * (nb // 2) + j),
        "phases 24": program(60, 24, lambda k, j: (k % 2) * (nb // 2) + j),
    }
    for name, prog in cases.items():
        mk.check_program(prog)
        plan = mk.MegakernelPlan(be, 16, program=prog)
        for _ in range(20):
            plan.launch()
        torch.cuda.synchronize()
        reps = 200
        t0 = time.perf_counter()
        for _ in range(reps):
            plan.launch()
        torch.cuda.synchronize()
        us = (time.perf_counter() - t0) / reps * 1e6
        n_ph = len(prog.per_call)
        res["rows"][name] = dict(
            forward_us=round(us, 2), phases=n_ph, us_per_phase=round(us / n_ph, 3),
            timed_out=plan.barrier_timed_out(),
        )  # fmt: skip
        print(
            f"hops {name}: {us:.1f} us for {n_ph} dependent phases = {us / n_ph:.3f} us each",
            flush=True,
        )
    Path(out_path).write_text(json.dumps(res, indent=1))


def mk_options():
    from zoi.backends.cuda.options import CudaOptions

    return CudaOptions(megakernel="on")


def sanitize():
    """A few megakernel forwards of a small random BERT (2 heads of 32, 2 layers) at buckets 16
    and 128, several sequences: what compute-sanitizer memcheck / racecheck watch."""
    import dataclasses

    from zoi.backends.cuda.backend import CudaBackend
    from zoi.backends.cuda.options import CudaOptions
    from zoi.graph.compiled import CompiledModel
    from zoi.graph.synthetic import random_weights, synthetic_spec

    spec = synthetic_spec(hidden=64, heads=2, layers=2, inter=96)
    spec = dataclasses.replace(spec, max_positions=128)
    model = CompiledModel.build(spec, random_weights(spec, 0), "fp16", 128, None, {})
    be = CudaBackend(model, buckets=[16, 128], options=CudaOptions(megakernel="on"))
    rng = np.random.default_rng(0)
    for lens in ([5], [40, 3, 60], [100]):
        T = sum(lens)
        ids = rng.integers(0, 97, T).astype(np.int32)
        pos = np.concatenate([np.arange(n) for n in lens]).astype(np.int32)
        cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
        out = be.run(ids, pos, cu, True)
        print("megakernel", lens, "finite", bool(np.isfinite(out).all()), be.bucket_paths)


if __name__ == "__main__":
    main()
