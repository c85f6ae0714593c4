"""Every relative link in README.md and docs/*.md points to a file or folder that exists.

Markdown links and images (`[text](target)`, `![alt](target)`) are checked; web addresses,
mail links and in-page anchors (`#...`) are not. A `#fragment` after a path is dropped, and the
path is resolved against the folder of the file that holds the link. Code spans and fenced
code blocks are skipped (their brackets are code, not links).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FILES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
CODE_SPAN = re.compile(r"`[^`\n]*`")


def relative_links(text: str) -> list[str]:
    text = CODE_SPAN.sub("", FENCE.sub("", text))
    out = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I) or target.startswith("#"):
            continue  # http:, https:, mailto:, ... or an anchor in the same page
        out.append(target)
    return out


def test_the_link_pattern():
    text = "[a](docs/X.md#y) ![p](../bench/p.png) [w](https://x.org) [z](#top) `[c](no.md)`"
    assert relative_links(text) == ["docs/X.md#y", "../bench/p.png"]


@pytest.mark.parametrize("md", FILES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_relative_links_exist(md: Path):
    missing = []
    for target in relative_links(md.read_text(encoding="utf-8")):
        path = target.split("#", 1)[0]
        if path and not (md.parent / path).exists():
            missing.append(target)
    assert not missing, f"{md.relative_to(REPO)}: links to missing files: {missing}"
