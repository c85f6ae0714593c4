"""mkdocs hook (mkdocs.yml `hooks:`): lay the site out as the repository is laid out.

The pages are written to be read on a source host: README.md at the root links `docs/SERVE.md`,
docs/*.md link `../README.md` and `../bench/results/*.png`. mkdocs reads only `docs_dir`, and
refuses the repository root as one, so this hook keeps `docs_dir: docs` and moves its pages under
`docs/` in the site, then adds README.md, CHANGELOG.md and the images the pages show from the
root. Every relative link then resolves as it does in the repository, and `mkdocs build
--strict` checks them (and their anchors) without any page being rewritten. Heading anchors
are made as GitHub makes them (`gfm_slugify`), so a `#fragment` that works on the source host
works in the site, and the reverse.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from mkdocs.structure.files import File, Files

ROOT_PAGES = ("README.md", "CHANGELOG.md")  # pages that live at the repository root
_IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s#]+\.(?:png|svg|jpg|jpeg|gif))\)", re.IGNORECASE)


def gfm_slugify(value: str, separator: str = "-") -> str:
    """A heading's anchor as GitHub writes it: lower case, punctuation dropped, each space a
    hyphen (Python-Markdown's default folds runs of them: `a / b` -> `a-b`, GitHub `a--b`)."""
    return re.sub(r"[^\w\- ]", "", value.strip().lower()).replace(" ", separator)


def on_config(config):
    config.mdx_configs.setdefault("toc", {})["slugify"] = gfm_slugify
    return config


def _file(rel: str, root: Path, config) -> File:
    return File(rel, str(root), config.site_dir, config.use_directory_urls)


def on_files(files: Files, config) -> Files:
    root = Path(config.config_file_path).resolve().parent
    docs_dir = Path(config.docs_dir).resolve()
    prefix = docs_dir.relative_to(root).as_posix()
    out = []
    for f in files:
        if f.src_dir and Path(f.src_dir).resolve() == docs_dir:
            f = _file(f"{prefix}/{f.src_uri}", root, config)  # docs/X.md stays docs/X.md
        out.append(f)
    pages = [root / p for p in ROOT_PAGES if (root / p).is_file()]
    out += [_file(p.name, root, config) for p in pages]
    # the images the pages show, wherever in the repository they are (bench/results/*.png)
    seen = {f.src_uri for f in out}
    for page in [*pages, *docs_dir.glob("*.md")]:
        for target in _IMAGE.findall(page.read_text(encoding="utf-8")):
            path = (page.parent / target).resolve()
            if path.is_file() and path.is_relative_to(root):
                rel = path.relative_to(root).as_posix()
                if rel not in seen:
                    seen.add(rel)
                    out.append(_file(rel, root, config))
    return Files(out)


def on_serve(server, config, builder):
    """`mkdocs serve` rebuilds on edits to the root pages too."""
    root = os.path.dirname(config.config_file_path)
    for p in ROOT_PAGES:
        if os.path.isfile(os.path.join(root, p)):
            server.watch(os.path.join(root, p))
    return server
