"""What a compile checks and decides before it builds anything: the options (counts, device,
precision, pooling), the arena against the memory there is, the tokenizer against the model,
and the steps it prints. Every refusal names the option and its allowed range."""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from pathlib import Path

import numpy as np

from zoi.backends import resolve_device
from zoi.errors import CheckpointError
from zoi.frontend.checkpoint import pooling_origin
from zoi.frontend.spec import SUPPORTED_POOLING, ModelSpec
from zoi.frontend.tokenizer import Tokenizer
from zoi.graph.compiled import CompiledModel, LinearQuant
from zoi.heads import default_max_tokens

DEFAULT_MAX_TOKENS = {"cpu": 4096, "reference": 4096, "cuda": 32768}
PRECISIONS = ("fp32", "int8", "fp16", "fp8")
log = logging.getLogger("zoi")


class _Steps:
    """Compile steps printed as `[i/n] what (seconds)` lines on stderr when enabled. Plain
    lines rather than a live bar, so the quantiser's own progress bars (tqdm) show cleanly."""

    def __init__(self, enabled: bool, total: int):
        self.enabled, self.total, self.i = enabled, total, 0
        self.t0 = time.perf_counter()
        self.console = None
        if enabled:
            from rich.console import Console

            self.console = Console(stderr=True)

    def step(self, what: str) -> None:
        self.i += 1
        self.t0 = time.perf_counter()
        if self.console is not None:
            self.console.print(f"[bold][{self.i}/{self.total}][/] {what}", highlight=False)

    def note(self, what: str) -> None:
        """A decision the compile made for the user: printed with the steps, else logged."""
        if self.console is not None:
            self.console.print(f"      {what}", style="dim", highlight=False)
        else:
            log.info("zoi: %s", what)

    def done(self) -> None:
        if self.console is not None and time.perf_counter() - self.t0 > 1.0:
            self.console.print(
                f"      done in {time.perf_counter() - self.t0:.1f} s", style="dim", highlight=False
            )


MAX_TOKENS_LIMIT = 1 << 24  # tokens per backend call; the arena grows with it


def _check_count(name: str, v) -> int:
    """max_tokens / max_batch: a positive integer within what an arena can hold."""
    if isinstance(v, bool) or not isinstance(v, (int, np.integer, float)) or v != int(v):
        raise ValueError(f"{name} must be a positive integer, got {v!r}")
    if not 1 <= int(v) <= MAX_TOKENS_LIMIT:
        raise ValueError(
            f"{name}={int(v)} is out of range: it must lie in [1, {MAX_TOKENS_LIMIT}] (it sizes "
            "the engine's memory arena; bigger batches run in chunks anyway)"
        )
    return int(v)


def _check_batch(v, max_tokens: int) -> int:
    """max_batch: sequences per backend call, each taking at least one of max_tokens' tokens;
    checked before anything is loaded or sized from it."""
    if isinstance(v, bool) or not isinstance(v, (int, np.integer, float)) or v != int(v):
        raise ValueError(f"max_batch must be a positive integer, got {v!r}")
    if not 1 <= int(v) <= max_tokens:
        raise ValueError(
            f"max_batch={int(v)} is out of range: it must lie in [1, max_tokens={max_tokens}] "
            "(every sequence of a batch takes at least one token of max_tokens); lower "
            "max_batch, or raise max_tokens (texts beyond max_batch run in further chunks)"
        )
    return int(v)


def _cap_positions(spec: ModelSpec, weights: dict, max_tokens: int, auto: bool, steps):
    """A model that allows longer texts than the default arena holds (Qwen3-Embedding: 32768
    positions; the CPU's default max_tokens is 4096) truncates its texts at max_tokens, said
    once at compile; an explicit max_tokens below the model's limit stays an error (the user
    asked for both). The RoPE tables keep their first rows; a relative-bias table (MPNet)
    would need re-deriving, so that case stays an error."""
    if not auto or "rel_bias" in weights:
        raise ValueError(
            f"max_tokens ({max_tokens}) must be at least the model's max positions "
            f"({spec.max_positions}); raise max_tokens, or leave it out to truncate texts at "
            "the device's default"
        )
    for name in [n for n in weights if n.startswith("rope.")]:
        weights[name] = weights[name][:max_tokens]
    steps.note(
        f"texts truncated at {max_tokens} tokens (the model allows {spec.max_positions}; "
        f"max_tokens={spec.max_positions} keeps them whole)"
    )
    return spec.replace(max_positions=max_tokens), weights


