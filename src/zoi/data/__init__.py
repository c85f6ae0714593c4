"""Text shipped with zoi: a calibration set and a disjoint evaluation set.

Both files were written for this project by its authors (one sentence or short paragraph a
line, varied topics and lengths) and are released under CC0 1.0: no third-party text.
`calibration.txt` (519 lines) is what `zoi compile --precision int8` calibrates on by
default; `eval.txt` (>= 500 lines, no line in common with the calibration set) is what
`zoi eval` measures on, and was never used to choose any quantisation setting.
"""

from __future__ import annotations

from pathlib import Path

DATA_DIR = Path(__file__).resolve().parent
CALIBRATION = DATA_DIR / "calibration.txt"
EVAL = DATA_DIR / "eval.txt"


def read_lines(path: str | Path) -> list[str]:
    """Non-empty, stripped lines of a UTF-8 text file (one text per line)."""
    with open(path, encoding="utf-8") as f:
        return [s.strip() for s in f if s.strip()]


def calibration_texts() -> list[str]:
    return read_lines(CALIBRATION)


def eval_texts() -> list[str]:
    return read_lines(EVAL)
