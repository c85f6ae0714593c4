"""The documentation site builds: `mkdocs build --strict` (mkdocs.yml, `make docs`).

--strict fails on every warning mkdocs.yml's `validation` raises: a link to a missing page or
file, an anchor no heading makes, a page of docs/ left out of the nav. Anchors are GitHub's
(scripts/mkdocs_hooks.py), so the site and the source host agree on them.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

needs_mkdocs = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("mkdocs", "mkdocstrings_handlers.python")),
    reason="mkdocs or mkdocstrings-python is not installed (the docs extra)",
)


@needs_mkdocs
def test_mkdocs_build_strict(tmp_path):
    site = tmp_path / "site"
    r = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-6000:]
    # the README is the home page, the changelog and every docs/*.md a page of their own
    pages = ["index.html", "CHANGELOG.html", "docs/index.html"]
    pages += [f"docs/{p.stem}.html" for p in (REPO / "docs").glob("*.md") if p.stem != "README"]
    assert not [p for p in pages if not (site / p).is_file()]
    # the API reference is rendered from the docstrings (mkdocstrings), not left as `::: name`
    api = (site / "docs" / "API.html").read_text(encoding="utf-8")
    assert ":::" not in api and "normalize_embeddings" in api and "zoi.engine.Engine" in api


@needs_mkdocs
def test_anchors_are_githubs():
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        from mkdocs_hooks import gfm_slugify
    finally:
        sys.path.remove(str(REPO / "scripts"))
    assert gfm_slugify("Decoders (Llama / Qwen2 / Qwen3 / SmolLM)") == (
        "decoders-llama--qwen2--qwen3--smollm"
    )
    assert gfm_slugify("Several engines: `--gpus` (one per GPU)") == (
        "several-engines---gpus-one-per-gpu"
    )
    assert gfm_slugify("CPU, 2026-12-01 (other load <= 0.01 core)") == (
        "cpu-2026-12-01-other-load--001-core"
    )


def test_the_changelog_has_the_current_version():
    from zoi._version import __version__

    text = (REPO / "CHANGELOG.md").read_text(encoding="utf-8")
    assert re.search(rf"^## {re.escape(__version__)}\b", text, re.M), (
        f"CHANGELOG.md has no '## {__version__}' section"
    )
