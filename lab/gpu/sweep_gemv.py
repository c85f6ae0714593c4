"""Decode-linear sweep: the current tl.dot kernel against the GEMV / MMA decode kernels at
every decode call site of Llama-3.2-1B (M = 1) and Qwen2.5-0.5B (M = 32 streams), INT8 and FP16.

    python lab/gpu/sweep_gemv.py --out $OUT/gemv_sweep.json [--budget 200] [--workers 14] [--quick]
    TRITON_INTERPRET=1 python lab/gpu/sweep_gemv.py --tiny --out /tmp/gemv_tiny.json   # CPU check

Sites (as the backend launches them, src/zoi/backends/cuda/generate_steps.py): qkv (+RMS, +bias on qwen),
o (+residual, out aliases h), gu (SwiGLU gate|up, +RMS), down (+residual), lm (+RMS). Configs:
the current pick (linear_table.pick_dot: kind "dot", what main ran before this sweep), the new
default (decode_rule), a grid of "gemv" (M <= 4: BLOCK_N x BLOCK_K x warps) and "mma" (BLOCK_N x
BLOCK_K x swap x stages) tiles; each at up to two split-K counts (~1 and ~3 programs per SM;
the split is a runtime argument, so it costs no compile).

Phase 1 (worker processes, in parallel: mostly Triton compiling): every (config, split) at its
shape on fresh random inputs, outputs poisoned with NaN, against a torch float64 reference
(rel = max |err| / max |ref| < 4e-3; residual sites also with out aliasing the residual);
failures are dropped and listed. Phase 2 (this process alone on the GPU): each survivor timed
as CUDA-graph replays: W (and its scales) rotated over enough copies that a pass streams >= 256
MB (so W comes from HBM as in a real decode step, not from the 50 MB L2; x, the residual and
the workspace stay hot, as in the step), one graph of all copies' launches, median of 7 rounds
of replays, us per launch; GB/s = the launch's minimum bytes (W + scales + x + out (+ res))
per us. Writes every row, the best per site, the predicted decode step (current us x layers
summed vs the best variant's), and "table" lines for linear_table.DECODE_TABLE to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "src"))

INTERP = os.environ.get("TRITON_INTERPRET") == "1"
EPS = 1e-5
TOL = 4e-3
ROTATE_BYTES = 256 << 20
MAX_COPIES = 512

# hidden, heads, kv heads, head_dim, intermediate, vocab, layers, qkv bias, decode rows M
MODELS = {
    "llama-3.2-1b": dict(H=2048, nh=32, kvh=8, D=64, I=8192, V=128256, L=16, bias=False, M=(1,)),
    "qwen2.5-0.5b": dict(H=896, nh=14, kvh=2, D=64, I=4864, V=151936, L=24, bias=True, M=(32,)),
}
TINY = {
    "llama-3.2-1b": dict(H=64, nh=2, kvh=1, D=32, I=96, V=200, L=2, bias=False, M=(1,)),
    "qwen2.5-0.5b": dict(H=48, nh=2, kvh=1, D=24, I=80, V=150, L=2, bias=True, M=(3,)),
}
PRECS = ("int8", "fp16")
WB = {"int8": 1, "fp16": 2}


def sites(model: str, md: dict) -> list[dict]:
    """The decode linears of one layer (and lm_head): name, N, K, flags, count per step."""
    qkv_n = (md["nh"] + 2 * md["kvh"]) * md["D"]
    hd = md["nh"] * md["D"]
    L = md["L"]
    return [
        dict(site="qkv", N=qkv_n, K=md["H"], rms=True, bias=md["bias"], count=L),
        dict(site="o", N=md["H"], K=hd, res=True, count=L),
        dict(site="gu", N=md["I"], K=md["H"], rms=True, swiglu=True, count=L),
        dict(site="down", N=md["H"], K=md["I"], res=True, count=L),
        dict(site="lm", N=md["V"], K=md["H"], rms=True, count=1),
    ]


# --------------------------------------------------------------------------------- the grids
def cfg_dict(c) -> dict:
    return dict(
        block_m=c.block_m, block_n=c.block_n, block_k=c.block_k, split_k=c.split_k,
        num_warps=c.num_warps, num_stages=c.num_stages, kind=c.kind, swap=c.swap,
        fast_cvt=c.fast_cvt,
    )  # fmt: skip


def grid(s: dict, M: int, prec: str, sms: int, quick: bool, tiny: bool) -> list[tuple[str, dict]]:
    """(tag, config dict) of one site: current, rule, then the grid (split_k set per split)."""
    from zoi.backends.cuda.kernels import linear_table as lt

    N, K, sw, wb = s["N"], s["K"], bool(s.get("swiglu")), WB[prec]
    out = [
        ("current", cfg_dict(lt.pick_dot(M, N, K, sms, wb, sw))),
        ("rule", cfg_dict(lt.decode_rule(M, N, K, sms, wb, sw))),
    ]
    LC = lt.LinearConfig
    cands = []
    if M <= 4:
        bm = lt._np2(M)
        bks = (256, 512, 1024) if wb == 1 else (128, 256, 512)
        for bn in (32, 64, 128):
            for bk in bks:
                for w in (4, 8):
                    per_thread = bn * bk * wb * (2 if sw else 1) / (32 * w)
                    if 64 <= per_thread <= 512:
                        cands.append(LC(bm, bn, bk, 1, w, 1, "gemv"))
        r = lt.decode_rule(M, N, K, sms, wb, sw)
        if r.kind == "gemv":
            cands.append(LC(r.block_m, r.block_n, r.block_k, 1, r.num_warps, 3, "gemv"))
            if wb == 1:
                cands.append(LC(r.block_m, r.block_n, r.block_k, 1, r.num_warps, 1, "gemv",
                                fast_cvt=False))  # fmt: skip
    bm = 16 if M <= 16 else 32
    bks = (128, 256) if wb == 1 else (64, 128)
    bns = (64, 128) if M <= 4 else (32, 64, 128)
    for bn in bns:
        for bk in bks:
            for swap in (False, True):
                for st in (3,) if M > 4 else (4,):
                    smem = st * (bm * bk * 4 + bn * bk * wb * (2 if sw else 1))
                    if smem <= 200 * 1024:
                        cands.append(LC(bm, bn, bk, 1, 4, st, "mma", swap=swap))
    if M > 4 and wb == 1:
        r = lt.decode_rule(M, N, K, sms, wb, sw)
        cands.append(LC(r.block_m, r.block_n, r.block_k, 1, 4, r.num_stages, "mma", fast_cvt=False))
    if quick:
        cands = cands[::3]
    if tiny:
        cands = cands[:2] + [c for c in cands if c.kind == "mma"][:1]
    seen = {json.dumps(d, sort_keys=True) for _, d in out}
    for c in cands:
        d = cfg_dict(c)
        if json.dumps(d, sort_keys=True) not in seen:
            seen.add(json.dumps(d, sort_keys=True))
            out.append(("grid", d))
    return out


def splits_for(d: dict, M: int, N: int, K: int, sms: int, tag: str) -> list[int]:
    """Split counts timed for one config: its own for current / rule; ~1 and ~3 per SM otherwise."""
    from zoi.backends.cuda.kernels import linear_table as lt

    if tag in ("current", "rule"):
        return [d["split_k"]]
    tiles = lt.cdiv(M, d["block_m"]) * lt.cdiv(N, d["block_n"])
    return sorted({lt.split_for(tiles, K, d["block_k"], sms, p) for p in (1, 3)})


# -------------------------------------------------------------------------- inputs, reference
class Case:
    """One site's inputs at M rows, its launch and its float64 reference."""

    def __init__(self, torch, dev, s: dict, M: int, prec: str, seed: int, copies: int = 1):
        self.t, self.s, self.M, self.prec = torch, s, M, prec
        g = torch.Generator(device=dev)
        g.manual_seed(seed)
        N, K = s["N"], s["K"]
        nw = 2 * N if s.get("swiglu") else N
        act = torch.float16
        self.N, self.K, self.nw = N, K, nw
        xdt = torch.float32 if s.get("rms") else act
        self.x = (torch.randn(M, K, generator=g, device=dev) * 2.0).to(xdt)
        self.ws_list, self.sc_list = [], []
        for _ in range(copies):
            if prec == "int8":
                w = torch.randint(-127, 128, (nw, K), generator=g, device=dev, dtype=torch.int8)
                sc = (torch.rand(nw, generator=g, device=dev) + 0.5) * (2.0 / 127.0 / K**0.5)
            else:
                w = (torch.randn(nw, K, generator=g, device=dev) * K**-0.5).to(act)
                sc = None
            self.ws_list.append(w)
            self.sc_list.append(sc)
        self.bias = torch.randn(N, generator=g, device=dev) * 0.1 if s.get("bias") else None
        self.res = torch.randn(M, N, generator=g, device=dev) if s.get("res") else None
        self.out_dt = torch.float32 if (s.get("res") or s["site"] == "lm") else act
        self.out = torch.empty(M, N, dtype=self.out_dt, device=dev)
        self._ref = None
        self.ws = self.cnt = None

    def wbytes(self) -> int:
        w = self.ws_list[0]
        n = w.numel() * w.element_size()
        return n + (self.nw * 4 if self.sc_list[0] is not None else 0)

    def bytes(self) -> int:
        """Minimum bytes of one launch: W (+ scales), x, out (+ the residual read)."""
        by = self.wbytes() + self.x.numel() * self.x.element_size()
        by += self.out.numel() * self.out.element_size() * (2 if self.res is not None else 1)
        return by

    def ref(self):
        if self._ref is None:
            t = self.t
            x = self.x.double()
            if self.s.get("rms"):
                x = x / t.sqrt((x * x).mean(1, keepdim=True) + EPS)
            w, sc = self.ws_list[0], self.sc_list[0]
            ys = []
            for n0 in range(0, self.nw, 8192):  # float64 W in slices (lm_head: 128256 rows)
                wd = w[n0 : n0 + 8192].double()
                if sc is not None:
                    wd = wd * sc[n0 : n0 + 8192].double()[:, None]
                ys.append(x @ wd.T)
            y = t.cat(ys, 1)
            if self.s.get("swiglu"):
                gg, u = y[:, : self.N], y[:, self.N :]
                y = gg * t.sigmoid(gg) * u
            if self.bias is not None:
                y = y + self.bias.double()
            if self.res is not None:
                y = y + self.res.double()
            self._ref = y
        return self._ref

    def buffers(self, cfg):
        from zoi.backends.cuda.kernels import linear_decode as kl

        t = self.t
        sw = bool(self.s.get("swiglu"))
        need = kl.workspace_floats(self.M, self.N, cfg, sw)
        if need and (self.ws is None or self.ws.numel() < need):
            self.ws = t.empty(need, dtype=t.float32, device=self.x.device)
        nc = kl.counters(self.M, self.N, cfg)
        if self.cnt is None or self.cnt.numel() < nc:
            self.cnt = t.zeros(nc, dtype=t.int32, device=self.x.device)

    def launch(self, cfg, i=0, out=None, res=None):
        from zoi.backends.cuda.kernels import linear_decode as kl

        kl.linear(
            self.x,
            self.ws_list[i],
            self.out if out is None else out,
            self.M,
            self.N,
            self.K,
            cfg,
            scale=self.sc_list[i],
            bias=self.bias,
            res=res,
            rms_eps=EPS if self.s.get("rms") else None,
            swiglu=bool(self.s.get("swiglu")),
            ws=self.ws,
            cnt=self.cnt,
        )

    def check(self, cfg) -> str:
        """'' when the poisoned output matches the reference (residual sites: also aliased)."""
        t = self.t
        self.buffers(cfg)
        if self.ws is not None:
            self.ws.fill_(float("nan"))
        self.out.fill_(float("nan"))
        self.launch(cfg, res=self.res)
        e = rel(t, self.out, self.ref())
        if not e < TOL:
            return f"rel err {e:.3g}"
        if self.res is not None:  # h += o(x): out is the residual
            self.out.copy_(self.res)
            self.launch(cfg, res=self.out)
            e = rel(t, self.out, self.ref())
            if not e < TOL:
                return f"aliased residual: rel err {e:.3g}"
        if int(self.cnt.abs().sum()) != 0:
            return "split-K counters not reset"
        return ""


