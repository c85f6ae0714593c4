"""The C++ core on aarch64, under emulation (scripts/arm_check.sh, docs/ARM.md).

The kernels are cross-compiled for aarch64 and run under qemu-aarch64 against the portable scalar
kernels: every ARM ISA (neon, dotprod, i8mm) on -cpu max, each forced by ZOI_CPU_ISA, detection on
Cortex-A53 (NEON only) and Neoverse N1 (no i8mm), the scalar table's outputs against the x86-64
build's, the native WordPiece tokenizer against the x86-64 ids. Then one INT8 GEMM computed by
the aarch64 i8mm kernels is replayed through this machine's zoi._cpu on every x86 ISA: the same
s32 sums. End to end: the bundled all-MiniLM-L6-v2 compiled INT8 here, its native plan exported
(scripts/arm_engine_export.py) and replayed into the same engine.cc on aarch64
(csrc/tests/arm_engine_test.cc): the scalar engine's embeddings equal the x86-64 scalar engine's
bit for bit, neon / dotprod / i8mm equal one another bit for bit and lie within the stated
tolerance of every x86-64 ISA's. The objects are cached outside the tree (~/.cache/zoi/arm-obj:
a warm run takes ~15 s on 2 idle cores).

On an x86-64 Linux host the cross toolchain is required: without it the test fails and says
what to install (scripts/setup.sh installs it when run as root).
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from tests.fixtures import supported_isas

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "build" / "arm"
INSTALL = "apt-get install -y --no-install-recommends g++-aarch64-linux-gnu qemu-user"

pytestmark = pytest.mark.skipif(
    not (sys.platform.startswith("linux") and platform.machine().lower() in ("x86_64", "amd64")),
    reason="the aarch64 emulation check runs on x86-64 Linux hosts",
)


@dataclass
class ArmCheck:
    returncode: int
    stdout: str
    stderr: str
    gemm: dict = field(default_factory=dict)  # file name -> (aarch64 export, x86-64 export)
    logs: dict = field(default_factory=dict)  # run name -> its log (build/arm/logs)


def _read_gemm(path: Path):
    raw = path.read_bytes()
    M, N, K = np.frombuffer(raw, np.int32, 3)
    at = 12
    q = np.frombuffer(raw, np.int32, M * K, at).reshape(M, K)
    at += 4 * M * K
    zp = np.frombuffer(raw, np.int32, M, at)
    at += 4 * M
    w = np.frombuffer(raw, np.int8, N * K, at).reshape(N, K)
    at += N * K
    y = np.frombuffer(raw, np.int32, M * N, at).reshape(M, N)
    assert at + 4 * M * N == len(raw)
    return q, zp, w, y


@pytest.fixture(scope="module")
def arm_check() -> ArmCheck:
    tools = ("aarch64-linux-gnu-g++", "qemu-aarch64", "g++")
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        pytest.fail(
            f"the aarch64 check needs {', '.join(missing)}: install with `sudo {INSTALL}` "
            "(scripts/setup.sh does it when run as root)"
        )
    import fcntl  # Unix only: the module is skipped elsewhere

    OUT.mkdir(parents=True, exist_ok=True)
    # build/arm is shared by every run in this tree: held from the build to the reading of its files
    with open(OUT / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        r = subprocess.run(
            ["bash", str(ROOT / "scripts" / "arm_check.sh")],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=900,
            env={**os.environ, "ZOI_ARM_LOCK_HELD": "1"},
        )
        res = ArmCheck(r.returncode, r.stdout, r.stderr)
        for log in (OUT / "logs").glob("engine-*.log"):
            res.logs[log.stem] = log.read_text()
        if r.returncode == 0:
            for name in ("gemm_sym.bin", "gemm_asym.bin"):
                res.gemm[name] = (
                    _read_gemm(OUT / "export_arm" / name),
                    _read_gemm(OUT / "export_x86" / name),
                )
    return res


def test_arm_kernels_under_qemu(arm_check):
    out = arm_check.stdout + arm_check.stderr
    assert arm_check.returncode == 0 and "arm_check: PASS" in arm_check.stdout, out[-6000:]
    # every run of the script reported, none skipped
    for run in (
        "max",
        "cortex-a53",
        "neoverse-n1",
        *(f"max-forced-{i}" for i in ("neon", "dotprod", "i8mm")),
        "engine-max",
        "engine-cortex-a53",
    ):
        assert f"arm_check: {run} (" in arm_check.stdout, out[-3000:]


@pytest.mark.parametrize("name", ["gemm_sym.bin", "gemm_asym.bin"])
def test_arm_gemm_sums_equal_this_machines(arm_check, name):
    assert arm_check.returncode == 0, (arm_check.stdout + arm_check.stderr)[-3000:]
    from zoi import _cpu

    (q, zp, w, y_arm), (q86, zp86, w86, y86) = arm_check.gemm[name]
    # the same operands (one random stream on both architectures), the same sums
    np.testing.assert_array_equal(q, q86)
    np.testing.assert_array_equal(zp, zp86)
    np.testing.assert_array_equal(w, w86)
    np.testing.assert_array_equal(y_arm, y86)
    asym = name == "gemm_asym.bin"
    for isa in supported_isas():
        out = np.full(y_arm.shape, -(2**31), np.int32)
        _cpu.k_gemm_s32(q.astype(np.int16), zp.copy() if asym else None, w.copy(), out, isa, 2)
        np.testing.assert_array_equal(out, y_arm, err_msg=f"zoi._cpu {isa} vs aarch64 i8mm")


def test_arm_engine_minilm_matches_x86(arm_check):
    """The whole MiniLM INT8 forward on aarch64 (engine.cc replaying the x86-64 plan), per ISA."""
    assert arm_check.returncode == 0, (arm_check.stdout + arm_check.stderr)[-3000:]
    log = arm_check.logs["engine-max"]
    assert log.rstrip().endswith("0 failed") and log.startswith("engine plan"), log[-3000:]
    batches = 3  # the two texts together, then each alone (scripts/arm_engine_export.py)
    for isa in ("scalar", "neon", "dotprod", "i8mm"):
        lines = [ln for ln in log.splitlines() if ln.startswith(f"{isa} batch ")]
        assert len(lines) == batches, log
        for ln in lines:  # every x86-64 ISA compared
            assert all(f"x86 {x} " in ln for x in supported_isas()), ln
            if isa == "scalar":
                assert "x86 scalar bit-identical" in ln, ln
            elif isa != "neon":
                assert ln.endswith("= neon bit for bit"), ln
    a53 = arm_check.logs["engine-cortex-a53"]
    assert "active neon" in a53 and a53.rstrip().endswith("0 failed"), a53


def test_sysinfo_reads_arm_cpu_flags():
    from zoi.bench.sysinfo import parse_cpuinfo

    # /proc/cpuinfo of an aarch64 Linux (Neoverse V1: dot product, i8mm, SVE)
    text = (
        "processor\t: 0\nBogoMIPS\t: 2100.00\n"
        "Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid "
        "asimdrdm jscvt fcma lrcpc dcpop sha3 sm3 sm4 asimddp sha512 sve asimdfhm dit uscat ilrcpc "
        "flagm ssbs paca pacg dcpodp svei8mm svebf16 i8mm bf16 dgh rng\n"
        "CPU implementer\t: 0x41\nCPU architecture: 8\nCPU variant\t: 0x1\n"
        "CPU part\t: 0xd40\nCPU revision\t: 1\n\nprocessor\t: 1\nFeatures\t: fp asimd\n"
    )
    model, isa = parse_cpuinfo(text)
    assert model == "ARM implementer 0x41 part 0xd40"
    assert {"asimd", "asimddp", "i8mm", "sve", "bf16", "svei8mm"} <= set(isa)
    assert "sve2" not in isa and "aes" not in isa  # named flags only, none invented
    x86 = "model name\t: Some CPU\nflags\t\t: fpu sse4_2 avx2 fma avx512f avx512_vnni amx_int8\n"
    assert parse_cpuinfo(x86) == (
        "Some CPU",
        ["amx_int8", "avx2", "avx512_vnni", "avx512f", "fma", "sse4_2"],
    )


def test_engine_export_refuses_unknown_calls():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import arm_engine_export as ae
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    rec = ae.RecordingEngine(1024, 8, 2, "", 0)
    rec.add_pool(0, 64, 16, "mean")
    assert rec.calls == [("init", [1024, 8, 2, "", 0]), ("add_pool", [0, 64, 16, "mean"])]
    with pytest.raises(NotImplementedError, match="add_lora"):
        rec.add_lora(0, 0, None, None, "none")
