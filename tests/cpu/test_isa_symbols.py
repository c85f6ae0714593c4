"""csrc/check_isa_symbols.py: the build-time guard against ISA-flagged code leaking to other callers.

An ISA file compiled with -mavx2 (or AVX-512 flags) that instantiates std:: code defines it as a
weak symbol; the linker keeps one copy for every caller, so baseline code could run AVX-512
instructions (SIGILL on an AVX2-only CPU: seen on a Zen 3 with the ASan build). The guard must
reject such an object, accept one whose code is all in zoi::<isa>, and pass on this build's objects."""

from __future__ import annotations

import glob
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "csrc"))
import check_isa_symbols as chk  # noqa: E402

CXX = shutil.which("g++") or shutil.which("c++")
needs_cxx = pytest.mark.skipif(CXX is None, reason="no C++ compiler on PATH")  # the build needs one

LEAKY = r"""
#include <string>
#include <vector>
namespace zoi { namespace avx2 {
size_t f(size_t n) { std::vector<unsigned char> v; v.assign(n, 1); return std::to_string(n).size() + v.size(); }
} }
"""
CLEAN = r"""
#include <cstddef>
namespace zoi { namespace avx2 {
template <class T> T twice(T x) { return x + x; }
struct Buf { float* p = nullptr; ~Buf() {} };
size_t f(size_t n) { Buf b; return twice(n) + (b.p != nullptr); }
} }
"""


def _compile(tmp_path: Path, name: str, src: str) -> str:
    d = tmp_path / "CMakeFiles" / "zoi_k_avx2.dir"  # the ISA is read off CMake's object directory
    d.mkdir(parents=True, exist_ok=True)
    cc = d / f"{name}.cc"
    cc.write_text(src)
    obj = d / f"{name}.cc.o"
    # -O0: every inline / template function is emitted out of line (weak), as ASan builds do
    subprocess.run([CXX, "-std=c++17", "-O0", "-mavx2", "-c", str(cc), "-o", str(obj)], check=True)
    return str(obj)


@needs_cxx
def test_rejects_std_code_in_an_isa_object(tmp_path, capsys):
    obj = _compile(tmp_path, "leaky", LEAKY)
    bad = chk.violations([obj])
    names = " ".join(sym for _, _, sym in bad)
    assert all(isa == "avx2" for _, isa, _ in bad)
    assert "_M_fill_assign" in names and "to_string" in names, names
    assert chk.main([obj]) == 1
    err = capsys.readouterr().err
    assert "outside namespace zoi::avx2" in err and "SIGILL" in err


@needs_cxx
def test_accepts_code_inside_the_isa_namespace(tmp_path):
    obj = _compile(tmp_path, "clean", CLEAN)
    assert chk.violations([obj]) == []
    assert chk.main([obj]) == 0
    # the same object declared scalar (baseline flags) is never checked; forced to another ISA, its
    # zoi::avx2 code is outside zoi::vnni and is reported
    assert chk.violations([obj], forced_isa="scalar") == []
    assert chk.violations([obj], forced_isa="vnni")


def test_this_build_is_clean():
    """The objects this checkout's extension was linked from (pip's build-dir, pyproject.toml)."""
    objs = [
        o
        for o in glob.glob(
            str(ROOT / "build" / "*" / "CMakeFiles" / "zoi_*k_*.dir" / "**" / "*.o"), recursive=True
        )
        if "/sanitize/" not in o
    ]
    if not objs:
        pytest.skip("no CMake build directory under build/ (zoi installed from a wheel)")
    assert {chk.isa_of(o, None) for o in objs} >= {"scalar", "avx2", "avx512", "vnni"}
    assert chk.violations(objs) == []
