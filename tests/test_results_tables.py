"""docs/RESULTS.md's headline CPU tables and the README's ratios equal what
scripts/results_tables.py renders from the committed `zoi bench` result files they cite."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location(
        "results_tables", REPO / "scripts" / "results_tables.py"
    )
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def test_results_page_tables_equal_their_files():
    rt = _script()
    text = rt.PAGE.read_text(encoding="utf-8")
    new, missing = rt.updated(text)
    assert not missing, f"docs/RESULTS.md lacks the tables {missing}"
    assert new == text, "docs/RESULTS.md's results tables are stale: run scripts/results_tables.py"
    for table in rt.TABLES:  # each cites its files, which are committed
        for f in {c.file for c in table.columns}:
            assert (rt.RESULTS / f).is_file() and f"bench/results/{f}" in text


def test_readme_ratios_are_the_rendered_ones():
    rt = _script()
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    machines = {"amx": "Intel Xeon (AMX, Emerald Rapids class)", "zen3-avx2": "AMD EPYC Zen 3"}
    for table in rt.TABLES:
        row = next(
            ln for ln in readme.splitlines() if ln.startswith("| MiniLM INT8, texts in:")
            and machines[table.name] in ln
        )  # fmt: skip
        quoted = re.findall(r"(\d+\.\d+)x", row.split("|")[3])
        want = [f"{r:.2f}" for r in rt.ratios(table).values()]
        assert quoted == want, (table.name, row)


def test_render_reads_the_numbers(monkeypatch):
    """A changed figure in a file changes the table: its cell, the bold and the ratio."""
    rt = _script()
    table = next(t for t in rt.TABLES if t.name == "amx")
    real = rt.load

    def load(name):
        res = real(name)
        if name == table.ratio_file:
            for r in res["results"]:
                if (r["provider"], r["workload"]) == ("openvino-int8", "minilm-1x16"):
                    r["p50_ms"] = 0.315
        return res

    monkeypatch.setattr(rt, "load", load)
    row = next(ln for ln in rt.render(table).splitlines() if ln.startswith("| minilm 1x16 |"))
    assert row.startswith("| minilm 1x16 | 0.63 | **0.32** | 1.15 | 1.97 | 1.99x |"), row
