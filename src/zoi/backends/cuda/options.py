"""CudaOptions: every switch of the CUDA backend, passed in as an argument.

The defaults are what the H200 measurements chose (docs/GPU.md); tests and lab tools pass
other values. Nothing in the backend reads environment variables: ``CudaOptions.from_env``
is the one place that does, called by ``zoi.compile`` / ``zoi.load`` (the API's edge) and passed
down (Engine -> make_backend) so that ``ZOI_PERSISTENT=0|1`` still overrides an engine built by
``zoi.load(..., device='cuda')``;
``triton_interpreting`` reads Triton's own ``TRITON_INTERPRET`` (fixed when triton is
imported, not a zoi switch), against which the backend checks its ``interpret`` argument.
Fusion and the int8 copies are not options of this backend but decisions of the IR
(``zoi.graph.fusion``); what this backend does not realise is recorded in the plan's
"fallbacks". Switches measured slower on the H200 and kept off (LN fused into o / ffn2, ffn1
writing ffn2's int8 copy, the quantize launch folded into the consumer's GEMM) were removed,
and with them the second plan of the large buckets (``fuse_min_tokens``): lab/gpu/NOTES.md has
their figures.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass

PDL_MAX_TOKENS = 64  # programmatic dependent launch: measured faster at 16 tokens, slower at 128+
# buckets up to this many tokens may run the whole forward as ONE persistent launch (fp16
# weights; kernels/persistent.py): at a few sequences the per-op graph is bound by ~44 nodes
PERSISTENT_MAX_TOKENS = 256
PERSISTENT_CHOICES = ("time", "force", "off")
# the CUDA C++ persistent encoder kernel (csrc/cuda/megakernel.cu, docs/MEGAKERNEL.md) for
# buckets up to this many tokens: "off" (default until measured), "on" (where supported),
# "auto" (build it and the per-op graph, keep the faster per bucket, like persistent="time")
MEGAKERNEL_CHOICES = ("off", "on", "auto")
MEGAKERNEL_MAX_TOKENS = 1024


def triton_interpreting(env=None) -> bool:
    """Whether triton runs its interpreter (TRITON_INTERPRET=1, read by triton at import)."""
    env = os.environ if env is None else env
    return env.get("TRITON_INTERPRET") == "1"


@dataclass(frozen=True)
class CudaOptions:
    """pdl: programmatic dependent launch (None: on for compute capability >= 9.0, compiled),
    for buckets <= pdl_max_tokens. persistent_max: buckets up to this size may run the one-
    launch forward (None: PERSISTENT_MAX_TOKENS compiled, 0 in the interpreter);
    persistent: "off" (per-op graphs only: the default, since the per-op graph won every
    small bucket on the H100 and H200 and building the one-launch forward too cost ~11 s of a
    cold FP16 compile, bench/results/gpu_build_time_*h100_20261206*), "time" (build both,
    keep the faster per bucket), "force" (persistent where supported). persistent_cfg: tile overrides of the persistent
    kernel (persistent.default_cfg keys); persistent_split: one launch per stage (None: in the
    interpreter only). device_index: the GPU the backend is built on and bound to (its
    primary context, weights, arena, CUDA graphs); None: the current device (zoi.compile /
    zoi.load with device='cuda:N' set it). path_cache: a JSON file remembering, per GPU,
    software and model shape, which path won the "time" choice of each bucket, so that a
    later build compiles the winner only (backends/cuda/pathcache.py; None: time every
    build). parallel_build: worker
    processes compiling the buckets' Triton kernels before the first build of a model's shapes
    (prebuild.py; None: one per bucket, at most 8 and half the CPUs; 0: none); only with a
    path cache, which remembers that the shapes were built. megakernel: the CUDA C++
    persistent encoder kernel for buckets <= megakernel_max ("off" / "on" / "auto", above;
    it takes the place of the Triton one-launch forward where it is on)."""

    pdl: bool | None = None
    pdl_max_tokens: int = PDL_MAX_TOKENS
    persistent_max: int | None = None
    persistent: str = "off"
    persistent_cfg: dict | None = None
    persistent_split: bool | None = None
    device_index: int | None = None
    path_cache: str | None = None
    parallel_build: int | None = None
    megakernel: str = "off"
    megakernel_max: int = MEGAKERNEL_MAX_TOKENS

    def __post_init__(self):
        if self.device_index is not None and (
            not isinstance(self.device_index, int) or self.device_index < 0
        ):
            raise ValueError(
                f"CudaOptions.device_index must be an integer >= 0 or None, got "
                f"{self.device_index!r}"
            )
        if self.persistent not in PERSISTENT_CHOICES:
            raise ValueError(
                f"CudaOptions.persistent must be one of {PERSISTENT_CHOICES}, got "
                f"{self.persistent!r}"
            )
        if self.megakernel not in MEGAKERNEL_CHOICES:
            raise ValueError(
                f"CudaOptions.megakernel must be one of {MEGAKERNEL_CHOICES}, got "
                f"{self.megakernel!r}"
            )

    def replace(self, **kw) -> CudaOptions:
        return dataclasses.replace(self, **{k: v for k, v in kw.items() if v is not None})

    @classmethod
    def from_env(cls, env=None, **kw) -> CudaOptions:
        """Options with the environment's overrides (the engine / CLI edge only):
        ZOI_PERSISTENT=0 (per-op graphs only) / 1 (force the one-launch forward),
        ZOI_PERSISTENT_SPLIT=1 (one launch per stage), ZOI_PERSISTENT_CFG='{"BK": 128}';
        the path cache in the zoi cache directory (ZOI_CACHE_DIR, else ~/.cache/zoi) unless
        ZOI_CUDA_PATH_CACHE=0."""
        env = os.environ if env is None else env
        o = cls(**kw)
        if o.path_cache is None and env.get("ZOI_CUDA_PATH_CACHE") != "0":
            from zoi.paths import cache_dir

            o = o.replace(path_cache=str(cache_dir(env) / "cuda_paths.json"))
        p = env.get("ZOI_PERSISTENT")
        if p is not None:
            if p not in ("0", "1"):
                raise ValueError(f"ZOI_PERSISTENT must be 0 or 1, got {p!r}")
            o = o.replace(persistent="off" if p == "0" else "force")
        if env.get("ZOI_PERSISTENT_SPLIT") == "1":
            o = o.replace(persistent_split=True)
        cfg = env.get("ZOI_PERSISTENT_CFG")
        if cfg:
            try:
                o = o.replace(persistent_cfg=dict(json.loads(cfg)))
            except (ValueError, TypeError) as e:
                raise ValueError(f"ZOI_PERSISTENT_CFG is not a JSON object: {cfg!r}") from e
        return o
