"""``zoi bench``: every provider in its own process, rounds interleaved, one JSON per run."""

from __future__ import annotations

import contextlib
import datetime as dt
import fnmatch
import json
import math
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from rich.markup import escape

from zoi.bench import models as M
from zoi.bench import sysinfo
from zoi.bench import workloads as W
from zoi.bench.providers import BY_NAME, SPECS, Spec, isa_env, missing
from zoi.bench.runner import WorkerError, WorkerProc
from zoi.bench.text import Tok, eval_sentences
from zoi.bench.worker import save_seqs

SCHEMA = "zoi-bench/1"


@dataclass
class Config:
    quick: bool = False
    device: str = "auto"  # cpu | cuda | all | auto (cpu, plus cuda when torch sees a GPU)
    providers: list[str] | None = None  # fnmatch patterns on provider names
    workloads: list[str] | None = None
    threads: int = 2
    calls: int = 200  # timed calls per cell (at least)
    calls_slow: int = 20  # when a call takes over `slow_ms`
    slow_ms: float = 100.0
    rounds: int = 10  # interleaved rounds the calls are split into
    warmup_s: float = 1.0
    warmup_min_calls: int = 3
    accuracy_n: int = 500  # real sentences (0: skip)
    rss: bool = True  # peak RSS of a fresh process per provider and model
    load_threshold: float = 0.3  # foreign cores tolerated before a workload starts
    load_wait_s: float = 120.0
    cache_dir: Path | None = None
    out_dir: Path | None = None
    out_file: Path | None = None
    argv: list[str] = field(default_factory=list)
    peer_isa: str = "native"  # "avx2": cap the peers' ISA where each library allows it


def repo_root() -> Path | None:
    for p in [Path.cwd(), *Path.cwd().parents]:
        if (p / "pyproject.toml").exists() and (p / "src" / "zoi").exists():
            return p
    here = Path(__file__).resolve()
    for p in here.parents:
        if (p / "pyproject.toml").exists():
            return p
    return None


def default_out_dir() -> Path:
    root = repo_root()
    return (root if root else Path.cwd()) / "bench" / "results"


def pct(xs: np.ndarray, q: float) -> float:
    return float(np.percentile(xs, q, method="linear"))


def cuda_available() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:
        return False


def accuracy(ref: np.ndarray, emb: np.ndarray, k: int = 10) -> dict:
    """Cosine of each embedding against the reference (mean, min) and top-``k`` neighbour
    agreement (mean fraction of each sentence's k nearest neighbours that both agree on)."""
    a = ref / np.maximum(np.linalg.norm(ref, axis=1, keepdims=True), 1e-12)
    b = emb / np.maximum(np.linalg.norm(emb, axis=1, keepdims=True), 1e-12)
    cos = (a * b).sum(1)
    sa, sb = a @ a.T, b @ b.T
    np.fill_diagonal(sa, -np.inf)
    np.fill_diagonal(sb, -np.inf)
    k = min(k, len(a) - 1)
    ta = np.argpartition(-sa, k, axis=1)[:, :k]
    tb = np.argpartition(-sb, k, axis=1)[:, :k]
    agree = np.mean([len(set(x) & set(y)) / k for x, y in zip(ta, tb, strict=True)])
    return {
        "n": int(len(a)),
        "cos_mean": float(cos.mean()),
        "cos_min": float(cos.min()),
        "top10": float(agree),
    }