def _check_pooling(pooling) -> None:
    if pooling is not None and pooling not in SUPPORTED_POOLING:
        raise ValueError(
            f"pooling={pooling!r} is not supported; use one of {', '.join(SUPPORTED_POOLING)}, "
            "or leave it out for the folder's own"
        )


def _choose_pooling(spec: ModelSpec, src: Path, pooling: str | None, steps) -> tuple:
    """The spec with the pooling asked for (or the folder's own), and the artifact's record
    of where it came from. An embedding model's pooling is printed (progress) or logged: a
    folder without a sentence-transformers config pools as sentence-transformers would."""
    if spec.head:  # a task head pools its own way (zoi.heads)
        return spec, None
    origin = pooling_origin(src)
    if pooling is not None and pooling != spec.pooling:
        origin = f"pooling={pooling!r} given; the folder's own is {spec.pooling} ({origin})"
        spec = spec.replace(pooling=pooling)
    elif pooling is not None:
        origin = f"pooling={pooling!r} given, as the folder's own ({origin})"
    note = f"pooling: {spec.pooling} ({origin})"
    if pooling is None and not origin.startswith("from "):
        others = [p for p in SUPPORTED_POOLING if p != spec.pooling]
        note = f"{note[:-1]}; pooling={others[0]!r} or {others[1]!r} to override)"
    if steps.console is not None:
        steps.console.print(f"      {note}", style="dim", highlight=False)
    elif pooling is None and "classifier_pooling" in origin:
        # the folder's config names another pooling: say which one the embeddings use
        log.warning("zoi: %s: %s", src.name, note)
    else:
        log.info("zoi: %s: %s", src.name, note)
    return spec, {"mode": spec.pooling, "origin": origin}


def _auto_max_tokens(spec: ModelSpec, device: str) -> int:
    """The max_tokens a compile on device gets when none is asked for (a SPLADE head's
    [T, vocab] logits cap it: zoi.heads.default_max_tokens)."""
    n = DEFAULT_MAX_TOKENS[device]
    return default_max_tokens(spec, n) if spec.head else n


def _check_arena(model: CompiledModel, device: str = "cpu") -> None:
    """The host arena the CPU planner sized must fit this machine's memory. device="cuda" holds
    no host arena (the CUDA backend sizes its own device buffers; a SPLADE head's [T, vocab]
    logits, which the CPU plan holds, are never materialised there): nothing to check here."""
    if device == "cuda":
        return
    try:
        phys = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not POSIX
        return
    if model.plan.arena_bytes > phys:
        raise ValueError(
            f"max_tokens={model.plan.max_tokens} needs an arena of "
            f"{model.plan.arena_bytes / 2**30:.1f} GiB, more than this machine's "
            f"{phys / 2**30:.1f} GiB of memory; use a smaller max_tokens"
        )


def _check_tokenizer_vocab(tokenizer: Tokenizer, spec: ModelSpec, source) -> None:
    """A tokenizer that can emit ids past the embedding table is refused at compile time
    (it would fail only on the texts that happen to use those ids)."""
    from tokenizers import Tokenizer as HFTokenizer

    n = HFTokenizer.from_str(tokenizer.json).get_vocab_size(with_added_tokens=True)
    if n > spec.vocab_size:
        raise CheckpointError(
            f"{source}: the tokenizer has {n} tokens (added tokens included) but the model's "
            f"embedding table has {spec.vocab_size} rows (config.json vocab_size): ids "
            f">= {spec.vocab_size} would have no embedding. Use the tokenizer the model was "
            "trained with, or resize the embeddings (model.resize_token_embeddings) and re-save"
        )


