"""Hugging Face model ids ("sentence-transformers/all-MiniLM-L6-v2") resolved from the local
Hugging Face cache, never downloaded.

The cache is the one huggingface_hub writes: $HF_HUB_CACHE, else $HF_HOME/hub, else
$XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub (the legacy
$HUGGINGFACE_HUB_CACHE is honoured after $HF_HUB_CACHE). A model lives in
`models--ORG--NAME/snapshots/REV/`, REV named by `refs/main` (or `refs/REVISION` for
`ORG/NAME@REVISION`); its files are usually links into `../../blobs/`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

from zoi.errors import CheckpointError

_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*(/[A-Za-z0-9][\w.\-]*)?(@[\w.\-/]+)?$")


def hub_cache_dir(env: Mapping[str, str] | None = None) -> Path:
    """Where huggingface_hub keeps downloaded models (same precedence as huggingface_hub)."""
    env = os.environ if env is None else env
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if env.get(var):
            return Path(env[var]).expanduser()
    if env.get("HF_HOME"):
        return Path(env["HF_HOME"]).expanduser() / "hub"
    base = Path(env["XDG_CACHE_HOME"]).expanduser() if env.get("XDG_CACHE_HOME") else None
    return (base or Path.home() / ".cache") / "huggingface" / "hub"


def looks_like_model_id(s: str) -> bool:
    """`name`, `org/name` or `org/name@revision`: the shapes of a Hub model id."""
    return isinstance(s, str) and bool(_ID.match(s)) and ".." not in s


def _how_to_get(model_id: str) -> str:
    repo = model_id.split("@", 1)[0]
    return (
        "zoi never downloads models. Get it once with `hf download "
        f"{repo}` (or `huggingface-cli download {repo}`, or "
        f"`huggingface_hub.snapshot_download({repo!r})`), or pass the path of a model folder"
    )


def snapshot_folder(model_id: str, env: Mapping[str, str] | None = None) -> Path:
    """The local snapshot folder of a Hub model id; a CheckpointError naming where it looked
    and how to get the model when it is not there."""
    repo, _, rev = model_id.partition("@")
    cache = hub_cache_dir(env)
    root = cache / ("models--" + repo.replace("/", "--"))
    if not (root / "snapshots").is_dir():
        raise CheckpointError(
            f"{model_id}: not a directory, nor a model in the local Hugging Face cache "
            f"({root} does not exist; cache from HF_HUB_CACHE / HF_HOME). {_how_to_get(model_id)}"
        )
    ref = root / "refs" / (rev or "main")
    if ref.is_file():
        rev = ref.read_text(encoding="utf-8").strip()
    if rev:
        snap = root / "snapshots" / rev
        if not snap.is_dir():
            raise CheckpointError(
                f"{model_id}: revision {rev} is not in the local Hugging Face cache ({snap} "
                f"does not exist). {_how_to_get(model_id)}"
            )
    else:
        snaps = sorted(p for p in (root / "snapshots").iterdir() if p.is_dir())
        if len(snaps) != 1:
            raise CheckpointError(
                f"{model_id}: the local Hugging Face cache ({root}) has "
                f"{len(snaps)} snapshots and no refs/main to choose one; name the revision "
                f"({repo}@REVISION) or pass a snapshot folder"
            )
        snap = snaps[0]
    if not (snap / "config.json").exists():
        raise CheckpointError(
            f"{model_id}: the cached snapshot {snap} has no config.json (an incomplete "
            f"download?). {_how_to_get(model_id)}"
        )
    return snap


def resolve_model(path: str | os.PathLike, env: Mapping[str, str] | None = None) -> Path:
    """A model folder as given, or the cached snapshot of a Hub model id. A path that exists,
    or that does not look like an id, is returned unchanged (the loader reports it)."""
    p = Path(path)
    if p.exists() or not looks_like_model_id(str(path)):
        return p
    return snapshot_folder(str(path), env)


def model_name(folder: str | os.PathLike) -> str:
    """A stable name for a model folder: NAME for a Hub snapshot (models--ORG--NAME/snapshots/
    REV), else the folder's own name."""
    f = Path(folder).resolve()
    if f.parent.name == "snapshots" and f.parent.parent.name.startswith("models--"):
        return f.parent.parent.name.split("--")[-1]
    return f.name
