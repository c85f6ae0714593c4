"""Write lab/gpu/sweep_gemv.py's winners into src/zoi/backends/cuda/kernels/linear_table.py's DECODE_TABLE.

Usage: python scripts/apply_gemv_table.py SWEEP.json   (the sweep's --out; run on the GPU that
was swept, e.g. by scripts/gpu_check.sh, then commit the edited table with the sweep's JSON).
The sweep's entries replace those of the same (site, M, N, K, dtype); the table's other entries
stay (a sweep of one model or one M bucket leaves the rest of the table as it was)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

TABLE = Path(__file__).resolve().parents[1] / "src/zoi/backends/cuda/kernels/linear_table.py"


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__)
        return 2
    lines = json.loads(Path(argv[0]).read_text()).get("table") or []
    if not lines:
        print(f"{argv[0]}: no table lines (the sweep timed nothing): DECODE_TABLE left as it is")
        return 1
    src = TABLE.read_text()
    head = "DECODE_TABLE: dict[tuple[str, int, int, int, str], LinearConfig] = {"
    m = re.search(r"(# fmt: off\n)?" + re.escape(head) + r".*?\n?}\n(# fmt: on\n)?", src, re.S)
    if m is None:
        print(f"{TABLE}: DECODE_TABLE declaration not found")
        return 1
    key = re.compile(r"^\s*(\([^)]*\)):")
    merged = {}
    for ln in m.group(0).splitlines()[2:]:  # the entries now in the table (after # fmt / head)
        k = key.match(ln)
        if k:
            merged[k.group(1)] = ln.strip()
    kept = len(merged)
    for ln in lines:
        k = key.match(ln)
        if k is None:
            print(f"{argv[0]}: not a table line: {ln!r}")
            return 1
        kept -= k.group(1) in merged
        merged[k.group(1)] = ln.strip()
    rows = "".join(f"    {merged[k]}\n" for k in sorted(merged))
    body = "# fmt: off\n" + head + "\n" + rows + "}\n# fmt: on\n"  # one line per entry
    TABLE.write_text(src[: m.start()] + body + src[m.end() :])
    print(f"DECODE_TABLE: {len(lines)} entries from {argv[0]}, {kept} kept from the table")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
