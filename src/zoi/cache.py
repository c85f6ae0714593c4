"""A cache of compiled artifacts, so that `zoi demo` and `zoi serve` compile (and calibrate
INT8) a model once.

An entry is an ordinary artifact (Engine.save) under CACHE/artifacts/NAME-PRECISION-KEY/,
CACHE being $ZOI_CACHE_DIR, else $XDG_CACHE_HOME/zoi, else ~/.cache/zoi. KEY is a sha256 of
everything the compiled result depends on: every file of the model folder (content), the zoi
version, the source of the installed zoi package (a changed quantiser in a development
checkout is a new key too), the artifact format, and the compile options (device,
precision, max_tokens, max_batch, calibration texts, quant config). The key is also written
into the artifact and checked when it is read back; an entry that does not load, or whose
recorded key differs, is compiled again and replaced (atomically, by Engine.save).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

from zoi.paths import _hash_file, cache_dir, folder_digest  # noqa: F401 - re-exported

log = logging.getLogger("zoi")


def code_digest() -> str:
    """The installed zoi: its version, artifact format and Python sources."""
    from zoi._version import __version__
    from zoi.engine import ARTIFACT_FORMAT

    h = hashlib.sha256(f"zoi {__version__} format {ARTIFACT_FORMAT}".encode())
    h.update(folder_digest(Path(__file__).parent, (".py", ".txt")).encode())
    return h.hexdigest()


def _texts_digest(calibration) -> str | None:
    from zoi.quant.config import is_budget

    if calibration is None or is_budget(calibration):  # a budget: the key's calibration_budget
        return None
    if isinstance(calibration, (str, os.PathLike)):
        h = hashlib.sha256()
        _hash_file(h, Path(calibration))
        return "file:" + h.hexdigest()
    return "texts:" + hashlib.sha256(json.dumps(list(calibration)).encode()).hexdigest()


def cache_key(src: Path, options: dict) -> str:
    parts = {
        "model": folder_digest(src),
        "zoi": code_digest(),
        "options": {k: options[k] for k in sorted(options)},
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def cached_compile(
    path: str | os.PathLike | None = None,
    *,
    device: str = "cpu",
    precision: str = "fp32",
    max_tokens: int | None = None,
    max_batch: int | None = None,
    calibration: Sequence[str] | str | os.PathLike | None = None,
    quant_config=None,
    progress: bool = False,
    cache: str | os.PathLike | None = None,
):
    """zoi.compile(...) through the artifact cache. Returns (engine, "cached" | "compiled",
    the entry's folder)."""
    from zoi import api
    from zoi.backends import resolve_device
    from zoi.engine import default_model_path, model_name, read_artifact_meta
    from zoi.errors import ZoiError
    from zoi.frontend.hub import resolve_model
    from zoi.quant.config import budget_in_effect

    device = resolve_device(device)
    src = resolve_model(path) if path is not None else default_model_path()
    options = {
        "device": device,
        "precision": precision,
        "max_tokens": max_tokens,
        "max_batch": max_batch,
        "calibration": _texts_digest(calibration),
        # the INT8 budget in effect ("default" when none is named)
        "calibration_budget": budget_in_effect(calibration) if precision == "int8" else None,
        "quant_config": json.dumps(quant_config, sort_keys=True, default=str)
        if quant_config is not None
        else None,
    }
    key = cache_key(src, options)
    root = Path(cache) if cache is not None else cache_dir()
    entry = root / "artifacts" / f"{model_name(src)}-{precision}-{key[:20]}"
    if (entry / "zoi.json").is_file():
        try:
            if read_artifact_meta(entry).get("meta", {}).get("cache_key") != key:
                raise ZoiError("its recorded cache key differs")
            return api.load(entry, device=device), "cached", entry
        except (ZoiError, OSError, ValueError, KeyError) as e:
            log.warning("zoi: the cached artifact %s is unusable (%s): compiling again", entry, e)
    eng = api.compile(
        path,
        device=device,
        precision=precision,
        max_tokens=max_tokens,
        max_batch=max_batch,
        calibration=calibration,
        quant_config=quant_config,
        progress=progress,
    )
    eng.model.meta["cache_key"] = key
    try:
        if entry.exists() and not (entry / "zoi.json").is_file():
            shutil.rmtree(entry)  # a broken entry of our own cache (Engine.save would refuse it)
        eng.save(entry)
    except OSError as e:
        log.warning("zoi: cannot write the artifact cache %s (%s); not cached", entry, e)
    return eng, "compiled", entry