def _check_quant(quant: dict[str, LinearQuant], where) -> None:
    from zoi.quant.config import ACT_SCHEMES

    for p, q in quant.items():
        if q.scheme not in (*ACT_SCHEMES, "fp32", "fp8"):
            raise CheckpointError(f"{where}: linear {p!r} has unknown scheme {q.scheme!r}")
        if q.scheme == "static":
            a = q.amax
            if (
                isinstance(a, bool)
                or not isinstance(a, (int, float))
                or not np.isfinite(a)
                or a <= 0
            ):
                raise CheckpointError(
                    f"{where}: linear {p!r} has static scale amax={a!r}; it must be a finite "
                    "number > 0 (re-compile the model)"
                )


def _split_device(device: str) -> tuple[str, int | None]:
    """'cuda:1' -> ('cuda', 1) (that GPU checked to exist); any other device resolved as
    resolve_device does, index None."""
    from zoi.backends import check_device_index, split_device

    kind, index = split_device(device)
    kind = resolve_device(kind)
    if index is not None:
        check_device_index(index)
    return kind, index


def _check_precision(precision: str, device: str) -> None:
    if precision in ("w8", "w8a8"):  # the decoders' words, named for what an encoder runs instead
        raise ValueError(
            f"precision={precision!r} applies to decoder (generation) checkpoints: 'w8' is "
            "weight-only INT8 on the GPU, 'w8a8' the earlier name of 'int8'; an encoder runs "
            f"one of {', '.join(PRECISIONS)} ('int8' is W8A8)"
        )
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if precision == "fp16" and device != "cuda":
        raise ValueError(
            "precision='fp16' runs on device='cuda' only; use 'fp32' or 'int8' on the CPU"
        )
    if precision == "fp8" and device not in ("cuda", "reference"):
        raise ValueError(
            "precision='fp8' (E4M3 weights and activations) runs on device='cuda' with an "
            "FP8 GPU (compute capability 8.9+: Ada, Hopper), or emulated on "
            "device='reference'; on the CPU use precision='int8' or 'fp32'"
        )


def _first_row_default(quant_config, device: str):
    """QuantConfig.first_row_residual left unset (None, or absent from a dict) -> on for the CPU
    (and the reference) backends, where it meets the fidelity targets at a few per cent of the
    forward, off for device="cuda", where its Triton form still costs more than it should
    (docs/QUANT.md "The first row of each sequence quantised twice")."""
    on = device != "cuda"
    if quant_config is None:
        return {"first_row_residual": on}
    if isinstance(quant_config, dict):
        if quant_config.get("first_row_residual") is None:
            return {**quant_config, "first_row_residual": on}
        return quant_config
    if getattr(quant_config, "first_row_residual", False) is None:
        return dataclasses.replace(quant_config, first_row_residual=on)
    return quant_config


def _cpu_options(device: str):
    """The CPU core's switches for zoi.compile / zoi.load, the API's edge: its defaults with the
    environment's overrides (ZOI_CPU_ISA, ZOI_NUM_THREADS, ZOI_PIN, ZOI_AMX_*), applied to the
    core at once (calibration and the native tokenizer run on it, on every device); returned for
    device='cpu' (the backend is handed them), None for the other devices."""
    from zoi.backends.cpu.options import CpuOptions

    opts = CpuOptions.from_env()
    try:
        opts.apply()
    except ImportError:  # a build without the native core: nothing runs on it
        pass
    return opts if device == "cpu" else None


def _cuda_options(device: str):
    """The CUDA backend's switches for zoi.compile / zoi.load, the API's edge: the measured
    defaults with the environment's overrides (ZOI_PERSISTENT, ZOI_CUDA_PATH_CACHE, ...; the one
    place below the CLI that reads them); None for the other devices."""
    if device != "cuda":
        return None
    from zoi.backends.cuda.options import CudaOptions

    return CudaOptions.from_env()
