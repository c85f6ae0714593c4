"""Text shipped with zoi: calibration sets and disjoint held-out evaluation sets, per domain.

All files were written for this project by its authors (one text a line) and are released
under CC0 1.0: no third-party text. Domains (`DOMAINS`):

| domain | held-out (`zoi eval`) | calibration |
|---|---|---|
| prose | `eval.txt` (501 sentences / short paragraphs) | `calibration.txt` (519) |
| questions | `eval_questions.txt` (user questions) | `calib_questions.txt` |
| code | `eval_code.txt` (one-line snippets: Python, SQL, shell, JS/TS, Go, Rust, Java, C/C++) | `calib_code.txt` |
| techdocs | `eval_techdocs.txt` (sentences of API / tool documentation) | `calib_techdocs.txt` |
| queries | `eval_queries.txt` (short search queries) | `calib_queries.txt` |
| multilingual | `eval_multilingual.txt` (30+ languages; XLM-R models) | `calib_multilingual.txt` |

No held-out line appears in any calibration file (tests/quant/test_domains.py checks it),
and the held-out sets were never used to choose a quantisation setting.
`calibration_texts()` (what `zoi compile --precision int8` calibrates on by default)
interleaves the domains' calibration files, so the first 512 texts hold every domain.
"""

from __future__ import annotations

from pathlib import Path

DATA_DIR = Path(__file__).resolve().parent
CALIBRATION = DATA_DIR / "calibration.txt"
EVAL = DATA_DIR / "eval.txt"

DOMAINS = ("prose", "questions", "code", "techdocs", "queries", "multilingual")
# the domains every model is measured on; "multilingual" is added for multilingual models
ENGLISH_DOMAINS = DOMAINS[:-1]
_EVAL_FILES = {d: DATA_DIR / f"eval_{d}.txt" for d in DOMAINS}
_EVAL_FILES["prose"] = EVAL
_CALIB_FILES = {d: DATA_DIR / f"calib_{d}.txt" for d in DOMAINS}
_CALIB_FILES["prose"] = CALIBRATION


def read_lines(path: str | Path) -> list[str]:
    """Non-empty, stripped lines of a UTF-8 text file (one text per line)."""
    with open(path, encoding="utf-8") as f:
        return [s.strip() for s in f if s.strip()]


def _check(domain: str) -> None:
    if domain not in DOMAINS:
        raise ValueError(f"unknown domain {domain!r}; zoi ships {', '.join(DOMAINS)}")


def domain_texts(domain: str) -> list[str]:
    """The held-out evaluation texts of one domain."""
    _check(domain)
    return read_lines(_EVAL_FILES[domain])


def domain_calibration(domain: str) -> list[str]:
    _check(domain)
    return read_lines(_CALIB_FILES[domain])


def is_multilingual(spec) -> bool:
    """A multilingual vocabulary (XLM-R 250k, mBERT 120k): >= 100,000 entries."""
    return int(getattr(spec, "vocab_size", 0)) >= 100_000


def default_domains(multilingual: bool = False) -> tuple[str, ...]:
    return DOMAINS if multilingual else ENGLISH_DOMAINS


def calibration_set(multilingual: bool = False) -> list[tuple[str, str]]:
    """The default calibration set as (text, domain) pairs: the domains' calibration files
    interleaved round-robin (prose, questions, code, techdocs, queries[, multilingual]);
    the longer prose file continues once the others are used up."""
    doms = default_domains(multilingual)
    lists = [domain_calibration(d) for d in doms]
    out: list[tuple[str, str]] = []
    for i in range(max(len(x) for x in lists)):
        out.extend((x[i], d) for d, x in zip(doms, lists, strict=True) if i < len(x))
    return out


def calibration_texts(multilingual: bool = False) -> list[str]:
    """The texts of `calibration_set` (what INT8 compiles calibrate on by default)."""
    return [t for t, _ in calibration_set(multilingual)]


def eval_texts() -> list[str]:
    """The prose held-out set (the figure docs/RESULTS.md's peer table uses)."""
    return read_lines(EVAL)
