"""NVIDIA Triton Inference Server: a model repository for a zoi artifact, and a server to run it.

`export_repository(artifact, repo_dir)` writes

    REPO_DIR/<name>/config.pbtxt        Python backend, dynamic batching, TEXT (BYTES) ->
                                        EMBEDDING (FP32 [H]), instance groups (CPU, or per GPU)
    REPO_DIR/<name>/1/model.py          TritonPythonModel: loads the artifact once per instance,
                                        one packed engine call per execute batch
    REPO_DIR/<name>/1/artifact/         the zoi artifact (hard links when possible, else a copy)

Ragged batching is not used: the Python backend hands model.py each request separately, and
model.py packs them without padding itself, which is what ragged batching would buy.

`TritonServerProcess` runs the `tritonserver` binary that the `nvidia-pytriton` wheel ships,
from the environment `scripts/triton_env.sh` builds (numpy < 2 there; see docs/DEPLOY.md for
how zoi gets importable by the backend's stub).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path

from zoi.integrations.gpus import ALL
from zoi.procs import ChildServer

DEFAULT_MAX_BATCH_SIZE = 256  # sequences per execute batch (Triton's max_batch_size)
DEFAULT_QUEUE_DELAY_US = 500
_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]+$")


# ---- the repository -------------------------------------------------------------------------
def instance_groups(instances: int = 1, gpus: None | str | list[int] = None) -> list[dict]:
    """Triton instance groups: `instances` on the CPU, or `instances` on each GPU.

    gpus None: KIND_CPU. ALL: one KIND_GPU group without ids (Triton puts `instances` on every
    GPU it sees). A list of ids: one KIND_GPU group per id, so each GPU gets its own engines.
    """
    if not isinstance(instances, int) or instances < 1:
        raise ValueError(f"--instances must be >= 1, got {instances!r}")
    if gpus is None:
        return [{"count": instances, "kind": "KIND_CPU"}]
    if gpus == ALL:
        return [{"count": instances, "kind": "KIND_GPU"}]
    if not gpus:
        raise ValueError("gpus: an empty list; leave it out for the CPU or give GPU ids")
    return [{"count": instances, "kind": "KIND_GPU", "gpus": [int(g)]} for g in gpus]


def _q(s: str) -> str:
    return '"' + str(s).replace("\\", "\\\\").replace('"', '\\"') + '"'


def render_config(
    name: str,
    hidden: int,
    groups: list[dict],
    max_batch_size: int = DEFAULT_MAX_BATCH_SIZE,
    max_queue_delay_us: int = DEFAULT_QUEUE_DELAY_US,
    max_queue_size: int | None = None,
    parameters: dict[str, str] | None = None,
) -> str:
    """config.pbtxt text (protobuf text format)."""
    if max_queue_delay_us < 0:
        raise ValueError(f"--max-queue-delay-us must be >= 0, got {max_queue_delay_us}")
    if max_batch_size < 1:
        raise ValueError(f"--max-batch-size must be >= 1, got {max_batch_size}")
    lines = [
        f"name: {_q(name)}",
        'backend: "python"',
        f"max_batch_size: {int(max_batch_size)}",
        "input [",
        '  { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] }',
        "]",
        "output [",
        f'  {{ name: "EMBEDDING" data_type: TYPE_FP32 dims: [ {int(hidden)} ] }}',
        "]",
        "dynamic_batching {",
        f"  max_queue_delay_microseconds: {int(max_queue_delay_us)}",
    ]
    if max_queue_size is not None:
        if max_queue_size < 1:
            raise ValueError(f"--max-queue-size must be >= 1, got {max_queue_size}")
        lines += [
            "  default_queue_policy {",
            "    timeout_action: REJECT",
            f"    max_queue_size: {int(max_queue_size)}",
            "  }",
        ]
    lines += ["}", "instance_group ["]
    for i, g in enumerate(groups):
        body = f"count: {int(g['count'])} kind: {g['kind']}"
        if "gpus" in g:
            body += " gpus: [ " + ", ".join(str(int(x)) for x in g["gpus"]) + " ]"
        lines.append("  { " + body + " }" + ("," if i < len(groups) - 1 else ""))
    lines.append("]")
    for k, v in (parameters or {}).items():
        lines.append(f"parameters {{ key: {_q(k)} value: {{ string_value: {_q(v)} }} }}")
    return "\n".join(lines) + "\n"


def _link_or_copy(src: Path, dst: Path) -> None:
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if not f.is_file():
            continue
        t = dst / f.name
        if t.exists():
            t.unlink()
        try:
            os.link(f, t)
        except OSError:
            shutil.copy2(f, t)


def export_repository(
    artifact: str | os.PathLike,
    repo_dir: str | os.PathLike,
    name: str | None = None,
    instances: int = 1,
    max_queue_delay_us: int = DEFAULT_QUEUE_DELAY_US,
    gpus: None | str | list[int] = None,
    max_batch_size: int = DEFAULT_MAX_BATCH_SIZE,
    max_queue_size: int | None = None,
    python_path: list[str] | None = None,
    normalize: bool | None = None,
    truncate: bool = True,
    max_tokens: int | None = None,
) -> Path:
    """Write the model repository; returns REPO_DIR/<name>."""
    from zoi.engine import is_artifact, read_artifact_meta
    from zoi.frontend.spec import ModelSpec

    art = Path(artifact)
    if not is_artifact(art):
        raise FileNotFoundError(
            f"{art} is not a zoi artifact (no zoi.json); make one with `zoi compile MODEL -o DIR`"
        )
    meta = read_artifact_meta(art)
    spec = ModelSpec.from_dict(meta["spec"])
    name = name or re.sub(r"[^A-Za-z0-9_.-]", "-", spec.name) or "zoi"
    if not _NAME_RE.match(name):
        raise ValueError(f"model name {name!r}: use letters, digits, '_', '-', '.'")
    groups = instance_groups(instances, gpus)
    params = {"zoi_artifact": "artifact", "zoi_truncate": "true" if truncate else "false"}
    if normalize is not None:
        params["zoi_normalize"] = "true" if normalize else "false"
    if max_tokens:
        params["zoi_max_tokens"] = str(int(max_tokens))
    if python_path:
        params["zoi_python_path"] = os.pathsep.join(str(Path(p).resolve()) for p in python_path)
    text = render_config(
        name, spec.hidden, groups, max_batch_size, max_queue_delay_us, max_queue_size, params
    )
    model_dir = Path(repo_dir) / name
    version = model_dir / "1"
    version.mkdir(parents=True, exist_ok=True)
    _link_or_copy(art, version / "artifact")
    shutil.copyfile(Path(__file__).with_name("triton_model.py"), version / "model.py")
    (model_dir / "config.pbtxt").write_text(text, encoding="utf-8")
    return model_dir


# ---- the Python model.py runs in --------------------------------------------------------------
# What model.py imports, checked in the interpreter tritonserver's stub will run it with, before
# a server is started: a Python that cannot run it makes Triton fail the load (or, under
# numpy 2, kill the stub on the first request) with little said about why.
_PROBE = """
import importlib, json, sys
sys.path[:0] = json.loads(sys.argv[1])
r = {"python": sys.version.split()[0], "executable": sys.executable, "errors": {}}
for mod in ("numpy", "tokenizers", "safetensors", "zoi", "zoi._cpu"):
    try:
        m = importlib.import_module(mod)
        r[mod] = str(getattr(m, "__version__", "") or "ok")
    except Exception as e:
        r["errors"][mod] = f"{type(e).__name__}: {e}"