def rel(t, got, want) -> float:
    got = got.double()
    if not bool(t.isfinite(got).all()):
        return float("inf")
    return float((got - want).abs().max() / want.abs().max().clamp(min=1e-30))


def make_cfg(d: dict, split: int):
    from zoi.backends.cuda.kernels import linear_table as lt

    return lt.LinearConfig(**dict(d, split_k=split))


# ----------------------------------------------------------------------------- phase 1: check
_W = {}


def check_job(job):
    """Worker: compile + check the (config, split) pairs of one shape -> [(key, err)]."""
    skey, s, M, prec, items = job
    import torch

    dev = "cuda" if (torch.cuda.is_available() and not INTERP) else "cpu"
    if _W.get("skey") != skey:
        _W.clear()
        seed = (int(time.time() * 1e3) + os.getpid()) % (2**31)
        _W["case"] = Case(torch, dev, s, M, prec, seed)
        _W["skey"] = skey
    case = _W["case"]
    res = []
    t0 = time.perf_counter()
    for tag, d, split in items:
        try:
            err = case.check(make_cfg(d, split))
        except Exception as e:  # noqa: BLE001 - out of resources, compile errors: dropped
            err = f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
        res.append(((skey, tag, json.dumps(d, sort_keys=True), split), err))
    if dev == "cuda":
        torch.cuda.synchronize()
    return res, time.perf_counter() - t0


