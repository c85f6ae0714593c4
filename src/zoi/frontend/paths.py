"""Files of a model folder or artifact are opened only inside it, and only if regular files.

- a path named inside a file (model.safetensors.index.json shards, modules.json module paths)
  must be relative and stay inside the folder, symlinks resolved; the one exception is the
  Hugging Face cache layout, where `snapshots/REV/NAME` links to `../../blobs/HASH`;
- a file must be a regular file: a FIFO, a device or a folder is refused without blocking
  (`open()` of a FIFO waits for a writer; `os.open(O_NONBLOCK)` + fstat does not).
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

from zoi.errors import CheckpointError


def _allowed_roots(folder: Path) -> list[Path]:
    root = folder.resolve()
    roots = [root]
    # Hugging Face hub cache: .../models--org--name/snapshots/REV/file -> ../../blobs/HASH
    if root.parent.name == "snapshots":
        roots.append(root.parent.parent / "blobs")
    return roots


def _within(p: Path, roots: list[Path]) -> bool:
    return any(p == r or r in p.parents for r in roots)


def inside(folder: str | os.PathLike, rel: str, named_in: str | os.PathLike) -> Path:
    """`folder / rel`, refused unless `rel` is relative and the file it leads to (symlinks
    resolved) lies inside `folder`."""
    folder = Path(folder)
    if not isinstance(rel, str) or not rel or "\x00" in rel:
        raise CheckpointError(f"{named_in}: bad file name {rel!r}")
    if Path(rel).is_absolute() or rel.startswith(("/", "\\")) or (len(rel) > 1 and rel[1] == ":"):
        raise CheckpointError(
            f"{named_in}: path {rel!r} is absolute; zoi reads files only inside {folder}"
        )
    p = folder / rel
    target = p.resolve()
    if not _within(target, _allowed_roots(folder)):
        raise CheckpointError(
            f"{named_in}: path {rel!r} leads outside the model folder {folder} (to {target}); "
            "zoi reads files only inside it"
        )
    return p


def check_file(path: str | os.PathLike, folder: str | os.PathLike | None = None) -> int:
    """Refuse anything but a regular file (without blocking on a FIFO); returns its size. With
    `folder`, a symlink must also resolve inside it."""
    path = Path(path)
    if folder is not None and not _within(path.resolve(), _allowed_roots(Path(folder))):
        raise CheckpointError(
            f"{path}: is a link to {path.resolve()}, outside the model folder {folder}; "
            "zoi reads files only inside it"
        )
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError as e:
        raise CheckpointError(f"{path}: file not found") from e
    except OSError as e:
        raise CheckpointError(f"{path}: cannot open ({e.strerror or e})") from e
    try:
        st = os.fstat(fd)
    finally:
        os.close(fd)
    if not stat.S_ISREG(st.st_mode):
        kind = (
            "a FIFO"
            if stat.S_ISFIFO(st.st_mode)
            else "a folder"
            if stat.S_ISDIR(st.st_mode)
            else "a device or socket"
        )
        raise CheckpointError(f"{path}: is {kind}, not a regular file")
    return int(st.st_size)


def read_bytes(path: str | os.PathLike, limit: int, folder=None) -> bytes:
    """A regular file's bytes, refused over `limit` bytes (checked before reading)."""
    size = check_file(path, folder)
    if size > limit:
        raise CheckpointError(
            f"{path}: {size} bytes is over the {limit} bytes such a file may have; is it corrupt?"
        )
    try:
        with open(path, "rb") as f:
            return f.read(limit + 1)
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read ({e.strerror or e})") from e


MAX_JSON_BYTES = 256 << 20  # config, index, modules, zoi.json: far below this when sane


def read_json(path: Path, folder: Path | None = None) -> Any:
    """A JSON file: a regular file (never a FIFO), inside `folder` when given, size-capped."""
    raw = read_bytes(path, MAX_JSON_BYTES, folder)
    try:
        return json.loads(raw.decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path}: not valid JSON ({e})") from e
    except RecursionError as e:
        raise CheckpointError(f"{path}: not valid JSON (nested too deeply)") from e