print("ZOI-PROBE " + json.dumps(r))
"""
TRITON_ENV_HELP = (
    "the tested environment: scripts/triton_env.sh in the zoi checkout builds .venv-triton "
    "(numpy 1.26, tokenizers, safetensors, this zoi); start tritonserver with .venv-triton/bin "
    "first on PATH and that Python's libpython on LD_LIBRARY_PATH (docs/DEPLOY.md, 'Where zoi "
    "comes from inside Triton'), or install numpy<2, tokenizers, safetensors and zoi into the "
    "Python tritonserver finds"
)


def default_target_python() -> str | None:
    """The interpreter the Python backend's stub uses when tritonserver starts from this
    environment: the first `python3` on PATH."""
    return shutil.which("python3")


def check_python(
    python: str | os.PathLike | None, python_path: list[str] | None = None, timeout: float = 120
) -> tuple[dict, list[str]]:
    """Run `python` (the one model.py will run in) on what model.py imports. Returns (what it
    found, the problems: each a sentence naming what is wrong and the fix; empty when model.py
    can run there)."""
    if python is None:
        return {}, [
            "no python3 on PATH: tritonserver's Python backend runs model.py with the first "
            f"python3 on its PATH; {TRITON_ENV_HELP}"
        ]
    paths = [str(Path(p).resolve()) for p in python_path or []]
    try:
        r = subprocess.run(
            [str(python), "-c", _PROBE, json.dumps(paths)],
            capture_output=True,
            text=True,
            timeout=timeout,
            env={k: v for k, v in os.environ.items() if k not in ("PYTHONHOME", "PYTHONPATH")},
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return {}, [f"{python}: cannot run it ({e}); point --python at a Python 3 interpreter"]
    line = next((x for x in r.stdout.splitlines() if x.startswith("ZOI-PROBE ")), None)
    if line is None:
        tail = (r.stderr or r.stdout).strip().splitlines()[-3:]
        return {}, [
            f"{python}: not a working Python ({' / '.join(tail) or f'exit {r.returncode}'})"
        ]
    found = json.loads(line[len("ZOI-PROBE ") :])
    errors = found.get("errors", {})
    where = f"{found.get('executable') or python} (Python {found.get('python')})"
    problems = []
    np_version = found.get("numpy")
    if "numpy" in errors:
        problems.append(f"numpy does not import in {where}: {errors['numpy']}")
    elif np_version and np_version.split(".")[0].isdigit() and int(np_version.split(".")[0]) >= 2:
        problems.append(
            f"numpy {np_version} in {where}: the Python backend of tritonserver 2.51 "
            "(nvidia-pytriton 0.7.0, the tested server) is built for numpy 1.x; under numpy 2 "
            "model.py refuses to load (its stub would die on the first request). Use a Python "
            "with numpy<2 (a tritonserver built for numpy 2: set its config parameter "
            'zoi_allow_numpy2 to "true")'
        )
    for mod in ("tokenizers", "safetensors"):
        if mod in errors:
            problems.append(f"{mod} does not import in {where}: {errors[mod]}")
    if "zoi" in errors:
        problems.append(
            f"zoi does not import in {where}: {errors['zoi']}; install zoi there or pass its "
            "folders with --python-path"
        )
    elif "zoi._cpu" in errors:
        problems.append(
            f"zoi's native core does not import in {where}: {errors['zoi._cpu']}; the CPU "
            "engine needs it (build it there: scripts/setup.sh)"
        )
    if problems:
        problems.append(TRITON_ENV_HELP)
    return found, problems


# ---- the server -------------------------------------------------------------------------------
def default_venv() -> Path:
    env = os.environ.get("ZOI_TRITON_VENV")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[3] / ".venv-triton"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class TritonServerProcess(ChildServer):
    """`tritonserver` from a pytriton environment on 127.0.0.1, on free ports; SIGTERM to stop.

    The Python backend's stub is embedded Python that finds its prefix through `python3` on
    PATH: the environment's bin/ goes first on PATH, and its base interpreter's libpython on
    LD_LIBRARY_PATH, so model.py runs on that environment's packages.
    """

    def __init__(
        self,
        repo: str | os.PathLike,
        venv: str | os.PathLike | None = None,
        log_path: str | os.PathLike | None = None,
        startup_timeout: float = 300.0,
        extra_args: list[str] | None = None,
        env: dict | None = None,
        supervise: bool = True,
    ):
        self.repo = Path(repo).resolve()
        self.reloads: list[str] = []  # models reloaded after a dead instance, in order
        self.venv = Path(venv) if venv else default_venv()
        py = self.venv / "bin" / "python"
        if not py.exists():
            raise FileNotFoundError(
                f"no Triton environment at {self.venv}: run scripts/triton_env.sh "
                "(or set ZOI_TRITON_VENV)"
            )
        info = subprocess.run(
            [
                str(py),
                "-c",
                "import sys, sysconfig, pytriton, os; "
                "print(os.path.dirname(pytriton.__file__)); print(sysconfig.get_config_var('LIBDIR'));"
                "print(f'{sys.version_info[0]}.{sys.version_info[1]}')",
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split("\n")
        pkg, libdir, pyver = Path(info[0]), info[1], info[2]
        dist = pkg / "tritonserver"
        stub = dist / "backends" / "python" / "triton_python_backend_stub"
        if not stub.exists():
            shutil.copy(dist / "python_backend_stubs" / pyver / "triton_python_backend_stub", stub)
            stub.chmod(0o755)
        self.http_port, self.grpc_port, self.metrics_port = _free_port(), _free_port(), _free_port()
        cmd = [
            str(dist / "bin" / "tritonserver"),
            f"--model-repository={Path(repo).resolve()}",
            f"--backend-directory={dist / 'backends'}",
            f"--cache-directory={dist / 'caches'}",
            "--http-address=127.0.0.1",
            f"--http-port={self.http_port}",
            "--grpc-address=127.0.0.1",
            f"--grpc-port={self.grpc_port}",
            f"--metrics-port={self.metrics_port}",
            "--allow-metrics=true",
            "--allow-gpu-metrics=false",
            "--strict-readiness=true",
            "--exit-on-error=true",
            "--log-verbose=0",
            "--exit-timeout-secs=10",
            # The Python backend starts each instance with a 1 MB shared-memory region and grows
            # it 1 MB at a time under load; every growth remaps the region in both processes.
            # Start at 16 MB (tmpfs pages cost nothing until touched) so that a loaded
            # instance rarely grows at all.
            "--backend-config=python,shm-default-byte-size=16777216",
            "--backend-config=python,shm-growth-byte-size=16777216",
            *(["--model-control-mode=explicit", "--load-model=*"] if supervise else []),
            *(extra_args or []),
        ]
        full = {**os.environ, **(env or {})}
        full["PATH"] = f"{self.venv / 'bin'}:{full.get('PATH', '')}"
        libs = [str(pkg.parent / "nvidia_pytriton.libs"), libdir]
        if full.get("LD_LIBRARY_PATH"):
            libs.append(full["LD_LIBRARY_PATH"])
        full["LD_LIBRARY_PATH"] = ":".join(libs)
        full.pop("PYTHONHOME", None)
        super().__init__(cmd, env=full, log_path=log_path, merge_stdout=True, session=True)
        self.url = f"http://127.0.0.1:{self.http_port}"
        self.grpc_url = f"127.0.0.1:{self.grpc_port}"
        self._wait_ready(startup_timeout)
        self._stop = threading.Event()
        self._watch = None
        if supervise:
            self._watch = threading.Thread(target=self._supervise, daemon=True)
            self._watch.start()

    # A Python-backend instance whose stub dies is not restarted by this Triton: it fails its
    # share of the model's requests ("Stub process ... is not healthy", HTTP 500) for good.
    # The supervisor reloads such a model (explicit model control, a config override that
    # only bumps a parameter): Triton loads fresh instances, then retires the old ones.
    def _supervise(self) -> None:
        known: dict[int, str] = {}  # live stub pid -> its model
        retiring: set[int] = set()  # stubs of a generation we replaced: they may go
        gen = 0
        while not self._stop.wait(0.5):
            now = {pid: (st, m) for pid, st, m in self._stubs()}
            dead: set[str] = set()
            for pid, model in list(known.items()):
                st = now.get(pid, ("gone", model))[0]
                if st in ("Z", "X", "gone"):
                    del known[pid]
                    if pid not in retiring and not self._stop.is_set():
                        dead.add(model)
            for pid, (st, m) in now.items():
                if m and st not in ("Z", "X") and pid not in retiring:
                    known.setdefault(pid, m)
            for model in sorted(dead):
                gen += 1
                old = {p for p, m in known.items() if m == model}
                try:
                    self.reload(model, gen)
                except Exception as e:  # keep watching; the log says why
                    self.lines.append(f"zoi supervisor: reloading {model} failed: {e}\n")
                    continue
                retiring |= old
                for p in old:
                    known.pop(p, None)

    def reload(self, model: str, generation: int = 1) -> None:
        """Reload `model` with fresh instances (its config, a parameter bumped)."""
        import json

        with urllib.request.urlopen(f"{self.url}/v2/models/{model}/config", timeout=30) as r:
            cfg = json.loads(r.read())
        cfg.setdefault("parameters", {})["zoi_generation"] = {"string_value": str(generation)}
        body = json.dumps({"parameters": {"config": json.dumps(cfg)}}).encode()
        req = urllib.request.Request(
            f"{self.url}/v2/repository/models/{model}/load",
            data=body,
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=300) as r:
            r.read()
        self.reloads.append(model)
        self.lines.append(f"zoi supervisor: reloaded {model} (an instance had died)\n")

    def _stubs(self) -> list[tuple[int, str, str | None]]:
        """(pid, state, model) of each Python-backend stub of this server."""
        out = []
        for d in Path("/proc").iterdir():
            if not d.name.isdigit():
                continue
            try:
                rest = (d / "stat").read_text().rsplit(")", 1)[1].split()
                if int(rest[1]) != self.proc.pid or "triton_python" not in (d / "comm").read_text():
                    continue
                model = None
                args = (d / "cmdline").read_bytes().split(b"\0")
                if len(args) > 1 and args[1].endswith(b"model.py"):
                    model = Path(args[1].decode()).parent.parent.name
                out.append((int(d.name), rest[0], model))
            except (OSError, ValueError, IndexError):
                continue
        return out

    def _wait_ready(self, timeout: float) -> None:
        def ready() -> bool:
            try:
                with urllib.request.urlopen(self.url + "/v2/health/ready", timeout=2) as r:
                    return r.status == 200
            except (urllib.error.URLError, OSError):
                return False

        if self.wait_until(ready, timeout):
            return
        if self.proc.poll() is not None:
            self._pump.join(5)
            raise RuntimeError(
                f"tritonserver exited with {self.proc.returncode}:\n" + self.log()[-4000:]
            )
        self.stop()
        raise RuntimeError(f"tritonserver not ready after {timeout:.0f} s:\n" + self.log()[-4000:])

    def diagnose(self, tail: int = 3000) -> str:
        """What a failed check should print: whether the server lives (or the signal that
        ended it), its stubs, and the end of its log."""
        rc = self.proc.poll()
        state = "running" if rc is None else f"exited with {rc}"
        return f"tritonserver {state}; stubs {self._stubs()}\n" + self.log()[-tail:]

    def stub_pids(self, model: str | None = None) -> list[int]:
        """Process ids of the live Python-backend stubs (one per model instance)."""
        return sorted(
            p for p, st, m in self._stubs() if st not in ("Z", "X") and model in (None, m)
        )

    def stop(self, timeout: float = 60.0) -> int | None:
        if getattr(self, "_stop", None) is not None:
            self._stop.set()  # the supervisor first: no reload of what is being stopped
        return super().stop(timeout)


# ---- the command ----------------------------------------------------------------------------------
def _check_target(args) -> bool:
    """Check the Python model.py will run in; print what was found. True when it can."""
    python = args.python or default_target_python()
    found, problems = check_python(python, args.python_path)
    if not problems:
        print(
            f"checked {found['executable']} (Python {found['python']}, numpy {found['numpy']}, "
            f"zoi {found['zoi']}): model.py can run there",
            file=sys.stderr,
        )
        return True
    shown = python or "python3 (none on PATH)"
    print(
        f"zoi export triton: the Python model.py would run in cannot run it: {shown}",
        file=sys.stderr,
    )
    for p in problems:
        print(f"  - {p}", file=sys.stderr)
    return False


def cmd_export_triton(args) -> int:
    from zoi.integrations.gpus import parse_gpus

    if args.check:
        return 0 if _check_target(args) else 2
    if not args.no_check and not _check_target(args):
        print(
            "zoi export triton: writing the repository anyway (it may be served by another "
            "Python); `--check` makes this an error",
            file=sys.stderr,
        )
    path = export_repository(
        args.artifact,
        args.repo_dir,
        name=args.name,
        instances=args.instances,
        max_queue_delay_us=args.max_queue_delay_us,
        gpus=parse_gpus(args.gpus),
        max_batch_size=args.max_batch_size,
        max_queue_size=args.max_queue_size,
        python_path=args.python_path,
    )
    print(f"wrote Triton model {path.name!r} to {path}", file=sys.stderr)
    print((path / "config.pbtxt").read_text(), end="")
    return 0


def register_export(sub) -> None:
    p = sub.add_parser(
        "triton",
        help="write a Triton Inference Server model repository (Python backend) for an artifact",
        description="Write REPO_DIR/<name>/config.pbtxt and REPO_DIR/<name>/1/model.py (+ the "
        "artifact) for tritonserver's Python backend; see docs/DEPLOY.md.",
    )
    p.add_argument("artifact", help="a zoi artifact (zoi compile MODEL -o DIR)")
    p.add_argument("repo_dir", help="model repository folder (created if missing)")
    p.add_argument("--name", default=None, help="model name (default: the artifact's model name)")
    p.add_argument(
        "--instances",
        type=int,
        default=1,
        help="model instances (engines) on the CPU, or per GPU with --gpus [default 1]",
    )
    p.add_argument(
        "--max-queue-delay-us",
        type=int,
        default=DEFAULT_QUEUE_DELAY_US,
        help=f"dynamic batching queue delay [default {DEFAULT_QUEUE_DELAY_US}]",
    )
    p.add_argument(
        "--max-batch-size",
        type=int,
        default=DEFAULT_MAX_BATCH_SIZE,
        help=f"sequences per execute batch [default {DEFAULT_MAX_BATCH_SIZE}]",
    )
    p.add_argument(
        "--max-queue-size",
        type=int,
        default=None,
        help="requests queued before Triton rejects (overload -> UNAVAILABLE) [default: unbounded]",
    )
    p.add_argument(
        "--gpus",
        default=None,
        help="'all' (instances on every GPU) or ids like 0,1 (one instance group "
        "per GPU); default: the CPU",
    )
    p.add_argument(
        "--python-path",
        action="append",
        default=None,
        metavar="DIR",
        help="folder model.py puts on sys.path before importing zoi (repeatable)",
    )
    p.add_argument(
        "--python",
        default=None,
        metavar="PY",
        help="the Python tritonserver's Python backend will run model.py with, checked for what "
        "model.py imports (default: the first python3 on PATH, as the backend finds it)",
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="only check that Python (exit 2 when model.py cannot run there); write nothing",
    )
    p.add_argument(
        "--no-check", action="store_true", help="write the repository without checking the Python"
    )
    p.set_defaults(func=cmd_export_triton)
