"""``zoi bench plot``: PNGs drawn from result files (never from anything else).

For each result file ``X.json``: ``X_latency.png`` (p50 solid, p99 dashed, against batch
size at 128 tokens, one panel per model) and ``X_speedup.png`` (p50 speed-up over the
PyTorch FP32 baseline of the same run, per workload and provider).
"""

from __future__ import annotations

import json
from pathlib import Path

from zoi.bench.harness import SCHEMA, default_out_dir


def latest(results_dir: Path | None, kind: str | None = None, full: bool = True) -> Path:
    d = Path(results_dir or default_out_dir())
    files = sorted(f for f in d.glob("*.json") if _ours(f))  # other tools write there too
    if kind:
        files = [f for f in files if f"_{kind}" in f.stem]
    if full and any("_quick" not in f.stem for f in files):
        files = [f for f in files if "_quick" not in f.stem]
    if not files:
        raise FileNotFoundError(f"no result files in {d} (run `zoi bench` first)")
    return files[-1]


def _ours(f: Path) -> bool:
    try:
        return json.loads(f.read_text()).get("schema") == SCHEMA
    except (OSError, ValueError, AttributeError):
        return False


def _default_files() -> list[Path]:
    out = []
    for kind in ("cpu", "gpu"):
        try:
            out.append(latest(None, kind))
        except FileNotFoundError:
            pass
    if not out:
        out.append(latest(None))
    return out


def _style(names: list[str]) -> dict[str, dict]:
    import matplotlib.pyplot as plt

    cmap = plt.get_cmap("tab20")
    families = []
    for n in names:
        f = n.rsplit("-", 1)[0] if n.startswith(("zoi", "torch-cuda")) else n.split("-")[0]
        if f not in families:
            families.append(f)
    st = {}
    for n in names:
        f = n.rsplit("-", 1)[0] if n.startswith(("zoi", "torch-cuda")) else n.split("-")[0]
        i = families.index(f)
        # the light shade for the lower precision of a family: FP32 / INT8 on the CPU, FP16 /
        # INT8 on the GPU (a GPU family has no FP32, so FP16 takes the dark shade there)
        low = "int8" in n or ("fp16" in n and not n.startswith("zoi-cuda"))
        st[n] = {
            "color": cmap((2 * i + int(low)) % 20),
            "marker": "os^vD<>ph*"[i % 10],
            "lw": 2.6 if n.startswith("zoi") else 1.4,
        }
    return st


def plot_result(path: Path, out_dir: Path | None = None) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    res = json.loads(Path(path).read_text())
    if not isinstance(res, dict) or res.get("schema") != SCHEMA:
        raise ValueError(f"{path}: not a `zoi bench` result file (schema {SCHEMA})")
    out_dir = Path(out_dir or Path(path).parent)
    out_dir.mkdir(parents=True, exist_ok=True)
    labels = {p["name"]: p["label"] for p in res["providers"]}
    rows = [r for r in res["results"] if "p50_ms" in r]
    provs = [p["name"] for p in res["providers"] if any(r["provider"] == p["name"] for r in rows)]
    st = _style(provs)
    cpu = res["machine"]["cpu"]["model"]
    gpu = (res["machine"].get("gpu") or {}).get("name")
    where = f"{cpu}, {res['machine']['threads']} threads" + (f"; {gpu}" if gpu else "")
    stamp = f"{res['created_utc']} commit {(res['git'].get('commit') or '?')[:8]}"
    written = []

    # latency against batch size (seq 128)
    # every model measured at 128 tokens, in the run's order (MiniLM, BERT-base, the decoder
    # embedders' shapes, ...)
    models = [
        m
        for m in dict.fromkeys(r["model"] for r in rows)
        if any(r["model"] == m and r.get("seq") == 128 for r in rows)
    ]
    if models:
        fig, axes = plt.subplots(1, len(models), figsize=(6.5 * len(models), 5), squeeze=False)
        for ax, m in zip(axes[0], models, strict=True):
            for n in provs:
                pts = sorted(
                    (r["batch"], r["p50_ms"], r["p99_ms"])
                    for r in rows
                    if r["provider"] == n and r["model"] == m and r.get("seq") == 128
                )
                if not pts:
                    continue
                b, p50, p99 = zip(*pts, strict=True)
                s = st[n]
                ax.plot(
                    b, p50, marker=s["marker"], color=s["color"], lw=s["lw"], label=labels.get(n, n)
                )
                ax.plot(b, p99, ls="--", color=s["color"], lw=1.0, alpha=0.8)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("batch size (sequences of 128 tokens)")
            ax.set_ylabel("latency per call, ms (p50 solid, p99 dashed)")
            ax.set_title(f"{m}")
            ax.grid(True, which="both", alpha=0.3)
        axes[0][-1].legend(fontsize=7, loc="upper left", framealpha=0.6)
        fig.suptitle(f"zoi bench latency: {where}\n{stamp}", fontsize=9)
        fig.tight_layout()
        f = out_dir / f"{Path(path).stem}_latency.png"
        fig.savefig(f, dpi=110)
        plt.close(fig)
        written.append(f)

    # speed-up over the baseline (p50), per workload
    sp = [r for r in rows if r.get("speedup")]
    if sp:
        wls = [w["name"] for w in res["workloads"] if any(r["workload"] == w["name"] for r in sp)]
        pv = [n for n in provs if any(r["provider"] == n for r in sp)]
        fig, ax = plt.subplots(figsize=(max(8, 1.3 * len(wls) + 3), 6.5))
        width = 0.8 / max(1, len(pv))
        for i, n in enumerate(pv):
            xs, ys = [], []
            for j, w in enumerate(wls):
                r = next((r for r in sp if r["provider"] == n and r["workload"] == w), None)
                if r:
                    xs.append(j + (i - (len(pv) - 1) / 2) * width)
                    ys.append(r["speedup"])
            ax.bar(
                xs,
                ys,
                width,
                color=st[n]["color"],
                label=labels.get(n, n),
                edgecolor="black" if n.startswith("zoi") else None,
            )
        ax.axhline(1.0, color="black", lw=0.8)
        ax.set_yscale("log")
        ax.set_xticks(range(len(wls)))
        ax.set_xticklabels(wls, rotation=20, ha="right", fontsize=8)
        base = sorted({r["baseline"] for r in sp if r.get("baseline")})
        ax.set_ylabel(f"speed-up of p50 over {', '.join(labels.get(b, b) for b in base)}")
        ax.grid(True, axis="y", which="both", alpha=0.3)
        ax.legend(fontsize=7, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.22))
        fig.suptitle(f"zoi bench speed-up: {where}\n{stamp}", fontsize=9)
        fig.tight_layout()
        f = out_dir / f"{Path(path).stem}_speedup.png"
        fig.savefig(f, dpi=110)
        plt.close(fig)
        written.append(f)
    return written


def plot_files(files: list[Path] | None, out_dir: Path | None = None) -> list[Path]:
    out = []
    for f in files or _default_files():
        out += plot_result(Path(f), out_dir)
    return out
