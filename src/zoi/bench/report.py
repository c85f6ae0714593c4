"""The rich tables printed at the end of a run (and by ``zoi bench show``)."""

from __future__ import annotations

from rich.markup import escape


def _mb(x) -> str:
    return f"{x / 1e6:.0f}" if isinstance(x, (int, float)) else "-"


def print_report(res: dict, console=None) -> None:
    from rich.console import Console
    from rich.table import Table

    con = console or Console()
    labels = {p["name"]: p["label"] for p in res["providers"]}
    wls = [w["name"] for w in res["workloads"]]
    cells = {(r["provider"], r["workload"]): r for r in res["results"]}
    provs = [p["name"] for p in res["providers"] if p.get("status") == "ok"]
    peer_isa = (res.get("settings") or {}).get("peer_isa", "native")
    if peer_isa != "native":  # mark the rows whose library could not be capped
        for p in res["providers"]:
            if (p.get("isa_restriction") or "").startswith("native"):
                labels[p["name"]] = labels.get(p["name"], p["name"]) + " (native ISA)"

    t = Table(
        title="latency p50 / p99 (ms), speed-up over the baseline's p50"
        + (f"; peers capped at {peer_isa.upper()} (--peer-isa)" if peer_isa != "native" else ""),
        title_justify="left",
    )
    t.add_column("provider")
    for w in wls:
        t.add_column(w, justify="right")
    for n in provs:
        row = [labels.get(n, n)]
        for w in wls:
            r = cells.get((n, w))
            if r is None:
                row.append("")
            elif "p50_ms" not in r:
                row.append("[red]error")
            else:
                sp = f" x{r['speedup']:.2f}" if r.get("speedup") else ""
                extra = f"\n{r['tokens_s'] / 1e3:.1f}k tok/s" if w.endswith("mixed") else ""
                row.append(f"{r['p50_ms']:.2f} / {r['p99_ms']:.2f}{sp}{extra}")
        t.add_row(*row)
    con.print(t)

    if res.get("memory"):
        m = Table(title="memory (MB)", title_justify="left")
        for c in (
            "provider",
            "model",
            "weights",
            "arena",
            "peak RSS (fresh)",
            "GPU reserved",
            "load s",
        ):
            m.add_column(c, justify="left" if c in ("provider", "model") else "right")
        for r in res["memory"]:
            m.add_row(
                labels.get(r["provider"], r["provider"]),
                r["model"],
                _mb(r.get("weights_bytes")),
                _mb(r.get("arena_bytes")),
                _mb(r.get("peak_rss_bytes")),
                _mb(r.get("gpu_reserved_bytes")),
                f"{r.get('load_s', 0):.1f}",
            )
        con.print(m)

    if peer_isa != "native":  # what each provider was asked for, and what it reports it ran
        ran = {r["provider"]: r.get("isa") for r in res.get("memory") or [] if r.get("isa")}
        for p in res["providers"]:
            if p.get("isa_restriction"):
                got = f" -> ran: {ran[p['name']]}" if p["name"] in ran else ""
                con.print(f"ISA {p['name']}: {escape(p['isa_restriction'] + got)}")

    acc = res.get("accuracy", {}).get("rows") or []
    if acc:
        a = Table(
            title=f"accuracy vs FP32 ({acc[0]['n']} sentences, {res['accuracy'].get('source')})",
            title_justify="left",
        )
        for c in ("provider", "reference", "cos mean", "cos min", "top-10 agree"):
            a.add_column(c, justify="left" if c in ("provider", "reference") else "right")
        for r in acc:
            a.add_row(
                labels.get(r["provider"], r["provider"]),
                r["reference"],
                f"{r['cos_mean']:.4f}",
                f"{r['cos_min']:.4f}",
                f"{r['top10']:.3f}",
            )
        con.print(a)
    skipped = [p for p in res["providers"] if p.get("status") != "ok"]
    for p in skipped:
        reason = (p.get("reason") or "").splitlines()[0][:200] if p.get("reason") else ""
        con.print(f"[yellow]{p['status']}[/] {p['name']}: {escape(reason)}")
    load = res.get("load", {})
    fl = [x["foreign_cores"] for x in load.get("per_workload", [])]
    if fl:
        con.print(
            f"other load during measurement: max {max(fl):.2f} cores; loadavg start "
            f"{load.get('loadavg_start')} end {load.get('loadavg_end')}"
        )
