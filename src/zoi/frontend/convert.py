"""`zoi convert FOLDER`: the PyTorch pickles of a model folder that zoi needs, as safetensors.

zoi never unpickles: a pickle can run arbitrary code when it is loaded. Some checkpoints publish
small parts only as pickles: BGE-M3's heads (`sparse_linear.pt`, `colbert_linear.pt`), a
sentence-transformers Dense module's `pytorch_model.bin`. This converts each once:

- the pickle is read by torch's `weights_only=True` loader (tensors and plain containers only;
  anything else is refused by torch) in a child process, started in an empty directory, so
  nothing of it runs in the caller's process and no module of the model folder is imported;
  the child hands the tensors back as an `.npz`, read with `allow_pickle=False`;
- names and shapes are checked against what zoi will read (config.json's hidden size, the
  Dense module's in / out features);
- `<name>.safetensors` is written beside the pickle atomically (a temporary file, fsync,
  rename). An existing safetensors file with the same tensors is left as it is; one that
  differs is never replaced unless asked (`force`).

torch is optional for zoi: it is needed only here, in the child. `python` names another
interpreter that has it.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from zoi.errors import CheckpointError, ZoiError

# The child: torch.load(weights_only=True) of each file, its tensors as float32 into OUT/<i>.npz
# (arrays t0, t1, ... in the state dict's order); on stdout, JSON: the names of each file's
# tensors, or the first failure {"error", "index"}. Exit codes: 3 no torch, 4 torch refused a
# file, 5 a file is not a state dict of float tensors.
_CHILD = r"""
import json, sys

def done(d, code):
    sys.stdout.write(json.dumps(d))
    sys.stdout.flush()
    sys.exit(code)

try:
    import torch
except ImportError as e:
    done({"error": f"{type(e).__name__}: {e}", "index": 0}, 3)
import numpy as np

out, srcs = sys.argv[1], sys.argv[2:]
names_of = []
for n, src in enumerate(srcs):
    try:
        sd = torch.load(src, map_location="cpu", weights_only=True)
    except Exception as e:
        done({"error": f"{type(e).__name__}: {e}", "index": n}, 4)
    if not isinstance(sd, dict) or not sd:
        done({"error": f"it holds a {type(sd).__name__}, not a state dict of tensors", "index": n}, 5)
    names, arrays = [], {}
    for i, (k, v) in enumerate(sd.items()):
        if not isinstance(k, str) or not torch.is_tensor(v) or not v.is_floating_point():
            done({"error": f"entry {k!r} is a {type(v).__name__}, not a float tensor", "index": n}, 5)
        names.append(k)
        arrays[f"t{i}"] = v.detach().to(torch.float32).contiguous().numpy()
    np.savez(f"{out}/{n}.npz", **arrays)
    names_of.append(names)
