"""Where zoi keeps what it writes for the user: the cache directory (base layer: no zoi
imports, so that every layer may ask). CACHE is $ZOI_CACHE_DIR, else $XDG_CACHE_HOME/zoi,
else ~/.cache/zoi."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path


def cache_dir(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    if env.get("ZOI_CACHE_DIR"):
        return Path(env["ZOI_CACHE_DIR"]).expanduser()
    base = Path(env["XDG_CACHE_HOME"]).expanduser() if env.get("XDG_CACHE_HOME") else None
    return (base or Path.home() / ".cache") / "zoi"
