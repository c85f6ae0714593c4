"""Write lab/gpu/sweep_gemv.py's winners into src/zoi/decoder/cuda/linear_table.py's DECODE_TABLE.

Usage: python scripts/apply_gemv_table.py SWEEP.json   (the sweep's --out; run on the GPU that
was swept, e.g. by scripts/gpu_check.sh, then commit the edited table with the sweep's JSON)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

TABLE = Path(__file__).resolve().parents[1] / "src/zoi/decoder/cuda/linear_table.py"


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
    rows = "".join(f"    {ln.strip()}\n" for ln in lines)
    body = "# fmt: off\n" + head + "\n" + rows + "}\n# fmt: on\n"  # one line per entry
    TABLE.write_text(src[: m.start()] + body + src[m.end() :])
    print(f"DECODE_TABLE: {len(lines)} entries from {argv[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