# ------------------------------------------------------------------------------ phase 2: time
def gtime(torch, case: Case, cfg, copies: int) -> float:
    """us per launch: one CUDA graph of `copies` launches (one per W copy), median of 7 rounds."""
    case.buffers(cfg)
    out = case.out
    res = out if case.res is not None else None
    if res is not None:
        out.copy_(case.res)
    if INTERP or not torch.cuda.is_available():
        t0 = time.perf_counter()
        case.launch(cfg, 0, out, res)
        return (time.perf_counter() - t0) * 1e6
    for i in range(copies):  # loads / compiles every specialisation outside the capture
        case.launch(cfg, i, out, res)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    st = torch.cuda.Stream()
    with torch.cuda.stream(st):
        with torch.cuda.graph(g, stream=st):
            for i in range(copies):
                case.launch(cfg, i, out, res)
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    g.replay()
    e.record()
    torch.cuda.synchronize()
    reps = int(max(1, min(50, 2.0 / max(s.elapsed_time(e), 1e-3))))  # >= ~2 ms per round
    ts = []
    for _ in range(7):
        s.record()
        for _ in range(reps):
            g.replay()
        e.record()
        torch.cuda.synchronize()
        ts.append(s.elapsed_time(e) * 1e3 / (reps * copies))
    del g
    return sorted(ts)[len(ts) // 2]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="gpu_out/gemv_sweep.json")
    ap.add_argument("--workers", type=int, default=max(1, min(14, (os.cpu_count() or 2) - 2)))
    ap.add_argument("--budget", type=float, default=200.0, help="seconds for both phases")
    ap.add_argument("--compile-share", type=float, default=0.6)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--precs", default=",".join(PRECS))
    ap.add_argument("--m", default="", help="override the decode rows, e.g. 1,4,32 (every model)")
    ap.add_argument("--quick", action="store_true", help="a third of the grid")
    ap.add_argument("--tiny", action="store_true", help="CPU/interpreter self-check of this script")
    ap.add_argument("--list", action="store_true", help="count the work and exit")
    ap.add_argument("--sms", type=int, default=0, help="SM count when there is no GPU (--list)")
    a = ap.parse_args(argv)
    t_start = time.perf_counter()
    import torch

    cuda = torch.cuda.is_available() and not INTERP
    sms = torch.cuda.get_device_properties(0).multi_processor_count if cuda else (a.sms or 8)
    models = TINY if a.tiny else MODELS
    todo = []  # (skey, site dict, M, prec, [(tag, cfg dict, split)])
    for mname in a.models.split(","):
        md = models[mname]
        ms = [int(v) for v in a.m.split(",")] if a.m else list(md["M"])
        for M in ms:
            for prec in a.precs.split(","):
                for s in sites(mname, md):
                    items = [
                        (tag, d, sp)
                        for tag, d in grid(s, M, prec, sms, a.quick, a.tiny)
                        for sp in splits_for(d, M, s["N"], s["K"], sms, tag)
                    ]
                    skey = f"{mname}|{s['site']}|M{M}|{prec}"
                    todo.append((skey, dict(s, model=mname), M, prec, items))
    # big sites first (they dominate the step), then chunks of <= 6 pairs per job
    todo.sort(key=lambda j: -j[1]["N"] * j[1]["K"] * j[1]["count"])
    jobs = []
    for skey, s, M, prec, items in todo:
        for i in range(0, len(items), 6):
            jobs.append((skey, s, M, prec, items[i : i + 6]))
    n_pairs = sum(len(j[4]) for j in jobs)
    n_units = len({(j[0], json.dumps(d, sort_keys=True)) for j in todo for _, d, _ in j[4]})
    print(f"{len(todo)} sites, {n_units} configs to compile, {n_pairs} (config, split) pairs, "
          f"{len(jobs)} jobs, workers {a.workers}, SMs {sms}", flush=True)  # fmt: skip
    if a.list:
        for j in todo:
            print(f"  {j[0]:32s} {len(j[4]):3d} pairs")
        return {}

    # phase 1: compile + check (parallel)
    ok, fails = set(), {}
    deadline = t_start + a.budget * a.compile_share
    pool = None
    if a.workers <= 1:
        it = map(check_job, jobs)
    else:
        import multiprocessing as mp

        pool = mp.get_context("spawn").Pool(a.workers)
        it = pool.imap_unordered(check_job, jobs)
    done = 0
    for res, _dt in it:
        done += 1
        for k, err in res:
            if err:
                fails[k] = err
            else:
                ok.add(k)
        if done % 40 == 0:
            print(f"  checked {done}/{len(jobs)} jobs ({time.perf_counter() - t_start:.0f}s)",
                  flush=True)  # fmt: skip
        if time.perf_counter() > deadline:
            print(f"  phase-1 deadline: {len(jobs) - done} jobs not checked", flush=True)
            break
    if pool is not None:
        pool.terminate()
        pool.join()
    wrong = {k: e for k, e in fails.items() if "rel err" in e or "counters" in e}
    print(f"phase 1: {len(ok)} ok, {len(fails)} failed ({len(wrong)} WRONG RESULTS) "
          f"at {time.perf_counter() - t_start:.0f}s", flush=True)  # fmt: skip
    for k, e in list(wrong.items())[:8]:
        print("  WRONG", k, e, flush=True)

    # phase 2: time (this process alone)
    rows, skipped = [], 0
    for skey, s, M, prec, items in todo:
        mine = [(tag, d, sp) for tag, d, sp in items
                if (skey, tag, json.dumps(d, sort_keys=True), sp) in ok]  # fmt: skip
        if not mine:
            continue
        if time.perf_counter() > t_start + a.budget:
            skipped += 1
            continue
        nw = s["N"] * (2 if s.get("swiglu") else 1)
        wbytes = nw * s["K"] * WB[prec] + (nw * 4 if prec == "int8" else 0)
        copies = 1 if not cuda else int(max(1, min(MAX_COPIES, -(-ROTATE_BYTES // wbytes))))
        case = Case(torch, "cuda" if cuda else "cpu", s, M, prec, 7, copies)
        for tag, d, sp in mine:
            cfg = make_cfg(d, sp)
            try:
                us = gtime(torch, case, cfg, copies)
            except Exception as e:  # noqa: BLE001
                fails[(skey, tag, json.dumps(d, sort_keys=True), sp)] = f"timing: {e!r}"[:200]
                continue
            from zoi.backends.cuda.kernels import linear_table as lt

            kb = lt.cdiv(lt.cdiv(s["K"], d["block_k"]), sp) * d["block_k"]
            rows.append(dict(
                model=s["model"], site=s["site"], M=M, prec=prec, N=s["N"], K=s["K"],
                count=s["count"], tag=tag, cfg=dict(d, split_k=sp), launched_split=lt.cdiv(s["K"], kb),
                us=round(us, 2), gbs=round(case.bytes() / us / 1e3, 1), copies=copies,
            ))  # fmt: skip
        # the site's winner once more, on fresh inputs, output poisoned
        site_rows = [r for r in rows if r["model"] == s["model"] and r["site"] == s["site"]
                     and r["M"] == M and r["prec"] == prec]  # fmt: skip
        if site_rows:
            w = min(site_rows, key=lambda r: r["us"])
            fresh = Case(torch, "cuda" if cuda else "cpu", s, M, prec, 12345, 1)
            w["winner_recheck"] = fresh.check(make_cfg(w["cfg"], w["cfg"]["split_k"])) or "ok"
            if w["winner_recheck"] != "ok":
                print(f"  WINNER FAILED RECHECK {skey}: {w['winner_recheck']}", flush=True)
            del fresh
        del case
        if cuda:
            torch.cuda.empty_cache()
    if skipped:
        print(f"phase-2 deadline: {skipped} sites not timed", flush=True)
    doc = summarize(rows)
    doc.update(
        time=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        gpu=torch.cuda.get_device_name() if cuda else "cpu (interpreter)",
        sms=sms,
        triton=__import__("triton").__version__,
        torch=torch.__version__,
        interpret=INTERP,
        wall_s=round(time.perf_counter() - t_start, 1),
        pairs=n_pairs,
        failures={"|".join(map(str, k)): e for k, e in fails.items()},
        rows=rows,
    )
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(doc, indent=0))
    report(doc)
    print(f"wrote {a.out} ({len(rows)} timings, {time.perf_counter() - t_start:.0f}s)", flush=True)
    return doc


def summarize(rows: list[dict]) -> dict:
    """Best per site; the predicted linear time of one decode step: current vs best vs rule."""
    by = {}
    for r in rows:
        by.setdefault((r["model"], r["M"], r["prec"], r["site"]), []).append(r)
    sites_out, steps, table = [], {}, []
    for (model, M, prec, site), rs in by.items():
        best = min(rs, key=lambda r: r["us"])
        cur = next((r for r in rs if r["tag"] == "current"), None)
        rule = next((r for r in rs if r["tag"] == "rule"), None)
        best_gemv = min((r for r in rs if r["cfg"]["kind"] == "gemv"), key=lambda r: r["us"],
                        default=None)  # fmt: skip
        best_mma = min((r for r in rs if r["cfg"]["kind"] == "mma"), key=lambda r: r["us"],
                       default=None)  # fmt: skip
        n = best["count"]
        sites_out.append(dict(
            model=model, M=M, prec=prec, site=site, N=best["N"], K=best["K"], count=n,
            current_us=cur and cur["us"], current_gbs=cur and cur["gbs"],
            rule_us=rule and rule["us"], best_us=best["us"], best_gbs=best["gbs"],
            best_cfg=best["cfg"], best_gemv_us=best_gemv and best_gemv["us"],
            best_mma_us=best_mma and best_mma["us"], n_timed=len(rs),
        ))  # fmt: skip
        st = steps.setdefault(f"{model} M={M} {prec}", dict(current_us=0.0, rule_us=0.0,
                                                            best_us=0.0, missing=[]))  # fmt: skip
        if cur is None or rule is None:
            st["missing"].append(site)
        st["current_us"] += (cur["us"] if cur else float("nan")) * n
        st["rule_us"] += (rule["us"] if rule else float("nan")) * n
        st["best_us"] += best["us"] * n
        c = best["cfg"]
        table.append(
            f'("{site}", {M}, {best["N"]}, {best["K"]}, "{prec}"): LinearConfig('
            f"{c['block_m']}, {c['block_n']}, {c['block_k']}, {c['split_k']}, {c['num_warps']}, "
            f'{c["num_stages"]}, "{c["kind"]}", swap={c["swap"]}, fast_cvt={c["fast_cvt"]}),'
            f"  # {best['us']} us, {best['gbs']} GB/s"
        )
    for st in steps.values():
        for k in ("current_us", "rule_us", "best_us"):
            st[k] = round(st[k], 1)
    return dict(sites=sites_out, predicted_step_linear_us=steps, table=sorted(table))


def report(doc: dict):
    print(f"{'model':14s} {'M':>3s} {'prec':5s} {'site':5s} {'N':>7s} {'K':>5s} {'x':>3s} "
          f"{'cur us':>8s} {'rule us':>8s} {'best us':>8s} {'GB/s':>7s}  best cfg")  # fmt: skip
    for r in sorted(doc["sites"], key=lambda r: (r["model"], r["M"], r["prec"], r["site"])):
        c = r["best_cfg"]
        cs = (f"{c['kind']} {c['block_m']}x{c['block_n']}x{c['block_k']} s{c['split_k']} "
              f"w{c['num_warps']} st{c['num_stages']}{' swap' if c['swap'] else ''}"
              f"{'' if c['fast_cvt'] else ' i2f'}")  # fmt: skip
        f = lambda v: f"{v:8.1f}" if v is not None else f"{'-':>8s}"  # noqa: E731
        print(f"{r['model']:14s} {r['M']:3d} {r['prec']:5s} {r['site']:5s} {r['N']:7d} "
              f"{r['K']:5d} {r['count']:3d} {f(r['current_us'])} {f(r['rule_us'])} "
              f"{f(r['best_us'])} {r['best_gbs']:7.0f}  {cs}")  # fmt: skip
    print("predicted linear time of one decode step (us, site us x count summed):")
    for k, st in doc["predicted_step_linear_us"].items():
        print(f"  {k:28s} current {st['current_us']:8.1f}  rule {st['rule_us']:8.1f}  "
              f"best {st['best_us']:8.1f}" + (f"  (missing {st['missing']})" if st["missing"] else ""))  # fmt: skip
    print("DECODE_TABLE lines (src/zoi/backends/cuda/kernels/linear_table.py):")
    for line in doc["table"]:
        print("    " + line)


if __name__ == "__main__":
    try:
        main()
    except Exception:
        traceback.print_exc()
        sys.exit(1)
