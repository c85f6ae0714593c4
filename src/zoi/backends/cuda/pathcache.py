"""The persistent-vs-per-op choice per bucket, remembered across engine builds.

With ``CudaOptions.persistent == "time"`` a bucket small enough for the one-launch forward is
built both ways, both graphs are timed on the GPU and the faster kept. That doubles the
compile work of those buckets every time an engine is built, although the answer only
depends on the GPU, the software and the model's shapes. So the answer is written to a small
JSON file (``CudaOptions.path_cache``; ``CudaOptions.from_env`` puts it in the zoi cache
directory, ``~/.cache/zoi/cuda_paths.json`` or ``$ZOI_CACHE_DIR``) and the next build of the
same shapes on the same GPU and software builds the winner only.

The key holds everything the timing depends on: the device name and compute capability, the
triton and zoi versions with a digest of this backend's sources (a changed kernel is a new
key), the
precision, the model's shapes and head (``ModelSpec``'s fields but the names), the plan
options and the bucket. An unreadable or malformed file is ignored (timed again) and
rewritten; writes go to a temporary file first and replace the old one atomically, so
concurrent builds never see half a file (the last writer wins; every entry is a measured
answer either way).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import tempfile
from pathlib import Path

log = logging.getLogger("zoi")

FORMAT = 1
PATHS = ("persistent", "per-op")
MARKS = (*PATHS, "kernels")  # "kernels": a model's kernels compiled (prebuild.py)


def cache_key(device_name: str, capability, precision: str, spec, opts, tb: int) -> str:
    """A short stable key (sha256 hex prefix) of what the timing of bucket tb depends on."""
    import triton

    if dataclasses.is_dataclass(spec):
        shape = {
            f.name: getattr(spec, f.name) for f in dataclasses.fields(spec) if f.name != "name"
        }
    else:
        shape = dict(spec)
    o = dataclasses.asdict(opts) if dataclasses.is_dataclass(opts) else dict(opts)
    o.pop("path_cache", None)
    o.pop("device_index", None)  # same GPU model, any index
    o.pop("parallel_build", None)  # how the kernels were compiled, not which
    blob = json.dumps(
        {
            "format": FORMAT,
            "device": str(device_name),
            "capability": list(capability),
            "triton": triton.__version__,
            "zoi": _code_digest(),
            "precision": str(precision),
            "spec": shape,
            "options": o,
            "bucket": int(tb),
        },
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


_DIGEST: list = []


def _code_digest() -> str:
    """zoi's version and the sources of this backend (kernels, plan, launches): what decides
    the two paths' speed. Once per process."""
    if not _DIGEST:
        from zoi._version import __version__
        from zoi.paths import folder_digest

        _DIGEST.append(__version__ + ":" + folder_digest(Path(__file__).resolve().parent, (".py",)))
    return _DIGEST[0]


def _read(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        log.warning("zoi: ignoring the unreadable CUDA path cache %s (%s): timing again", path, e)
        return {}
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        log.warning("zoi: ignoring the CUDA path cache %s (not format %d)", path, FORMAT)
        return {}
    entries = data.get("entries")
    return entries if isinstance(entries, dict) else {}


def lookup(path, key: str) -> str | None:
    """The remembered path ("persistent" / "per-op") for key, or None."""
    if not path:
        return None
    e = _read(Path(path)).get(key)
    if isinstance(e, dict) and e.get("path") in MARKS:
        return e["path"]
    return None


def store(path, key: str, choice: str, times_us: dict | None = None) -> None:
    """Remember choice for key (atomic replace of the whole file); errors only warn."""
    if not path or choice not in MARKS:
        return
    path = Path(path)
    try:
        entries = _read(path)
        entries[key] = {"path": choice, "us": times_us or {}}
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".cuda_paths.", dir=path.parent)
        with os.fdopen(fd, "w") as f:
            json.dump({"format": FORMAT, "entries": entries}, f, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except OSError as e:
        log.warning("zoi: could not write the CUDA path cache %s (%s)", path, e)
