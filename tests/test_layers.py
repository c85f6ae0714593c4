"""The layers of zoi import only downward (docs/ARCHITECTURE.md, "Layers").

Every module under src/zoi is parsed (not imported) and each of its imports, lazy ones
inside functions included, is mapped to the unit it reaches. A module may import its own
unit and any unit of a LOWER layer; never one of a higher layer, never another unit of its
own layer, never `tests`. A new package must be placed in LAYERS before it can import zoi.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"

# lowest first. A unit is a package or module of zoi (with everything under it).
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("base", ("zoi.errors", "zoi.data", "zoi._cpu", "zoi._version", "zoi.paths", "zoi.procs")),
    ("numerics", ("zoi.numerics",)),  # the INT8 primitives and the numpy reference ops
    ("frontend", ("zoi.frontend",)),  # checkpoints, ModelSpec, tokenizer
    ("graph", ("zoi.graph",)),  # IR, builder, memory planner, CompiledModel
    ("backends", ("zoi.backends",)),  # reference, cpu, cuda
    ("quant", ("zoi.quant",)),  # calibrates and searches on the backends' own kernels
    ("heads", ("zoi.heads",)),  # task heads' API: the Engine mixes it in
    ("pipeline", ("zoi.pipeline",)),  # the chunk loop on submit / wait
    # the compile's checks, safe saves, the task adapters' engine side
    ("engine parts", ("zoi.compile_checks", "zoi.savefiles", "zoi.adapters")),
    ("engine", ("zoi.engine", "zoi.decoder")),  # encoders; decoders (zoi/decoder/api.py)
    ("entry points", ("zoi.api",)),  # which compiler a folder goes to
    ("artifact cache", ("zoi.cache",)),  # compile once per model and options (demo, serve)
    ("api", ("zoi",)),  # the package root: zoi.compile / zoi.load / zoi.Engine
    ("surfaces", ("zoi.serve", "zoi.bench", "zoi.tools")),
    ("scale-out", ("zoi.integrations",)),  # Triton / Ray: builds on zoi.serve and zoi.bench
    ("cli", ("zoi.cli",)),
    ("python -m zoi", ("zoi.__main__",)),  # runs the cli
)

# inside a unit: these submodules do not import each other (each backend stands alone;
# zoi.backends itself (make_backend) and zoi.backends.base are shared)
SIBLINGS: tuple[tuple[str, ...], ...] = (
    ("zoi.backends.reference", "zoi.backends.cpu", "zoi.backends.cuda"),
)

# `from zoi import NAME` where NAME is an attribute of the root, not a submodule
ROOT_NAMES = {"__version__": "zoi._version", "ZoiError": "zoi.errors"}

LEVEL = {u: i for i, (_, units) in enumerate(LAYERS) for u in units}


def unit_of(name: str) -> str | None:
    """The unit of a dotted zoi name (None: in no layer)."""
    if name == "zoi":
        return "zoi"
    best = None
    for u in LEVEL:
        if u != "zoi" and (name == u or name.startswith(u + ".")):
            if best is None or len(u) > len(best):
                best = u
    return best


def _sibling_group(name: str) -> str | None:
    for group in SIBLINGS:
        for s in group:
            if name == s or name.startswith(s + "."):
                return s
    return None


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_names(module: str, source: str, is_package: bool = False) -> list[tuple[int, str]]:
    """(line, dotted name) of every zoi / tests import in the source of `module`."""
    out = []
    modules = _known_modules()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the importing package
                pkg = module.split(".") if is_package else module.split(".")[:-1]
                pkg = pkg[: len(pkg) - (node.level - 1)]
                base = ".".join(pkg + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for a in node.names:
                full = f"{base}.{a.name}"
                if base == "zoi" and a.name in ROOT_NAMES:
                    out.append((node.lineno, ROOT_NAMES[a.name]))
                elif full in modules or base == "zoi":
                    out.append((node.lineno, full))  # a submodule (or a root attribute)
                else:
                    out.append((node.lineno, base))
    out = sorted(set(out))  # `from X import a, b`: X once
    return [(ln, n) for ln, n in out if n.split(".")[0] in ("zoi", "tests")]


def _root_target(name: str) -> str:
    """`from zoi import X`: X a submodule -> zoi.X; else an attribute of the API root."""
    return name if unit_of(name) not in (None, "zoi") else "zoi"


def violations(module: str, source: str, is_package: bool = False) -> list[str]:
    src_unit = unit_of(module)
    if src_unit is None:
        return [f"{module}: in no layer of tests/test_layers.py LAYERS (place it there)"]
    bad = []
    for line, name in imported_names(module, source, is_package):
        where = f"{module}:{line} imports {name}"
        if name.split(".")[0] == "tests":
            bad.append(f"{where}: src/ never imports tests/")
            continue
        if name.startswith("zoi.") and name.count(".") == 1 and unit_of(name) is None:
            name = _root_target(name)
        dst = unit_of(name)
        if dst is None:
            bad.append(f"{where}: {name} is in no layer of LAYERS")
        elif dst == src_unit:
            a, b = _sibling_group(module), _sibling_group(name)
            if a and b and a != b:
                bad.append(f"{where}: sibling backends do not import each other")
        elif LEVEL[dst] >= LEVEL[src_unit]:
            kind = "sideways" if LEVEL[dst] == LEVEL[src_unit] else "up"
            bad.append(
                f"{where}: points {kind} ({LAYERS[LEVEL[src_unit]][0]} -> {LAYERS[LEVEL[dst]][0]})"
            )
    return bad


_MODULES: set[str] = set()


def _known_modules() -> set[str]:
    if not _MODULES:
        _MODULES.update(module_name(p) for p in (SRC / "zoi").rglob("*.py"))
        _MODULES.add("zoi._cpu")  # the native extension (a .so, not a .py)
    return _MODULES


def _sources():
    return sorted((SRC / "zoi").rglob("*.py"))


def test_every_import_in_src_points_down():
    bad = []
    for p in _sources():
        bad += violations(module_name(p), p.read_text(encoding="utf-8"), p.name == "__init__.py")
    assert not bad, "imports against the layers (docs/ARCHITECTURE.md):\n" + "\n".join(bad)


def test_the_walk_sees_the_whole_tree():
    mods = {module_name(p) for p in _sources()}
    for m in ("zoi.numerics.reference", "zoi.backends.cuda.persistent", "zoi.tools.eval"):
        assert m in mods
    assert len(mods) > 60


@pytest.mark.parametrize(
    "module, source",
    [
        ("zoi.numerics.reference", "from zoi.graph.build import linear_prefix"),
        ("zoi.numerics.primitives", "import zoi.quant"),
        ("zoi.quant.eval", "def f():\n    from zoi.engine import is_artifact\n"),
        ("zoi.backends.cpu.backend", "from zoi.quant.calibrate import calibrate"),
        ("zoi.backends.cuda.backend", "from zoi.quant import primitives"),
        ("zoi.backends.cuda.persistent", "from tests.cuda_backend.cuda_helpers import tiny_model"),
        ("zoi.backends.cpu.backend", "from zoi.backends.cuda import CudaBackend"),
        ("zoi.bench.cli", "from zoi.serve.loadtest import register_bench"),
        ("zoi.engine", "import zoi"),
        ("zoi.graph.ir", "from zoi import compile"),
        ("zoi.frontend.spec", "from ..graph import ir"),
        ("zoi.newthing", "import numpy"),
    ],
)
def test_an_import_against_the_layers_is_caught(module, source):
    assert violations(module, source)


@pytest.mark.parametrize(
    "module, source",
    [
        ("zoi.numerics.reference", "from zoi.numerics import primitives as qp"),
        ("zoi.quant.pipeline", "from zoi.numerics import primitives\nimport zoi.graph.build"),
        ("zoi.backends.cuda.backend", "from zoi.backends.cuda.kernels import linear"),
        ("zoi.backends", "from zoi.backends.cpu import CpuBackend"),
        ("zoi.engine", "from zoi import quant, __version__"),
        ("zoi.serve.cli", "import zoi\nfrom zoi.engine import is_artifact"),
        ("zoi.cli", "from zoi.serve.cli import register"),
        ("zoi.frontend.checkpoint", "from .spec import ModelSpec\nimport numpy as np"),
    ],
)
def test_an_import_along_the_layers_passes(module, source):
    assert violations(module, source) == []


def _module_graph() -> dict[str, set[str]]:
    """module -> the zoi modules it imports (lazy imports included; a package's name stands
    for its __init__)."""
    mods = _known_modules()
    graph: dict[str, set[str]] = {}
    for p in _sources():
        m = module_name(p)
        out = set()
        for _, n in imported_names(m, p.read_text(encoding="utf-8"), p.name == "__init__.py"):
            while n and n not in mods:
                n = n.rsplit(".", 1)[0] if "." in n else ""
            if n and n != m:
                out.add(n)
        graph[m] = out
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_no_import_cycles():
    """No two modules import each other, directly or around a circle (lazy imports count: a
    circle hidden inside a function is still two modules that cannot be read apart)."""
    cycles = import_cycles(_module_graph())
    assert not cycles, "import circles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_the_cycle_finder_finds_one():
    g = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert import_cycles(g) == [["a", "b", "c"]]
    assert import_cycles({"a": {"b"}, "b": set()}) == []


MAX_LINES = 800  # a module longer than this does more than one thing: split it


def test_no_module_over_the_line_limit():
    long = {
        str(p.relative_to(SRC)): n
        for p in _sources()
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert not long, f"modules over {MAX_LINES} lines: {long}"


def test_nothing_in_src_or_tests_imports_lab():
    """lab/ holds experiments and their tools; the product and its tests stand without it (a
    lab tool may use the product, never the other way round)."""
    import re

    pat = re.compile(r"^\s*(from\s+lab[.\s]|import\s+lab\b)|from lab\.|import lab\.", re.M)
    found = [
        str(p.relative_to(SRC.parent))
        for top in (SRC, SRC.parent / "tests")
        for p in top.rglob("*.py")
        if pat.search(p.read_text(encoding="utf-8"))
    ]
    assert found == [], found