class Bench:
    def __init__(self, cfg: Config, console=None):
        from rich.console import Console

        self.cfg = cfg
        self.con = console or Console(stderr=True)
        self.cache = Path(cfg.cache_dir or M.default_cache_dir())
        self.tmp = Path(tempfile.mkdtemp(prefix="zoi-bench-"))
        self.status: dict[str, dict] = {}  # provider -> {"status","reason",...}
        self.rows: list[dict] = []
        self.memory: list[dict] = []
        self.acc: list[dict] = []
        self.loads: list[dict] = []
        self.refusals: list[dict] = []  # (provider, model) pairs a peer could not convert
        self.phases: dict[str, float] = {}  # wall seconds spent per phase

    @contextlib.contextmanager
    def phase(self, name: str):
        t = time.perf_counter()
        try:
            yield
        finally:
            self.phases[name] = round(self.phases.get(name, 0.0) + time.perf_counter() - t, 2)

    # -- selection ------------------------------------------------------------------------
    def devices(self) -> set[str]:
        d = self.cfg.device
        if d == "auto":
            return {"cpu", "cuda"} if cuda_available() else {"cpu"}
        if d == "all":
            return {"cpu", "cuda"}
        return {d}

    def specs(self, devices: set[str]) -> list[Spec]:
        out = []
        for s in SPECS:
            pats = self.cfg.providers
            if pats and not any(fnmatch.fnmatch(s.name, p) for p in pats):
                continue
            if not s.default and not (pats and s.name in pats):
                continue
            if s.device not in devices:
                continue
            why = missing(s)
            if s.device == "cuda" and not why and not cuda_available():
                why = "no CUDA GPU visible to torch"
            if why:
                self.skip(s.name, why)
                continue
            out.append(s)
        return out

    def skip(self, name: str, why: str, status: str = "skipped") -> None:
        first = why.strip().splitlines()[0] if why.strip() else why
        self.status[name] = {"status": status, "reason": why.strip()[-2000:]}
        self.con.print(f"[yellow]{status}[/] {name}: {escape(first[:300])}")

    # -- main -------------------------------------------------------------------------------
    def run(self) -> dict:
        cfg = self.cfg
        t_start = time.time()
        devices = self.devices()
        wls = W.select(cfg.workloads, cfg.quick, devices)
        specs = self.specs(devices)
        meter = sysinfo.LoadMeter()
        load_start = sysinfo.loadavg()
        self.con.print(
            f"zoi bench: {len(specs)} providers, {len(wls)} workloads, "
            f"{cfg.threads} threads, cache {self.cache}"
        )
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        by_model: dict[str, list[W.Workload]] = {}
        for w in wls:
            by_model.setdefault(w.model, []).append(w)
        n_steps = sum(len(v) for v in by_model.values()) * max(1, len(specs))
        n_steps += len(by_model) * len(specs) * (1 + int(cfg.rss))
        mrefs: dict[str, M.ModelRef] = {}
        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total}"),
            TimeElapsedColumn(),
            console=self.con,
            transient=False,
        ) as prog:
            task = prog.add_task("bench", total=n_steps)
            self.prog, self.task = prog, task
            for model_name, mwls in by_model.items():
                prog.update(task, description=f"{model_name}: model + conversions")
                with self.phase("convert"):
                    model = mrefs[model_name] = M.get_model(model_name, self.cache)
                    arts = self.convert_all(model, specs)
                self.refusal_rows(model, mwls, [s for s in specs if s.name not in arts])
                self.run_model(model, mwls, [s for s in specs if s.name in arts], arts, meter)
            prog.update(task, description="done")
        result = self.result(wls, specs, mrefs, load_start, t_start)
        shutil.rmtree(self.tmp, ignore_errors=True)
        return result

    def step(self, desc: str | None = None) -> None:
        self.prog.update(self.task, advance=1, **({"description": desc} if desc else {}))

    def convert_all(self, model: M.ModelRef, specs: list[Spec]) -> dict[str, dict]:
        import importlib

        arts = {}
        for s in specs:
            if self.status.get(s.name, {}).get("status") in ("skipped", "failed"):
                continue
            self.prog.update(self.task, description=f"{model.name}: preparing {s.name}")
            try:
                cls = getattr(importlib.import_module(s.module), s.cls)
                arts[s.name] = cls.convert(s, model, self.cache)
            except Exception as e:  # a peer whose conversion fails is reported, not fatal
                self.refuse(s.name, model.name, f"{type(e).__name__}: {e}")
        return arts

    def refuse(self, name: str, model: str, why: str) -> None:
        """A peer that cannot take this model (CTranslate2 has no MPNet converter, ...): recorded
        per model in ``refusals``; the provider still runs the other models."""
        self.refusals.append({"provider": name, "model": model, "reason": why.strip()[-2000:]})
        first = why.strip().splitlines()[0] if why.strip() else why
        self.con.print(f"[yellow]refused[/] {name} on {model}: {escape(first[:300])}")

    def refusal_rows(self, model: M.ModelRef, mwls: list[W.Workload], specs: list[Spec]) -> None:
        """An error row per workload of ``model`` for each provider that could not convert it
        (the table shows the cell, the row says why); providers skipped before this model
        (not installed, failed on an earlier model) are left out."""
        for s in specs:
            why = next(
                (
                    x["reason"]
                    for x in self.refusals
                    if (x["provider"], x["model"]) == (s.name, model.name)
                ),
                None,
            )
            if why is None:
                continue
            for w in mwls:
                if s.device in w.devices and (w.text or not s.texts_only):
                    self.rows.append(
                        {
                            "provider": s.name,
                            "workload": w.name,
                            "error": f"conversion: {why}"[:2000],
                        }
                    )
                    self.step()

    def limits(self, model: M.ModelRef, seqs_by_wl: dict[str, list]) -> tuple[int, int]:
        """(max_tokens, max_batch) that hold every token-id workload of this model in one
        call. The text workloads do not count: zoi's encode chunks by its own token budget
        and the peers batch themselves (with text workloads only: 4096 tokens, 256 texts)."""
        if not seqs_by_wl:
            return max(4096, model.max_len), 256
        need = max(sum(len(s) for s in seqs) for seqs in seqs_by_wl.values())
        batch = max(len(seqs) for seqs in seqs_by_wl.values())
        return max(need, model.max_len), max(batch, 32)

    def start(
        self, s: Spec, model: M.ModelRef, arts: dict, limits: tuple[int, int], meter
    ) -> WorkerProc:
        max_tokens, max_batch = limits
        env, _ = isa_env(s, self.cfg.peer_isa)
        wp = WorkerProc(self.cfg.threads, self.tmp / f"{s.name}-{model.name}.log", env)
        meter.add(wp.pid)
        rep = wp.request(
            op="load",
            provider=s.name,
            model_dir=str(model.path),
            artifacts=arts,
            threads=self.cfg.threads,
            max_tokens=max_tokens,
            max_batch=max_batch,
        )
        wp.load_s = rep["load_s"]
        return wp

    def run_model(self, model, mwls, specs, arts, meter) -> None:
        cfg = self.cfg
        tok = Tok(model.path)
        files, seqs_by_wl = {}, {}
        texts_by_wl = {}
        for i, w in enumerate(W.ALL):
            if w in mwls and w.text:
                texts = texts_by_wl[w.name] = W.inputs(w, tok, i)
                seqs_by_wl[w.name] = tok.encode(texts, model.max_len)  # for the limits only
                files[w.name] = str(self.tmp / f"{w.name}.json")
                Path(files[w.name]).write_text(json.dumps(texts), encoding="utf-8")
            elif w in mwls:
                seqs = seqs_by_wl[w.name] = W.inputs(w, tok, i, vocab=model.vocab)
                files[w.name] = str(self.tmp / f"{w.name}.npz")
                save_seqs(files[w.name], seqs)
        limits = self.limits(model, {k: v for k, v in seqs_by_wl.items() if k not in texts_by_wl})
        if not texts_by_wl:
            for s in [s for s in specs if s.texts_only]:
                self.skip(s.name, "runs the text workloads only (none selected)")
            specs = [s for s in specs if not s.texts_only]
        acc_file = None
        if cfg.accuracy_n and model.name == "minilm":
            sents, src = eval_sentences(cfg.accuracy_n)
            self.acc_source = src
            acc_file = str(self.tmp / "accuracy.npz")
            save_seqs(acc_file, tok.encode(sents, model.max_len))
        workers: dict[str, WorkerProc] = {}
        load_s: dict[str, float] = {}
        try:
            for s in specs:
                self.prog.update(self.task, description=f"{model.name}: loading {s.name}")
                try:
                    with self.phase("load"):
                        workers[s.name] = self.start(s, model, arts[s.name], limits, meter)
                    load_s[s.name] = workers[s.name].load_s
                except WorkerError as e:
                    self.skip(s.name, f"load failed ({model.name}): {e}", "failed")
            for w in mwls:
                active = {
                    n: wp
                    for n, wp in workers.items()
                    if BY_NAME[n].device in w.devices and (w.text or not BY_NAME[n].texts_only)
                }
                with self.phase(f"time {w.name}"):
                    self.time_workload(w, active, files[w.name], seqs_by_wl[w.name], meter)
            for n, wp in workers.items():
                mem = {"provider": n, "model": model.name, "load_s": round(load_s[n], 3)}
                try:
                    rep = wp.request(op="memory")
                    mem.update({k: v for k, v in rep["provider"].items()})
                    mem["worker_rss_bytes_after_run"] = rep["status"].get("VmRSS")
                except WorkerError as e:
                    mem["error"] = str(e)[:500]
                if acc_file and not BY_NAME[n].texts_only:
                    self.prog.update(self.task, description=f"accuracy: {n}")
                    out = str(self.tmp / f"emb-{n}.npy")
                    try:
                        with self.phase("accuracy"):
                            wp.request(op="embed", file=acc_file, out=out, batch=32)
                    except WorkerError as e:
                        self.con.print(
                            f"[red]accuracy failed[/] {n}: {escape(str(e).splitlines()[0])}"
                        )
                self.memory.append(mem)
                self.step()
        finally:
            for wp in workers.values():
                wp.close()
        if acc_file:
            self.compare_embeddings(list(workers))
        if cfg.rss:
            with self.phase("peak rss"):
                ids_files = {k: f for k, f in files.items() if k not in texts_by_wl}
                rss_specs = [s for s in specs if s.name in workers and not s.texts_only]
                if ids_files:
                    self.fresh_rss(model, rss_specs, arts, limits, ids_files, meter)

    def time_workload(self, w, active, file, seqs, meter) -> None:
        cfg = self.cfg
        n_seqs, n_tok = len(seqs), int(sum(len(s) for s in seqs))
        self.prog.update(self.task, description=f"{w.name}: waiting for a quiet machine")
        guard = meter.wait_quiet(cfg.load_threshold, cfg.load_wait_s, log=self.con.print)
        ok = {}
        for n, wp in active.items():
            self.prog.update(self.task, description=f"{w.name}: warm-up {n}")
            nb = 1 if n.startswith("zoi-") else w.peer_batches
            try:
                wp.request(
                    op="prepare", key=w.name, file=file, n_batches=nb, n_seqs=n_seqs, text=w.text
                )
                rep = wp.request(
                    op="time", key=w.name, n=10**6, seconds=cfg.warmup_s, min_n=cfg.warmup_min_calls
                )
                ok[n] = float(np.median(rep["ns"][-3:])) / 1e6
            except WorkerError as e:
                self.rows.append({"provider": n, "workload": w.name, "error": str(e)[:2000]})
                self.con.print(
                    f"[red]failed[/] {n} on {w.name}: {escape(str(e).splitlines()[0][:300])}"
                )
                self.step()
        if not ok:
            return
        # calls per provider: >= calls, or >= calls_slow for calls over slow_ms
        want = {n: (cfg.calls if ms <= cfg.slow_ms else cfg.calls_slow) for n, ms in ok.items()}
        rounds = max(1, min(cfg.rounds, min(want.values())))
        per = {n: math.ceil(k / rounds) for n, k in want.items()}
        ns: dict[str, list[int]] = {n: [] for n in ok}
        names = list(ok)
        meter.start()
        t0 = time.perf_counter()
        failed = set()
        for r in range(rounds):
            order = names[r % len(names) :] + names[: r % len(names)]  # rotate who goes first
            self.prog.update(self.task, description=f"{w.name}: round {r + 1}/{rounds}")
            for n in order:
                if n in failed:
                    continue
                try:
                    ns[n] += active[n].request(op="time", key=w.name, n=per[n], settle=0.02)["ns"]
                except WorkerError as e:
                    failed.add(n)
                    self.rows.append({"provider": n, "workload": w.name, "error": str(e)[:2000]})
        foreign = meter.stop()
        wall = time.perf_counter() - t0
        self.loads.append(
            {
                "workload": w.name,
                "foreign_cores": round(foreign, 3),
                "wall_s": round(wall, 2),
                **{f"before_{k}": v for k, v in guard.items()},
            }
        )
        if foreign > cfg.load_threshold:
            self.con.print(
                f"[yellow]warning[/] {w.name}: other processes used {foreign:.2f} cores "
                "during the measurement"
            )
        for n in names:
            if n not in failed:
                arr = np.asarray(ns[n], dtype=np.float64) / 1e6
                p50 = pct(arr, 50)
                self.rows.append(
                    {
                        "provider": n,
                        "workload": w.name,
                        "model": w.model,
                        "batch": n_seqs,
                        "seq": w.seq,
                        "tokens": n_tok,
                        "calls": int(arr.size),
                        "p50_ms": p50,
                        "p99_ms": pct(arr, 99),
                        "mean_ms": float(arr.mean()),
                        "min_ms": float(arr.min()),
                        "max_ms": float(arr.max()),
                        "throughput_seq_s": n_seqs / (p50 / 1e3),
                        "tokens_s": n_tok / (p50 / 1e3),
                        "padded_batches": 1 if n.startswith("zoi-") else w.peer_batches,
                    }
                )
            try:
                active[n].request(op="drop", key=w.name)
            except WorkerError:
                pass
            self.step()

    def compare_embeddings(self, names: list[str]) -> None:
        embs = {}
        for n in names:
            f = self.tmp / f"emb-{n}.npy"
            if f.exists():
                embs[n] = np.load(f)
        ref = "torch-fp32" if "torch-fp32" in embs else None  # the FP32 original
        for n, e in embs.items():
            spec = BY_NAME[n]
            r = ref or (f"{spec.family}-fp32" if f"{spec.family}-fp32" in embs else None)
            if r is None or r == n:
                continue
            self.acc.append(
                {"provider": n, "reference": r, "precision": spec.precision, **accuracy(embs[r], e)}
            )

    def fresh_rss(self, model, specs, arts, limits, files, meter) -> None:
        """Peak RSS (VmHWM) of a fresh process that loads the provider and runs the 1x128
        workload of this model (or the model's first workload when 1x128 is not selected)."""
        key = f"{model.name}-1x128"
        if key not in files:
            key = next(iter(files))
        seqs_n = int(np.load(files[key])["cu"].size - 1)
        for s in specs:
            self.prog.update(self.task, description=f"peak RSS: {s.name} {model.name}")
            wp = None
            try:
                wp = self.start(s, model, arts[s.name], limits, meter)
                nb = 1
                wp.request(op="prepare", key=key, file=files[key], n_batches=nb, n_seqs=seqs_n)
                wp.request(op="time", key=key, n=5)
                st = wp.request(op="memory")["status"]
                for m in self.memory:
                    if m["provider"] == s.name and m["model"] == model.name:
                        m["peak_rss_bytes"] = st.get("VmHWM")
                        m["peak_rss_workload"] = key
            except WorkerError as e:
                self.con.print(
                    f"[red]RSS run failed[/] {s.name}: {escape(str(e).splitlines()[0][:300])}"
                )
            finally:
                if wp:
                    wp.close()
            self.step()

    def isa_fields(self, s: Spec) -> dict:
        """What --peer-isa did to this provider: the environment its worker got and the
        restriction it stands for (or "native ISA" where the library has none)."""
        env, what = isa_env(s, self.cfg.peer_isa)
        if what is None:
            return {}
        return {"isa_restriction": what, "isa_env": env}

    # -- the result file -----------------------------------------------------------------
    def result(self, wls, specs, mrefs, load_start, t_start) -> dict:
        cfg = self.cfg
        for r in self.rows:  # speed-up over the device's baseline, within this run
            if "p50_ms" not in r:
                continue
            dev = BY_NAME[r["provider"]].device
            text = next((w.text for w in W.ALL if w.name == r["workload"]), False)
            base = next(
                (
                    s.name
                    for s in SPECS
                    if (s.text_baseline if text else s.baseline) and s.device == dev
                ),
                None,
            )
            b = next(
                (
                    x
                    for x in self.rows
                    if x["provider"] == base and x["workload"] == r["workload"] and "p50_ms" in x
                ),
                None,
            )
            r["baseline"] = base if b else None
            r["speedup"] = (b["p50_ms"] / r["p50_ms"]) if b else None
        for s in specs:
            ran = any(r.get("provider") == s.name and "p50_ms" in r for r in self.rows)
            why = "; ".join(
                f"{x['model']}: {x['reason'].splitlines()[0][:300]}"
                for x in self.refusals
                if x["provider"] == s.name
            )
            if why and not ran:
                self.status.setdefault(s.name, {"status": "failed", "reason": why})
            self.status.setdefault(s.name, {"status": "ok", "reason": None})
        providers = [
            {
                "name": s.name,
                "label": s.label,
                "device": s.device,
                "precision": s.precision,
                "baseline": s.baseline,
                **self.status.get(s.name, {"status": "not selected"}),
                **self.isa_fields(s),
            }
            for s in SPECS
            if s.name in self.status
        ]
        root = repo_root()
        cpu = sysinfo.cpu_info()
        zoi_env = next((isa_env(s, cfg.peer_isa)[0] for s in specs if s.family == "zoi"), {}).get(
            "ZOI_CPU_ISA"
        )
        if zoi_env:  # --peer-isa set zoi's ISA explicitly (the caller had not)
            cpu["zoi_isa"] = zoi_env
        return {
            "schema": SCHEMA,
            "created_utc": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "command": " ".join(cfg.argv) if cfg.argv else "zoi bench",
            "quick": cfg.quick,
            "duration_s": round(time.time() - t_start, 1),
            "phases_s": self.phases,
            "machine": {
                "cpu": cpu,
                "gpu": sysinfo.gpu_info(),
                "threads": cfg.threads,
            },
            "versions": sysinfo.versions(),
            "git": sysinfo.git_info(root) if root else {"commit": None, "dirty": None},
            "settings": {
                "peer_isa": cfg.peer_isa,
                "zoi_cpu_isa_env": os.environ.get("ZOI_CPU_ISA"),
                "calls": cfg.calls,
                "calls_slow": cfg.calls_slow,
                "slow_ms": cfg.slow_ms,
                "rounds": cfg.rounds,
                "warmup_s": cfg.warmup_s,
                "warmup_min_calls": cfg.warmup_min_calls,
                "threads": cfg.threads,
                "accuracy_n": cfg.accuracy_n,
                "load_threshold_cores": cfg.load_threshold,
                "timing": "caller-observed: token ids in host memory -> pooled float32 [B,H] in host memory; "
                "text workloads: texts in host memory -> float32 [B,H] in host memory, tokenisation included "
                "(tokenizer-* rows: texts -> ids only)",
            },
            "load": {
                "loadavg_start": load_start,
                "loadavg_end": sysinfo.loadavg(),
                "per_workload": self.loads,
            },
            "models": {
                k: {"path": str(v.path), "hidden": v.hidden, "layers": v.layers}
                for k, v in mrefs.items()
            },
            "workloads": [w.to_json() for w in wls],
            "providers": providers,
            "refusals": self.refusals,
            "results": self.rows,
            "memory": self.memory,
            "accuracy": {"source": getattr(self, "acc_source", None), "rows": self.acc},
        }


def write(result: dict, cfg: Config) -> Path:
    if cfg.out_file:
        path = Path(cfg.out_file)
    else:
        out = Path(cfg.out_dir or default_out_dir())
        stamp = result["created_utc"].replace(":", "").replace("-", "")[:15]
        gpu = result["machine"]["gpu"]
        kind = (
            "gpu"
            if gpu and any(r.get("provider", "").find("cuda") >= 0 for r in result["results"])
            else "cpu"
        )
        path = out / f"{stamp}_{kind}{'_quick' if result['quick'] else ''}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1, default=float) + "\n")
    return path


def main(cfg: Config) -> int:
    b = Bench(cfg)
    res = b.run()
    path = write(res, cfg)
    from zoi.bench.report import print_report

    print_report(res, b.con)
    b.con.print(f"results: {path}")
    ok = [r for r in res["results"] if "p50_ms" in r]
    return 0 if ok else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(Config(quick=True)))