done({"names": names_of}, 0)
"""
TIMEOUT_S = 600


@dataclass
class Job:
    src: Path  # the pickle
    dst: Path  # the safetensors file to write
    shapes: dict  # tensor name -> shape; None: any size along that axis
    optional: tuple = ()  # names that may be absent


@dataclass
class Converted:
    src: Path
    dst: Path
    status: str  # "written", "up to date", "replaced"
    shapes: dict


def _hidden(folder: Path) -> int | None:
    from zoi.frontend.checkpoint import read_json

    p = folder / "config.json"
    if not p.is_file():
        return None
    cfg = read_json(p, folder)
    for key in ("hidden_size", "dim", "d_model"):
        v = cfg.get(key) if isinstance(cfg, dict) else None
        if type(v) is int and v > 0:
            return v
    return None


def plan(folder: str | os.PathLike) -> list[Job]:
    """The pickles of `folder` that zoi reads once converted: BGE-M3's heads, the Dense
    modules of a sentence-transformers folder."""
    from zoi.frontend.checkpoint import read_json
    from zoi.frontend.multivector import M3_FILES, PICKLE_SUFFIXES
    from zoi.frontend.paths import inside

    folder = Path(folder)
    if not folder.is_dir():
        raise CheckpointError(f"{folder}: not a directory (expected a model folder)")
    H = _hidden(folder)
    jobs: list[Job] = []
    for head, stem in M3_FILES.items():
        src = next(
            (folder / f"{stem}{s}" for s in PICKLE_SUFFIXES if (folder / f"{stem}{s}").exists()),
            None,
        )
        if src is not None:
            rows = 1 if head == "sparse" else None
            shapes = {"weight": (rows, H), "bias": (rows,)}
            jobs.append(Job(src, folder / f"{stem}.safetensors", shapes, ("bias",)))
    mpath = folder / "modules.json"
    if mpath.is_file():
        mods = read_json(mpath, folder)
        for m in mods if isinstance(mods, list) else []:
            if not (isinstance(m, dict) and str(m.get("type", "")).endswith("Dense")):
                continue
            d = inside(folder, str(m.get("path", "")) or ".", mpath)
            src = d / "pytorch_model.bin"
            if not src.exists():
                continue
            c = read_json(d / "config.json", folder) if (d / "config.json").is_file() else {}
            din, dout = c.get("in_features"), c.get("out_features")
            din = din if type(din) is int else None
            dout = dout if type(dout) is int else None
            shapes = {"linear.weight": (dout, din), "linear.bias": (dout,)}
            optional = () if c.get("bias", True) else ("linear.bias",)
            jobs.append(Job(src, d / "model.safetensors", shapes, optional))
    return jobs


def convert_folder(
    folder: str | os.PathLike, python: str | None = None, force: bool = False
) -> list[Converted]:
    """Convert every pickle plan() finds (one child process for all); [] when there is none.
    python: the interpreter whose torch reads the pickles (default: this one). force: replace
    a safetensors file that differs from its pickle. Every file is read and checked before
    any is written."""
    from zoi.frontend.paths import check_file

    jobs = plan(folder)
    if not jobs:
        return []
    for job in jobs:
        check_file(job.src, job.src.parent)
    loaded = _load_in_child([j.src for j in jobs], python or sys.executable)
    todo = []
    for job, tensors in zip(jobs, loaded, strict=True):
        _check(job, tensors)
        status = "written"
        if job.dst.exists():
            why = _differs(job.dst, tensors)
            if why is None:
                status = "up to date"
            elif not force:
                raise ZoiError(
                    f"{job.dst} exists and differs from {job.src.name} ({why}); zoi does not "
                    "overwrite it: move it away, or pass --force to replace it with the "
                    "conversion"
                )
            else:
                status = "replaced"
        todo.append((job, tensors, status))
    out = []
    for job, tensors, status in todo:
        if status != "up to date":
            _write_atomic(job, tensors)
        out.append(Converted(job.src, job.dst, status, _shapes(tensors)))
    return out


def _shapes(tensors: dict) -> dict:
    return {k: list(v.shape) for k, v in tensors.items()}


def _load_in_child(srcs: list[Path], python: str) -> list[dict[str, np.ndarray]]:
    import json

    with tempfile.TemporaryDirectory(prefix="zoi-convert-") as tmp:
        try:
            r = subprocess.run(
                [python, "-c", _CHILD, tmp, *(str(p.resolve()) for p in srcs)],
                cwd=tmp,  # `-c` puts the working directory first on sys.path: an empty one
                capture_output=True,
                text=True,
                timeout=TIMEOUT_S,
                stdin=subprocess.DEVNULL,
            )
        except FileNotFoundError as e:
            raise ZoiError(f"zoi convert: cannot run the interpreter {python!r} ({e})") from e
        except subprocess.TimeoutExpired as e:
            raise ZoiError(
                f"zoi convert: reading {len(srcs)} file(s) took over {TIMEOUT_S} s"
            ) from e
        try:
            answer = json.loads(r.stdout.strip().splitlines()[-1]) if r.stdout.strip() else {}
        except ValueError:
            answer = {}
        if not isinstance(answer, dict):
            answer = {}
        detail = answer.get("error")
        idx = answer.get("index")
        src = srcs[idx] if type(idx) is int and 0 <= idx < len(srcs) else srcs[0]
        if r.returncode == 3:
            raise ZoiError(
                f"zoi convert reads {src.name} with torch, which {python} cannot import "
                f"({detail}). torch is optional for zoi and needed only for this one-time "
                "conversion: install it (pip install torch; the CPU wheel is enough), or pass "
                "--python PATH of an interpreter that has it"
            )
        if r.returncode == 4:
            raise CheckpointError(
                f"{src}: torch's weights_only loader refused it ({detail}). It holds more than "
                "tensors (objects a pickle would construct by running code); zoi does not "
                "convert such a file: get the weights from a trusted source"
            )
        if r.returncode == 5:
            raise CheckpointError(f"{src}: not a state dict of float tensors ({detail})")
        names_of = answer.get("names")
        if r.returncode != 0 or not isinstance(names_of, list) or len(names_of) != len(srcs):
            tail = (r.stderr or r.stdout or "").strip()[-2000:]
            raise ZoiError(
                f"zoi convert: the conversion process failed (exit {r.returncode}): {tail}"
            )
        out = []
        for n, names in enumerate(names_of):
            with np.load(Path(tmp) / f"{n}.npz", allow_pickle=False) as z:
                if sorted(z.files) != sorted(f"t{i}" for i in range(len(names))):
                    raise ZoiError(f"{srcs[n]}: the conversion process wrote an unexpected file")
                out.append(
                    {k: np.ascontiguousarray(z[f"t{i}"], np.float32) for i, k in enumerate(names)}
                )
        return out


def _check(job: Job, tensors: dict[str, np.ndarray]) -> None:
    names = set(tensors)
    want = set(job.shapes)
    if not names <= want or not (want - set(job.optional)) <= names:
        raise CheckpointError(
            f"{job.src}: holds tensors {sorted(names)}; expected {sorted(want)} "
            f"({', '.join(job.optional) or 'none'} optional)"
        )
    sizes: dict[int, int] = {}  # a None axis must agree between tensors (rows of w and b)
    for name, arr in tensors.items():
        shp = job.shapes[name]
        ok = arr.ndim == len(shp) and all(
            s is None or s == a for s, a in zip(shp, arr.shape, strict=True)
        )
        if ok and shp[0] is None:
            ok = sizes.setdefault(0, arr.shape[0]) == arr.shape[0] and arr.shape[0] >= 1
        if not ok:
            want_s = "[" + ", ".join("N" if s is None else str(s) for s in shp) + "]"
            raise CheckpointError(
                f"{job.src}: {name} has shape {list(arr.shape)}, expected {want_s} "
                "(config.json's hidden size, the module's features)"
            )
        if not np.isfinite(arr).all():
            raise CheckpointError(f"{job.src}: {name} contains NaN or Inf values")


def _differs(dst: Path, tensors: dict[str, np.ndarray]) -> str | None:
    """Why the safetensors file `dst` is not `tensors` (None: the same tensors)."""
    from zoi.frontend.safetensors_io import SafetensorsFile

    try:
        f = SafetensorsFile(dst)
        have = set(f.names())
        if have != set(tensors):
            return f"tensors {sorted(have)} instead of {sorted(tensors)}"
        for n, arr in tensors.items():
            old = np.asarray(f.get(n), np.float32)
            if old.shape != arr.shape:
                return f"{n} has shape {list(old.shape)} instead of {list(arr.shape)}"
            if not np.array_equal(old, arr):
                return f"the values of {n} differ"
    except ZoiError as e:
        return f"not a readable safetensors file: {e}"
    return None


def _write_atomic(job: Job, tensors: dict[str, np.ndarray]) -> None:
    from zoi.frontend.safetensors_io import save_safetensors

    digest = hashlib.sha256(job.src.read_bytes()).hexdigest()
    tmp = job.dst.with_name(f".{job.dst.name}.tmp-{os.getpid()}")
    try:
        save_safetensors(
            tensors,
            tmp,
            metadata={"format": "pt", "converted_from": job.src.name, "source_sha256": digest},
        )
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, job.dst)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    try:  # the rename itself durable
        fd = os.open(job.dst.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass
