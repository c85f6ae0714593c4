"""Where zoi keeps what it writes for the user, and the digest of a folder that keys it (base
layer: no zoi imports, so that every layer may ask). CACHE is $ZOI_CACHE_DIR, else
$XDG_CACHE_HOME/zoi, else ~/.cache/zoi."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from pathlib import Path


def cache_dir(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    if env.get("ZOI_CACHE_DIR"):
        return Path(env["ZOI_CACHE_DIR"]).expanduser()
    base = Path(env["XDG_CACHE_HOME"]).expanduser() if env.get("XDG_CACHE_HOME") else None
    return (base or Path.home() / ".cache") / "zoi"


def _hash_file(h, path: Path) -> None:
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)


def folder_digest(folder: str | os.PathLike, suffixes: tuple[str, ...] | None = None) -> str:
    """sha256 over the relative names and contents of the files under `folder` (links
    followed, as the loader follows them)."""
    folder = Path(folder)
    h = hashlib.sha256()
    for p in sorted(folder.rglob("*")):
        if "__pycache__" in p.parts or not p.is_file():
            continue
        if suffixes is not None and p.suffix not in suffixes:
            continue
        rel = p.relative_to(folder).as_posix().encode()
        h.update(len(rel).to_bytes(8, "little") + rel)
        h.update(p.stat().st_size.to_bytes(8, "little"))
        _hash_file(h, p)
    return h.hexdigest()
