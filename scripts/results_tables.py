#!/usr/bin/env python3
"""Render docs/RESULTS.md's headline CPU tables from the committed `zoi bench` result files.

    python scripts/results_tables.py            # rewrite the tables in docs/RESULTS.md
    python scripts/results_tables.py --check    # exit 1 if a table differs from its files
    python scripts/results_tables.py --print    # print the tables (and the README ratios)

Each table sits between `<!-- results-table:begin NAME ... -->` and `<!-- results-table:end -->`
in docs/RESULTS.md and is rendered from the result files TABLES names: p50 ms per workload and
provider, the fastest INT8 figure of a row in bold, and zoi INT8 over the fastest INT8 peer
(the ratio the README's performance table quotes). A row's figures get two decimals, or one
when any of them is 100 ms or more. tests/test_results_tables.py runs the check, so the
tables cannot drift from the JSON they cite.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
PAGE = ROOT / "docs" / "RESULTS.md"
BEGIN = "<!-- results-table:begin"
END = "<!-- results-table:end -->"
ZOI = "zoi-cpu-int8"


@dataclass(frozen=True)
class Column:
    title: str
    file: str  # a result file of bench/results
    provider: str
    int8: bool = True  # in the race for bold and for the ratio
    aside: bool = False  # shown in parentheses: ran with other settings than its table's run


@dataclass(frozen=True)
class Table:
    name: str
    columns: tuple[Column, ...]
    ratio_title: str
    ratio_after: int  # the ratio column comes after this many figure columns
    ratio_file: str  # the run whose zoi INT8 and INT8 peers the ratio compares


ZEN3 = "20261203T1920_cpu_zen3_avx2.json"
AMX = "20261203T1505_cpu_amx.json"
AMX_AVX2 = "20261203T1510_cpu_peer-avx2.json"

TABLES = (
    Table(
        "zen3-avx2",
        (
            Column("zoi INT8", ZEN3, ZOI),
            Column("ONNX Runtime INT8", ZEN3, "onnxruntime-int8"),
            Column("CTranslate2 INT8", ZEN3, "ctranslate2-int8"),
            Column("OpenVINO INT8", ZEN3, "openvino-int8"),
            Column("zoi FP32", ZEN3, "zoi-cpu-fp32", int8=False),
            Column("ONNX Runtime FP32", ZEN3, "onnxruntime-fp32", int8=False),
            Column("PyTorch FP32", ZEN3, "torch-fp32", int8=False),
        ),
        "zoi / best INT8 peer",
        4,
        ZEN3,
    ),
    Table(
        "amx",
        (
            Column("zoi INT8 (amx)", AMX, ZOI),
            Column("OpenVINO INT8", AMX, "openvino-int8"),
            Column("ONNX Runtime INT8", AMX, "onnxruntime-int8"),
            Column("CTranslate2 INT8", AMX, "ctranslate2-int8"),
            Column("zoi INT8 (avx2)", AMX_AVX2, ZOI, int8=False),
            Column("CTranslate2 (avx2)", AMX_AVX2, "ctranslate2-int8", int8=False),
            Column("OpenVINO (avx2)", AMX_AVX2, "openvino-int8", int8=False),
            Column("(ONNX Runtime)", AMX_AVX2, "onnxruntime-int8", int8=False, aside=True),
        ),
        "zoi / best peer",
        4,
        AMX,
    ),
)


def load(name: str) -> dict:
    return json.loads((RESULTS / name).read_text(encoding="utf-8"))


def p50s(res: dict) -> dict[tuple[str, str], float]:
    return {(r["provider"], r["workload"]): r["p50_ms"] for r in res["results"] if "p50_ms" in r}


def workload_label(w: dict) -> str:
    label = w["name"].replace("-", " ")
    return f"{label} ({w['batch']} texts)" if w.get("kind") == "mixed" else label


def ratios(table: Table) -> dict[str, float]:
    """zoi INT8 over the fastest INT8 peer of the ratio's run, per workload."""
    res = load(table.ratio_file)
    t = p50s(res)
    peers = [c.provider for c in table.columns if c.int8 and c.file == table.ratio_file]
    peers = [p for p in peers if p != ZOI]
    out = {}
    for w in res["workloads"]:
        ps = [t[(p, w["name"])] for p in peers if (p, w["name"]) in t]
        if (ZOI, w["name"]) in t and ps:
            out[w["name"]] = t[(ZOI, w["name"])] / min(ps)
    return out


def render(table: Table) -> str:
    runs = {c.file: load(c.file) for c in table.columns}
    times = {f: p50s(r) for f, r in runs.items()}
    workloads = runs[table.ratio_file]["workloads"]
    ratio = ratios(table)
    head = [c.title for c in table.columns]
    head.insert(table.ratio_after, table.ratio_title)
    lines = [
        "| workload | " + " | ".join(head) + " |",
        "|---|" + "---|" * len(head),
    ]
    for w in workloads:
        vals = [times[c.file].get((c.provider, w["name"])) for c in table.columns]
        known = [v for v in vals if v is not None]
        digits = 1 if known and max(known) >= 100 else 2
        race = [v for v, c in zip(vals, table.columns, strict=True) if c.int8 and v is not None]
        best = min(race) if race else None
        cells = []
        for v, c in zip(vals, table.columns, strict=True):
            if v is None:
                cells.append("-")
                continue
            s = f"{v:.{digits}f}"
            if c.aside:
                s = f"({s})"
            elif c.int8 and v == best:
                s = f"**{s}**"
            cells.append(s)
        r = ratio.get(w["name"])
        cells.insert(table.ratio_after, f"{r:.2f}x" if r is not None else "-")
        lines.append(f"| {workload_label(w)} | " + " | ".join(cells) + " |")
    files = ", ".join(f"bench/results/{f}" for f in dict.fromkeys(c.file for c in table.columns))
    begin = f"{BEGIN} {table.name} generated by scripts/results_tables.py from {files} -->"
    return begin + "\n" + "\n".join(lines) + "\n" + END


def block_pattern(name: str) -> re.Pattern:
    return re.compile(re.escape(BEGIN) + rf" {re.escape(name)} .*?" + re.escape(END), re.S)


def updated(text: str) -> tuple[str, list[str]]:
    """The page with every table rendered anew, and the names of tables it lacks."""
    missing = []
    for table in TABLES:
        pat = block_pattern(table.name)
        if not pat.search(text):
            missing.append(table.name)
            continue
        block = render(table)
        text = pat.sub(lambda _, b=block: b, text, count=1)
    return text, missing


def main(argv: list[str]) -> int:
    if "--print" in argv:
        for table in TABLES:
            print(render(table))
            print(
                f"README ratios ({table.name}): "
                + " / ".join(f"{r:.2f}x" for r in ratios(table).values())
            )
        return 0
    text = PAGE.read_text(encoding="utf-8")
    new, missing = updated(text)
    if missing:
        print(f"{PAGE}: no results-table block named {missing}", file=sys.stderr)
        return 1
    if "--check" in argv:
        if new != text:
            print(
                "docs/RESULTS.md's results tables differ from their result files: "
                "run scripts/results_tables.py",
                file=sys.stderr,
            )
            return 1
        return 0
    PAGE.write_text(new, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
