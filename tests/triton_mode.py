"""Which Triton mode the CUDA tests run in: the interpreter on the CPU (TRITON_INTERPRET=1, CI)
unless a real GPU run asked for compiled kernels (ZOI_TRITON_COMPILED=1, scripts/gpu_check.sh).

The variable must be set before triton is imported, so the conftests of the folders that run
Triton kernels call `select()` at collection time and `configure(config)` in pytest_configure.
"""

from __future__ import annotations

import os


def select() -> None:
    if os.environ.get("ZOI_TRITON_COMPILED") != "1":
        os.environ.setdefault("TRITON_INTERPRET", "1")
    if interpreted():
        _scan_language_once()


def _scan_language_once() -> None:
    """The interpreter patches triton.language's builtins before a kernel runs, and again on
    every call of a @triton.jit helper from inside it (in every program), each time finding
    them with inspect.getmembers over tl, tl.core, tl.tensor and tl.math: up to two fifths of
    an interpreted test's time. The builtins of a package never change, so their names are
    listed once here, before any launch; and once a package's builtins are all wrapped, only
    the end of the launch (its patch scope's restore) puts builtins back, so until then a scan
    finds nothing to wrap and is skipped. Each scan that runs checks and wraps exactly what the
    interpreter's own would (in its order), so the kernels run as before."""
    import inspect

    try:
        import triton.language as tl
        from triton.runtime import interpreter as ti
    except ImportError:
        return
    scan = getattr(ti, "_patch_builtin", None)
    if scan is None or getattr(scan, "names_listed_once", False):
        return
    scope_cls = getattr(ti, "_LangPatchScope", None)
    if scope_cls is None or not hasattr(ti, "_patch_attr") or not hasattr(tl.core, "is_builtin"):
        return  # another interpreter: leave it as it is
    is_builtin = tl.core.is_builtin
    pkgs = [tl, tl.core, tl.tensor, tl.math, getattr(tl.core, "tensor_descriptor_base", None)]
    names = {
        id(p): (p, [n for n, m in inspect.getmembers(p) if is_builtin(m)])
        for p in pkgs
        if p is not None
    }
    wrapped: set[int] = set()  # packages whose builtins are all wrapped since the last restore

    def _patch_builtin(pkg, builder, scope):
        known = names.get(id(pkg))
        if known is None or known[0] is not pkg:
            return scan(pkg, builder, scope)
        if id(pkg) in wrapped:
            return
        for name in known[1]:
            member = getattr(pkg, name)
            if is_builtin(member):
                ti._patch_attr(pkg, name, member, builder, scope)
        wrapped.add(id(pkg))

    restore = scope_cls.restore

    def _restore(self):
        wrapped.clear()
        restore(self)

    _patch_builtin.names_listed_once = True
    ti._patch_builtin = _patch_builtin
    scope_cls.restore = _restore


def interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def configure(config) -> None:
    # the interpreter's own deprecation / divide-by-zero (inside tl.where) noise
    config.addinivalue_line(
        "filterwarnings", "ignore::DeprecationWarning:triton.runtime.interpreter"
    )
    config.addinivalue_line("filterwarnings", "ignore::RuntimeWarning:triton.runtime.interpreter")
