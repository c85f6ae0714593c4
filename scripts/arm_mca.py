#!/usr/bin/env python3
"""llvm-mca estimates of the aarch64 INT8 GEMM inner loops against their peak loops (docs/ARM.md).

For each ARM ISA (neon, dotprod, i8mm) csrc/kernels/gemm_int8.cc and csrc/kernels/peak.cc are
compiled to assembly with CMakeLists.txt's flags (aarch64-linux-gnu-g++); the GEMM's K loop of a
full register tile is taken from the assembly (the innermost loop with the most multiply
instructions, the variant without software prefetch), the peak loop is peak.cc's register-only
loop of the same instructions. llvm-mca gives the cycles per iteration of each on a core model;
the table shows MACs per cycle of both and their ratio (the loop's share of its instructions' peak).

Without hardware this is an estimate of the issue limits only: no caches, no memory, no frequency.
LLVM 14 (Debian 12's default llvm) models Neoverse N1 / V1 as Cortex-A57; the script prefers
llvm-mca-19 (Debian 12: apt-get install llvm-19), which has the Neoverse models.

Usage: python scripts/arm_mca.py [--cpus neoverse-n1,neoverse-v1] [--mca PATH]
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CXX = "aarch64-linux-gnu-g++"
BASE = ["-std=gnu++17", "-O3", "-fno-math-errno", "-fno-trapping-math", "-ffp-contract=off"]
ISAS = {
    "neon": ["-march=armv8-a", "-DZOI_ISA_NEON"],
    "dotprod": ["-march=armv8.2-a+dotprod", "-DZOI_ISA_DOTPROD", "-DZOI_ISA_NEON"],
    "i8mm": [
        "-march=armv8.2-a+dotprod+i8mm",
        "-DZOI_ISA_I8MM",
        "-DZOI_ISA_DOTPROD",
        "-DZOI_ISA_NEON",
    ],
}
# MACs per instruction (neon: the widening multiplies; sadalp only adds)
MACS = {
    "neon": {"smull": 8, "smull2": 8, "smlal": 8, "smlal2": 8},
    "dotprod": {"sdot": 16},
    "i8mm": {"smmla": 32},
}
# cores with the ISA (N1: dot product, no i8mm)
HAS = {"neoverse-n1": {"neon", "dotprod"}, "neoverse-v1": {"neon", "dotprod", "i8mm"}}

_LABEL = re.compile(r"^(\.L\w+):")
_BRANCH = re.compile(r"^\s+(b\S*|cbn?z|tbn?z)\s+.*?(\.L\w+)\s*$")


def compile_asm(src: str, isa: str, out: Path) -> str:
    cmd = [CXX, *BASE, *ISAS[isa], f"-DZOI_NS={isa}", f"-I{ROOT / 'csrc'}", "-S", str(ROOT / src)]
    subprocess.run([*cmd, "-o", str(out)], check=True)
    return out.read_text()


def macs_of(lines: list[str], isa: str) -> int:
    total = 0
    for line in lines:
        op = line.split()[0] if line.split() else ""
        total += MACS[isa].get(op, 0)
    return total


def gemm_loop(asm: str, isa: str) -> list[str]:
    """The simple (label ... backward branch, no label inside) loop with the most MACs."""
    lines = asm.split("\n")
    labels = {m.group(1): i for i, l in enumerate(lines) if (m := _LABEL.match(l))}
    best: tuple[int, int, list[str]] | None = None
    for i, line in enumerate(lines):
        m = _BRANCH.match(line)
        if not m or labels.get(m.group(2), i) >= i:
            continue
        seg = lines[labels[m.group(2)] + 1 : i + 1]
        if any(_LABEL.match(x) for x in seg):
            continue
        body = [x for x in seg if x.startswith("\t") and not x.strip().startswith(".")]
        macs = macs_of(body, isa)
        if macs and (best is None or (macs, -len(body)) > (best[0], -best[1])):
            best = (macs, len(body), body)
    if best is None:
        sys.exit(f"no {isa} multiply loop found in gemm_int8.cc's assembly")
    return [".Lloop:", *best[2][:-1], re.sub(r"\.L\w+\s*$", ".Lloop", best[2][-1])]


def peak_loop(asm: str) -> list[str]:
    """peak.cc's inline-asm loop (from the local label 1: to b.ne 1b)."""
    body, on = [], False
    for line in asm.split("\n"):
        s = line.strip()
        if s == "1:":
            on = True
            continue
        if on:
            if s.startswith("b.ne"):
                return [".Lpeak:", *body, "\tb.ne .Lpeak"]
            if s and not s.startswith(("//", "#")):
                body.append("\t" + s)
    sys.exit("no peak loop found in peak.cc's assembly")


def mca_cycles(mca: str, cpu: str, lines: list[str], tmp: Path) -> float:
    f = tmp / "loop.s"
    f.write_text("\n".join(lines) + "\n")
    iters = 400
    out = subprocess.run(
        [
            mca,
            "-mtriple=aarch64",
            f"-mcpu={cpu}",
            "-mattr=+dotprod,+i8mm",
            f"-iterations={iters}",
            str(f),
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    m = re.search(r"Total Cycles:\s+(\d+)", out)
    if not m:
        sys.exit(f"llvm-mca gave no cycle count:\n{out[:2000]}")
    return int(m.group(1)) / iters


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cpus", default="neoverse-n1,neoverse-v1")
    ap.add_argument("--mca", default=shutil.which("llvm-mca-19") or shutil.which("llvm-mca"))
    args = ap.parse_args()
    if not args.mca or not shutil.which(CXX):
        sys.exit(f"needs {CXX} and llvm-mca (apt-get install g++-aarch64-linux-gnu llvm-19)")
    ver = subprocess.run([args.mca, "--version"], capture_output=True, text=True).stdout
    ver = re.search(r"LLVM version ([\d.]+)", ver)
    print(f"llvm-mca {ver.group(1) if ver else '?'} ({args.mca}), {CXX}\n")
    print(
        "| ISA | core | loop instructions | loop MACs | loop cycles | loop MACs/cycle"
        " | peak MACs/cycle | of peak |"
    )
    print("|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for isa in ISAS:
            g = gemm_loop(compile_asm("csrc/kernels/gemm_int8.cc", isa, tmp / "g.s"), isa)
            p = peak_loop(compile_asm("csrc/kernels/peak.cc", isa, tmp / "p.s"))
            gm, pm = macs_of(g, isa), macs_of(p, isa)
            for cpu in args.cpus.split(","):
                if isa not in HAS.get(cpu, {isa}):
                    continue  # the core lacks the instructions
                gc, pc = mca_cycles(args.mca, cpu, g, tmp), mca_cycles(args.mca, cpu, p, tmp)
                print(
                    f"| {isa} | {cpu} | {len(g) - 1} | {gm} | {gc:.2f} | {gm / gc:.1f}"
                    f" | {pm / pc:.1f} | {100 * (gm / gc) / (pm / pc):.0f}% |"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
