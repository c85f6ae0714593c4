"""Machine, versions and load: what a result file says about where it was measured."""

from __future__ import annotations

import os
import platform
import subprocess
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

PACKAGES = (
    "zoi",
    "numpy",
    "tokenizers",
    "torch",
    "transformers",
    "sentence-transformers",
    "onnx",
    "onnxruntime",
    "openvino",
    "nncf",
    "ctranslate2",
    "triton",
)


def versions() -> dict:
    out = {"python": platform.python_version()}
    for p in PACKAGES:
        try:
            out[p] = version(p)
        except PackageNotFoundError:
            out[p] = None
    return out


# the instruction-set flags a result records: x86-64 /proc/cpuinfo "flags", aarch64 "Features"
# (Linux HWCAP names: asimddp = sdot / udot, i8mm = smmla, sve / sve2, bf16; docs/ARM.md)
_ISA_PREFIXES = ("avx", "amx", "fma", "f16c", "sse4")
_ARM_FLAGS = ("asimd", "asimddp", "asimdhp", "i8mm", "bf16", "sve", "sve2", "svei8mm", "sme")


def parse_cpuinfo(text: str) -> tuple[str | None, list[str]]:
    """(model name, sorted ISA flags) from the text of /proc/cpuinfo, x86-64 or aarch64. An
    aarch64 kernel names no model: "ARM implementer 0x41 part 0xd0c" (Neoverse N1) instead."""
    model, flags, arm_ids = None, None, {}
    for ln in text.splitlines():
        k, _, v = ln.partition(":")
        k, v = k.strip(), v.strip()
        if k == "model name" and model is None:
            model = v
        elif k in ("flags", "Features") and flags is None:
            flags = set(v.split())
        elif k in ("CPU implementer", "CPU part") and k not in arm_ids:
            arm_ids[k] = v
    if model is None and arm_ids:
        model = f"ARM implementer {arm_ids.get('CPU implementer', '?')} part {arm_ids.get('CPU part', '?')}"
    flags = flags or set()
    isa = sorted(f for f in flags if f.startswith(_ISA_PREFIXES) or f in _ARM_FLAGS)
    return model, isa


def cpu_info() -> dict:
    model, isa = None, []
    try:
        with open("/proc/cpuinfo") as f:
            model, isa = parse_cpuinfo(f.read())
    except OSError:
        pass
    model = model or platform.processor() or "unknown"
    try:  # the kernels zoi's CPU core picks here (ZOI_CPU_ISA forces one)
        from zoi.backends import cpu_info as zoi_cpu_info

        zoi_isa = os.environ.get("ZOI_CPU_ISA") or zoi_cpu_info().get("best_isa")
    except Exception:
        zoi_isa = None
    try:
        import psutil

        physical = psutil.cpu_count(logical=False)
        mem = psutil.virtual_memory().total
    except ImportError:
        physical, mem = None, None
    return {
        "model": model,
        "isa": isa,
        "zoi_isa": zoi_isa,
        "logical_cores": os.cpu_count(),
        "physical_cores": physical,
        "affinity_cores": len(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")
        else None,
        "memory_bytes": mem,
        "os": platform.platform(),
    }


def gpu_info() -> dict | None:
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        p = torch.cuda.get_device_properties(0)
        info = {
            "name": p.name,
            "memory_bytes": p.total_memory,
            "count": torch.cuda.device_count(),
            "cuda": torch.version.cuda,
            "capability": f"{p.major}.{p.minor}",
        }
    except Exception:
        return None
    try:
        drv = (
            subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=20,
            )
            .stdout.strip()
            .splitlines()
        )
        info["driver"] = drv[0] if drv else None
    except Exception:
        info["driver"] = None
    return info


def git_info(root: Path) -> dict:
    def g(*a):
        try:
            return subprocess.run(
                ["git", *a], cwd=root, capture_output=True, text=True, timeout=10
            ).stdout.strip()
        except Exception:
            return ""

    commit = g("rev-parse", "HEAD") or None
    dirty = bool(g("status", "--porcelain", "--untracked-files=no")) if commit else None
    return {"commit": commit, "dirty": dirty}


def loadavg() -> list[float] | None:
    try:
        return [float(x) for x in open("/proc/loadavg").read().split()[:3]]
    except OSError:
        return None


class LoadMeter:
    """CPU used by processes other than ours, in cores, over an interval (psutil, or /proc
    directly where psutil is not installed)."""

    def __init__(self):
        try:
            import psutil
        except ImportError:
            psutil = None
        self.ps = psutil
        self.ours: dict[int, object] = {}
        self.add(os.getpid())
        self._t = self._busy = self._own = None
        self._hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

    def add(self, pid: int) -> None:
        if self.ps is None:
            self.ours[pid] = pid
            return
        try:
            self.ours[pid] = self.ps.Process(pid)
        except self.ps.Error:
            pass

    def _own_cpu(self) -> float:
        s = 0.0
        for p in list(self.ours.values()):
            try:
                if self.ps is None:
                    with open(f"/proc/{p}/stat") as f:
                        fields = f.read().rsplit(")", 1)[1].split()
                    s += (int(fields[11]) + int(fields[12])) / self._hz  # utime, stime
                else:
                    t = p.cpu_times()
                    s += t.user + t.system
            except Exception:  # the process is gone
                pass
        return s

    def _sys_busy(self) -> float:
        if self.ps is None:
            with open("/proc/stat") as f:
                v = [int(x) for x in f.readline().split()[1:]]
            # user nice system idle iowait irq softirq steal ...: busy = all but idle, iowait
            return (sum(v[:8]) - v[3] - v[4]) / self._hz
        t = self.ps.cpu_times()
        return (
            t.user
            + t.system
            + getattr(t, "nice", 0)
            + getattr(t, "irq", 0)
            + getattr(t, "softirq", 0)
            + getattr(t, "steal", 0)
        )

    def start(self) -> None:
        self._t, self._busy, self._own = time.monotonic(), self._sys_busy(), self._own_cpu()

    def stop(self) -> float:
        """Foreign cores busy on average since ``start`` (never negative)."""
        dt = time.monotonic() - self._t
        if dt <= 0:
            return 0.0
        foreign = (self._sys_busy() - self._busy) - (self._own_cpu() - self._own)
        return max(0.0, foreign / dt)

    def sample(self, seconds: float = 0.5) -> float:
        self.start()
        time.sleep(seconds)
        return self.stop()

    def wait_quiet(self, threshold: float, max_wait: float, log=print) -> dict:
        """Wait (at most ``max_wait`` s) until foreign load is below ``threshold`` cores."""
        t0 = time.monotonic()
        load = self.sample()
        waited = False
        while load > threshold and time.monotonic() - t0 < max_wait:
            if not waited:
                log(
                    f"[yellow]other load {load:.2f} cores > {threshold}: waiting up to {max_wait:.0f}s"
                )
                waited = True
            time.sleep(2.0)
            load = self.sample()
        return {
            "foreign_cores": round(load, 3),
            "waited_s": round(time.monotonic() - t0, 1),
            "quiet": load <= threshold,
        }
