"""CpuOptions: the switches of the native CPU core, passed in as an argument.

The C++ core (zoi._cpu) reads no environment variable, and nothing below the API's edge does:
``CpuOptions.from_env`` is the one place that reads the CPU variables (``ZOI_CPU_ISA`` /
``ZOI_NUM_THREADS`` / ``ZOI_PIN`` / ``ZOI_AMX_*``), called at the edge: ``zoi.compile`` /
``zoi.load`` (every device: the native tokenizer runs on the core's thread pool too), the
decoder's compile, the CLI. ``apply`` hands them to the core before it builds an engine. They are
process-wide, like the core's thread pool: the last options applied hold for every engine built
after them (an engine's own ``isa=`` / ``nthreads=`` arguments still choose per engine); a
backend given no options leaves them as they are (``current``).
"""

from __future__ import annotations

import dataclasses
import os
import platform
from dataclasses import dataclass

# the ISA names of each architecture's build (csrc/isa.h), the best first
X86_ISAS = ("amx", "vnni", "avx512", "avxvnni", "avx2", "scalar")
ARM_ISAS = ("i8mm", "dotprod", "neon", "scalar")
AMX_MIN_M = 16  # below this M, vnni's kernel (lab/cpu/README.md "AMX"; csrc/isa.h kAmxMinMDefault)
AMX_NT_BYTES = 12 << 20  # float outputs from this size leave the AMX GEMM through streaming stores

ENV_ISA = "ZOI_CPU_ISA"
ENV_THREADS = "ZOI_NUM_THREADS"
ENV_PIN = "ZOI_PIN"
ENV_AMX_MIN_M = "ZOI_AMX_MIN_M"
ENV_AMX_NT_BYTES = "ZOI_AMX_NT_BYTES"


def build_isas() -> tuple[str, ...]:
    """The ISA names this machine's build of the core knows (scalar only elsewhere)."""
    m = platform.machine().lower()
    if m in ("x86_64", "amd64"):
        return X86_ISAS
    if m in ("aarch64", "arm64"):
        return ARM_ISAS
    return ("scalar",)


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


@dataclass(frozen=True)
class CpuOptions:
    """isa: the kernels of every engine built without its own isa= (None: the best this CPU runs;
    one of build_isas()). num_threads: the process's thread pool (0: one per CPU of the affinity
    mask); an engine's nthreads= takes fewer. pin: each pool worker pinned to one CPU (False:
    placement left to the OS). amx_min_m: the AMX-INT8 GEMM leaves GEMMs of fewer rows to vnni's
    kernel (1: every M on the tile kernel). amx_nt_bytes: AMX float outputs of this many bytes or
    more are written with streaming stores (0: never). The defaults are the core's
    (zoi._cpu.cpu_option_defaults())."""

    isa: str | None = None
    num_threads: int = 0
    pin: bool = True
    amx_min_m: int = AMX_MIN_M
    amx_nt_bytes: int = AMX_NT_BYTES

    def __post_init__(self):
        if self.isa is not None and (not isinstance(self.isa, str) or self.isa not in build_isas()):
            raise ValueError(
                f"CpuOptions.isa={self.isa!r} is not one of {', '.join(build_isas())} "
                "(None: the best this CPU runs)"
            )
        if not _is_int(self.num_threads) or self.num_threads < 0:
            raise ValueError(
                f"CpuOptions.num_threads={self.num_threads!r} must be an integer >= 0 "
                "(0: one thread per CPU)"
            )
        if not isinstance(self.pin, bool):
            raise ValueError(f"CpuOptions.pin={self.pin!r} must be True or False")
        if not _is_int(self.amx_min_m) or self.amx_min_m < 1:
            raise ValueError(
                f"CpuOptions.amx_min_m={self.amx_min_m!r} must be an integer >= 1 "
                "(1: every M on the AMX tile kernel)"
            )
        if not _is_int(self.amx_nt_bytes) or self.amx_nt_bytes < 0:
            raise ValueError(
                f"CpuOptions.amx_nt_bytes={self.amx_nt_bytes!r} must be an integer >= 0 "
                "(0: no streaming stores)"
            )

    def replace(self, **kw) -> CpuOptions:
        return dataclasses.replace(self, **kw)

    @classmethod
    def from_env(cls, env=None, **kw) -> CpuOptions:
        """Options with the environment's overrides (the API's edge only; an empty variable is
        unset): ZOI_CPU_ISA=NAME (isa), ZOI_NUM_THREADS=N (num_threads), ZOI_PIN=0|1 (pin),
        ZOI_AMX_MIN_M=M, ZOI_AMX_NT_BYTES=B. `kw` are fields that win over the environment."""
        env = os.environ if env is None else env
        got: dict = {}
        isa = env.get(ENV_ISA)
        if isa:
            if isa not in build_isas():
                raise ValueError(
                    f"{ENV_ISA}={isa} is not one of {', '.join(build_isas())} "
                    f"(unset {ENV_ISA} for the best this CPU runs)"
                )
            got["isa"] = isa
        for var, field, lo, meaning in (
            (ENV_THREADS, "num_threads", 0, "0: one thread per CPU"),
            (ENV_AMX_MIN_M, "amx_min_m", 1, "1: every M on the AMX tile kernel"),
            (ENV_AMX_NT_BYTES, "amx_nt_bytes", 0, "0: no streaming stores"),
        ):
            raw = env.get(var)
            if not raw:
                continue
            try:
                v = int(raw.strip())
            except ValueError:
                v = None
            if v is None or v < lo:
                raise ValueError(f"{var}={raw} must be an integer >= {lo} ({meaning})")
            got[field] = v
        pin = env.get(ENV_PIN)
        if pin:
            if pin not in ("0", "1"):
                raise ValueError(
                    f"{ENV_PIN}={pin} must be 0 (placement left to the OS) or 1 (pinned)"
                )
            got["pin"] = pin == "1"
        got.update(kw)
        return cls(**got)

    def apply(self) -> CpuOptions:
        """Hands the options to the core (zoi._cpu): the forced ISA, the AMX thresholds, and the
        thread pool's size and pinning (a running pool restarts its workers when they change).
        An ISA this CPU does not run is refused (ValueError) before anything changes."""
        from zoi import _cpu

        if self.isa is not None and not _cpu.isa_supported(self.isa):
            runs = [i for i in build_isas() if _cpu.isa_supported(i)]
            raise ValueError(
                f"CpuOptions.isa={self.isa!r} ({ENV_ISA}) is not supported by this CPU "
                f"(it runs: {', '.join(runs)})"
            )
        _cpu.set_forced_isa(self.isa or "")
        _cpu.set_amx_thresholds(self.amx_min_m, self.amx_nt_bytes)
        _cpu.configure_pool(self.num_threads, self.pin)
        global _applied
        _applied = self
        return self


_applied: CpuOptions | None = None  # the options the core holds (None: its defaults)


def current() -> CpuOptions:
    """The options the core holds now: the last applied, else the defaults (which the core
    starts with)."""
    return _applied if _applied is not None else CpuOptions()


def apply_cpu_options(options: CpuOptions | None = None) -> CpuOptions:
    """`options` handed to the core (None: nothing changes, no environment read); returns the
    options the core holds. Called where a CPU engine is created, before the core builds it."""
    if options is not None and not isinstance(options, CpuOptions):
        raise TypeError(
            f"cpu_options must be a zoi.backends.cpu.options.CpuOptions, got "
            f"{type(options).__name__}"
        )
    return options.apply() if options is not None else current()
