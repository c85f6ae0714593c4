"""The decoder contract: what the model runtimes (CPU C++ core, GPU Triton), the generator API and the
in-flight batching scheduler agree on.

Three parts are built against this file, each by its own hand:

* ``zoi.decoder`` (loader, reference, CPU backend, ``Generator``): reads a Hugging Face decoder folder
  into a :class:`DecoderSpec` and a weight dict, runs it on the CPU, offers ``generate`` / ``stream``.
* ``zoi.decoder.cuda``: a :class:`DecoderBackend` on the GPU (Triton kernels, paged KV cache).
* ``zoi.decoder.scheduler`` and the serve routes: continuous batching over any :class:`DecoderBackend`.

Weights are the checkpoint's own Hugging Face names (``model.layers.{i}.self_attn.q_proj.weight``, ...)
as float32 numpy arrays of the checkpoint's shapes; ``lm_head.weight`` is always present (the loader
resolves tied embeddings to the same array). Change this file only with all three parts in view.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Protocol, runtime_checkable

import numpy as np

from zoi.errors import ZoiError

DECODER_ARCHS = (
    "llama",
    "qwen2",
    "qwen3",
    "gpt2",
)  # config.json model_type values a spec may carry


class KVPoolFull(ZoiError):
    """The paged KV pool has too few free blocks for the sequence: queue it or refuse it, never crash."""


# the decoders' earlier name of W8A8, still accepted (`int8` is W8A8 on every model)
PRECISION_ALIASES = {"w8a8": "int8"}


@dataclass(frozen=True)
class DecoderSpec:
    arch: str  # one of DECODER_ARCHS
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int  # GQA: num_heads % num_kv_heads == 0
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = (
        None  # the config's dict as read (llama3, linear, dynamic, ... or None)
    )
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # q/k/v projections carry biases (Qwen2)
    qk_norm: bool = False  # RMSNorm on q and k per head before RoPE (Qwen3)
    hidden_act: str = "silu"
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()


# Temperatures below this sample greedily. Dividing logits by a tinier (or subnormal) temperature
# overflows them to inf and the draw degenerates, while the limit of sampling as the temperature
# goes to 0 is the argmax; vLLM draws the same line (_SAMPLING_EPS).
GREEDY_TEMPERATURE = 1e-5


@dataclass(frozen=True)
class SamplingParams:
    """Sampling settings of one sequence. Every caller builds them here (the Python API, the
    HTTP routes, the scheduler's users), so the normalisation below holds for all of them."""

    max_new_tokens: int = 64
    # under GREEDY_TEMPERATURE (0 included): greedy, argmax with the lowest id on ties
    temperature: float = 0.0
    top_k: int = 0  # 0: off
    top_p: float = 1.0  # 1.0: off
    seed: int | None = None  # same seed, same prompt, same params -> same tokens
    stop: tuple[str, ...] = ()  # stop strings, matched on the decoded text; not part of the output
    stop_token_ids: tuple[int, ...] = ()  # besides the spec's eos_token_ids
    ignore_eos: bool = False

    def __post_init__(self):
        if self.temperature < GREEDY_TEMPERATURE:  # NaN is refused by the callers' checks
            object.__setattr__(self, "temperature", 0.0)


class FinishReason(str, Enum):
    STOP = "stop"  # eos token, stop token or stop string
    LENGTH = "length"  # max_new_tokens or the model's context reached
    CANCELLED = "cancelled"


@dataclass
class StepEvent:
    """One new token of one sequence, produced by :meth:`DecoderBackend.step`."""

    seq_id: int
    token_id: int
    finish: FinishReason | None = None  # set on the sequence's last event; its blocks are then free


@dataclass
class PoolInfo:
    block_size: int  # tokens per KV block
    num_blocks: int  # blocks in the static pool, sized at compile time
    free_blocks: int
    running: int  # sequences holding blocks
    max_batch: int  # sequences one decode step can carry
    extra: dict = field(default_factory=dict)


@runtime_checkable
class DecoderBackend(Protocol):
    """A model runtime with a paged KV cache. Not thread-safe: one thread (the scheduler's) calls it."""

    spec: DecoderSpec
    max_seq_len: int  # prompt + generated tokens of one sequence

    def pool(self) -> PoolInfo: ...

    def blocks_needed(self, prompt_len: int, max_new_tokens: int) -> int: ...

    def add(self, seq_id: int, prompt_ids: np.ndarray, params: SamplingParams) -> None:
        """Admit a sequence (int32 ids). Raises KVPoolFull when the pool lacks
        blocks_needed(...) free blocks or max_batch sequences run, InputError when the prompt is
        empty or prompt + max_new_tokens exceeds max_seq_len. Its prefill runs in the next step()."""

    def step(self) -> list[StepEvent]:
        """Prefill the sequences added since the last step (packed, no padding), then one decode step
        for every running sequence; one event per sequence that produced a token. Eos, stop token ids
        and max_new_tokens finish a sequence here; stop strings are the caller's (text level)."""

    def cancel(self, seq_id: int) -> None:
        """Drop a sequence now and free its blocks; unknown ids are ignored."""
