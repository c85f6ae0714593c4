"""Summary of scripts/bench_multigpu.sh: two GPUs against one, per serving path and concurrency.

Reads the `zoi bench serve` rows (JSON lines); a row's path is its target (zoi, triton, ray)
and its GPU count the digits after the last "-g" of its model name (zoi-g01, zoi-1i-g0,
ray-g01: the names bench_multigpu.sh and zoi.integrations.targets give). Per path and
concurrency: texts/s and p99 of each GPU count (the median over cycles), the ratio 2 / 1 and
whether it meets the target (>= 1.8x throughput, p99 no worse).
Usage: python scripts/bench_multigpu_summary.py ROWS.jsonl [--skipped FILE] [--out SUMMARY.json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time

TARGET = 1.8


def gpu_count(model: str) -> int | None:
    m = re.search(r"-g(\d+)$", model or "")
    return len(m.group(1)) if m else None


def summarize(rows: list[dict]) -> dict:
    cells: dict = {}
    for r in rows:
        n = gpu_count(r.get("model", ""))
        if n is None:
            continue
        key = (r.get("target") or "zoi", int(r["concurrency"]))
        cells.setdefault(key, {}).setdefault(n, []).append(r)
    out: dict = {}
    for (path, conc), by_n in sorted(cells.items()):
        entry: dict = {}
        for n, rs in sorted(by_n.items()):
            entry[f"{n}gpu"] = {
                "texts_per_s": statistics.median(x["texts_per_s"] for x in rs),
                "p99_ms": statistics.median(x["p99_ms"] for x in rs),
                "p50_ms": statistics.median(x["p50_ms"] for x in rs),
                "errors": sum(int(x.get("errors", 0)) for x in rs),
                "runs": len(rs),
                "model": rs[0].get("model"),
            }
        one, two = entry.get("1gpu"), entry.get("2gpu")
        if one and two and one["texts_per_s"] > 0:
            ratio = two["texts_per_s"] / one["texts_per_s"]
            entry["speedup_2_vs_1"] = round(ratio, 3)
            entry["p99_no_worse"] = two["p99_ms"] <= one["p99_ms"]
            entry["target_met"] = ratio >= TARGET and entry["p99_no_worse"] and two["errors"] == 0
        out.setdefault(path, {})[str(conc)] = entry
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("rows")
    ap.add_argument("--skipped", default=None)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    rows = []
    if os.path.exists(a.rows):
        with open(a.rows, encoding="utf-8") as f:
            rows = [json.loads(ln) for ln in f if ln.strip()]
    skipped = []
    if a.skipped and os.path.exists(a.skipped):
        skipped = [ln.strip() for ln in open(a.skipped, encoding="utf-8") if ln.strip()]
    summary = summarize(rows)
    doc = {
        "issue": 18,
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "loadavg": os.getloadavg(),
        "target": f">= {TARGET}x texts/s with 2 GPUs vs 1, p99 no worse",
        "rows_file": a.rows,
        "summary": summary,
        "skipped": skipped,
    }
    for path, by_c in summary.items():
        for c, e in by_c.items():
            one, two = e.get("1gpu", {}), e.get("2gpu", {})
            print(
                f"{path:7s} c={c:>4}  1 GPU {one.get('texts_per_s', 0):9.1f} texts/s p99 "
                f"{one.get('p99_ms', 0):8.1f} ms | 2 GPUs {two.get('texts_per_s', 0):9.1f} texts/s "
                f"p99 {two.get('p99_ms', 0):8.1f} ms | x{e.get('speedup_2_vs_1', float('nan')):.2f}"
                f" {'MET' if e.get('target_met') else 'not met' if 'target_met' in e else ''}",
                file=sys.stderr,
            )
    for s in skipped:
        print(f"skipped: {s}", file=sys.stderr)
    if a.out:
        with open(a.out, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
