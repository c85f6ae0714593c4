"""CudaOptions: every switch of the CUDA backend, passed in as an argument.

The defaults are what the H200 measurements chose (docs/GPU.md); tests and lab tools pass
other values. Nothing in the backend reads environment variables: ``CudaOptions.from_env``
is the one place that does, called by ``zoi.compile`` / ``zoi.load`` (the API's edge) and passed
down (Engine -> make_backend) so that ``ZOI_PERSISTENT=0|1`` still overrides an engine built by
``zoi.load(..., device='cuda')``;
``triton_interpreting`` reads Triton's own ``TRITON_INTERPRET`` (fixed when triton is
imported, not a zoi switch), against which the backend checks its ``interpret`` argument.
Fusion and the int8 copies are not options of this backend but decisions of the IR
(``zoi.graph.fusion``): ``fuse_ln`` / ``rowq`` / ``max_fused_n`` / ``fuse_min_tokens`` only say
which of them this backend realises (the rest is recorded in the plan's "fallbacks").
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass

# LN fused into o / ffn2: off, since the sweep (lab/gpu/sweep_linear.py, H200, gpu_sweep_
# 20261201T0959Z) found the fused launch slower than linear + add_layernorm at every bucket
# (minilm INT8 ffn2 at 32768 tokens: 181.8 us fused vs 46.7 + 30.6; at 4096: 41.3 vs 8.4 + 5.6)
FUSE_LN = False
MAX_FUSED_N = 512  # LN fused into a linear's epilogue only when a row fits one program
FUSE_MIN_TOKENS = 2048  # the "fused" plan (LN fused / ROWQ where switched on) from this bucket
# ROWQ: ffn1 writes the int8 copy ffn2 reads (its programs own whole rows, loop over N), no
# quantize launch. Off: measured slower on the H200 (gpu_sweep_rowq_20261201T1023Z: minilm
# ffn1+copy 44.2 us at 4096 tokens vs 18.8 + 9.6 for ffn1 + quantize; 245.7 vs 191.6 at 32768;
# end to end 256x128 INT8 3243 vs 2927 us): a program walks its 12 N tiles one after another.
ROWQ = False
# the small plan (buckets < fuse_min_tokens): an INT8 linear whose copy no producer writes
# (asymmetric or SmoothQuant-transformed: after attention, after ffn1) quantises its fp16 input
# in its own GEMM (linear QUANT 16: row statistics in a prologue, bit-identical to a quantize
# launch) instead of a quantize launch before it: small buckets are bound by the launch count
# (lab/gpu/hostpath.py: ~2.2 us a graph node at minilm 1x16). Off: measured slower
# on the H200 (bench/results/gpu_e2e_small_20261203T1820Z.json, real MiniLM INT8, p50 us at
# 1x16 / 1x128 / 8x128: 147 / 189 / 271 with the 12 quantize launches, 194 / 239 / 438 folded):
# the 12 launches cost 27 us at 1x128, but the folded o / ffn2 grew 17 -> 29 and 24 -> 77 us
# (a 16-row program walks K twice, prologue then GEMM, about one L2 round trip per K tile;
# the QUANT 4 loop is software-pipelined).
FOLD_QUANT = False
# LN fused into o / ffn2 in the small plan too (12 launches fewer at minilm). Off: slower still
# (same run: INT8 1x128 313 us, FP16 289 vs 182; ffn2 + LN 143 us vs 24 + 16 for ffn2 and
# its add_layernorm: eight 16-row programs own whole 384-column rows, each walks K = 1536)
FUSE_LN_SMALL = False
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
    """fuse_ln / rowq / max_fused_n / fuse_min_tokens: the fused plan (see above).
    pdl: programmatic dependent launch (None: on for compute capability >= 9.0, compiled),
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
    build). fold_quant: in the small plan, quantise an INT8 linear's input in its own GEMM
    where a quantize launch would make its copy (FOLD_QUANT above); fuse_ln_small: the IR's
    LN fusions in the small plan too (the fused plan's are fuse_ln's). parallel_build: worker
    processes compiling the buckets' Triton kernels before the first build of a model's shapes
    (prebuild.py; None: one per bucket, at most 8 and half the CPUs; 0: none); only with a
    path cache, which remembers that the shapes were built. megakernel: the CUDA C++
    persistent encoder kernel for buckets <= megakernel_max ("off" / "on" / "auto", above;
    it takes the place of the Triton one-launch forward where it is on)."""

    fuse_ln: bool = FUSE_LN
    rowq: bool = ROWQ
    max_fused_n: int = MAX_FUSED_N
    fuse_min_tokens: int = FUSE_MIN_TOKENS
    pdl: bool | None = None
    pdl_max_tokens: int = PDL_MAX_TOKENS
    persistent_max: int | None = None
    persistent: str = "off"
    persistent_cfg: dict | None = None
    persistent_split: bool | None = None
    device_index: int | None = None
    path_cache: str | None = None
    fold_quant: bool = FOLD_QUANT
    fuse_ln_small: bool = FUSE_LN_SMALL
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
