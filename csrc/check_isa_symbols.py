#!/usr/bin/env python3
"""Fail the build when an ISA-specific object file defines code outside its own namespace.

Every file under csrc/kernels is compiled once per ISA with that ISA's
flags (-mavx512bw, -mavx2, ...) into namespace zoi::<isa>. Code those files instantiate outside
that namespace (std::vector<T>::_M_fill_assign, std::to_string, an inline helper at zoi:: scope)
is a weak symbol in every ISA's object, and the linker keeps ONE copy for all callers: whichever
object comes first. When that copy is the AVX-512 one, the baseline code and the AVX2 kernels call
AVX-512 instructions and die with SIGILL on an AVX2-only CPU (it happened: the ASan build of the
AMX object's std::vector<uint8_t>::assign won over module.cc's, and tests on a Zen 3 crashed).

So the rule, checked on the object files before they are linked: an object of ISA X (X not
"scalar", whose flags are the baseline's) defines no global or weak code symbol whose demangled
name does not contain "zoi::X::". (Instantiations whose template arguments are zoi::X types are
unique to X and allowed.) Data (weak objects, DW.ref personality words) is ISA-free and ignored.
The fix for a reported symbol: move the code into zoi::X, or call a function compiled with the
base flags (e.g. zoi::throw_weight_out_of_range in kernels/dispatch.cc for error messages).

Usage: check_isa_symbols.py [--nm NM] [--isa ISA] OBJECT...   (ISA from .../zoi_k_<isa>.dir/...)
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys

_DIR = re.compile(r"zoi_d?k_([a-z0-9]+)\.dir")
CODE_TYPES = {"T", "W", "i"}  # global text, weak text, indirect function


def isa_of(path: str, forced: str | None) -> str | None:
    if forced:
        return forced
    m = _DIR.search(path)
    return m.group(1) if m else None


def violations(
    objects: list[str], nm: str = "nm", forced_isa: str | None = None
) -> list[tuple[str, str, str]]:
    """(object, isa, demangled symbol) for every code symbol an ISA object defines outside zoi::<isa>."""
    bad = []
    for obj in objects:
        isa = isa_of(obj, forced_isa)
        if isa is None or isa == "scalar":
            continue
        out = subprocess.run(
            [nm, "-C", "--defined-only", obj], capture_output=True, text=True, check=True
        ).stdout
        for line in out.splitlines():
            parts = line.split(None, 2)
            if len(parts) == 3 and parts[1] in CODE_TYPES and f"zoi::{isa}::" not in parts[2]:
                bad.append((obj, isa, parts[2]))
    return bad


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nm", default="nm")
    ap.add_argument("--isa", default=None, help="the ISA of all OBJECTs (default: from the path)")
    ap.add_argument("objects", nargs="+")
    a = ap.parse_args(argv)
    bad = violations(a.objects, a.nm, a.isa)
    for obj, isa, sym in bad:
        print(
            f"check_isa_symbols: {obj} ({isa} flags) defines {sym!r} outside namespace zoi::{isa}: the "
            f"linker may give this copy to callers on CPUs without {isa} (SIGILL). Move it into zoi::{isa} "
            "or call code compiled with the base flags (see csrc/check_isa_symbols.py)",
            file=sys.stderr,
        )
    if not bad:
        print(f"check_isa_symbols: {len(a.objects)} objects, no ISA code outside its namespace")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
