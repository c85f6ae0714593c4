"""Host memory the decoder's sized buffers take, checked before they are allocated.

The KV pool, the block tables and a backend's step buffers grow with options a user picks
(kv_blocks, block_size, max_batch, max_seq_len, max_tokens). Too large a value must be refused
with the option and the bytes named, not left to a MemoryError with no message, a native
std::bad_alloc or the kernel's OOM killer part-way through allocating.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from zoi.errors import InputError

# per entry of a Python list of ints: the pointer and, past the small-int cache, the int object
PY_INT_BYTES = 8 + 28


@dataclass(frozen=True)
class Part:
    """One sized allocation: what it is (with the option values that size it), the option to
    lower when it is the largest, and its bytes."""

    what: str
    option: str | None
    nbytes: int


def _meminfo_available() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _cgroup_room() -> int | None:
    """What the cgroup v2 limit of this process still allows (a container's memory limit)."""
    try:
        lim = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if lim == "max":
            return None
        used = int(Path("/sys/fs/cgroup/memory.current").read_text().strip())
        return max(0, int(lim) - used)
    except (OSError, ValueError):
        return None


def _address_space_room() -> int | None:
    """What an address-space limit (ulimit -v) still allows this process to map."""
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
        if soft == resource.RLIM_INFINITY:
            return None
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmSize:"):
                return max(0, soft - int(line.split()[1]) * 1024)
    except (ImportError, OSError, ValueError, IndexError):
        pass
    return None


def available_host_bytes() -> tuple[int, str] | None:
    """(bytes, what they are) this process can still allocate: the kernel's MemAvailable, lowered
    to what a cgroup limit or an address-space limit leaves; the physical memory (as the
    encoder's arena check) where none is known; None when nothing is (no check then)."""
    found = []
    avail = _meminfo_available()
    if avail is not None:
        found.append((avail, "available"))
    room = _cgroup_room()
    if room is not None:
        found.append((room, "left under this container's memory limit"))
    room = _address_space_room()
    if room is not None:
        found.append((room, "left under this process's address-space limit (ulimit -v)"))
    if found:
        return min(found)
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "of memory"
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not POSIX
        return None


def human_bytes(n: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if n < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} PiB"  # pragma: no cover


FLAGS = {  # the `zoi serve` flag of each option, for the message
    "kv_blocks": "--kv-blocks",
    "block_size": "--kv-block-size",
    "max_batch": "--max-running-requests",
    "max_seq_len": "--max-seq-len",
}


def check_host_memory(parts: list[Part], where: str) -> None:
    """InputError when the parts together need more host memory than is available."""
    check_fits(parts, where, available_host_bytes(), "host memory", "this machine")


def check_fits(
    parts: list[Part], where: str, room: tuple[int, str] | None, memory: str, place: str
) -> None:
    """InputError when the parts need more than room (bytes, what they are; None: unknown, no
    check): the message gives the total, each part's bytes and the option to lower (the
    largest part's)."""
    total = sum(p.nbytes for p in parts)
    if room is None or total <= room[0]:
        return
    parts = sorted(parts, key=lambda p: -p.nbytes)
    big = [p for p in parts if p.nbytes >= total / 100] or parts[:1]  # the ones that matter
    listing = "; ".join(f"{p.what}: {human_bytes(p.nbytes)}" for p in big)
    worst = next((p.option for p in parts if p.option), None)
    if worst is None or sum(p.nbytes for p in parts if p.option is None) > room[0]:
        fix = "the model's own weights are over it alone: use a machine with more memory"
    else:
        fix = f"lower {worst}" + (f" (zoi serve {FLAGS[worst]})" if worst in FLAGS else "")
    raise InputError(
        f"{where} need {human_bytes(total)} ({total} bytes) of {memory}, more than the "
        f"{human_bytes(room[0])} {room[1]} on {place}: {listing}; {fix}"
    )
