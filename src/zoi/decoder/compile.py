"""compile_decoder: a decoder folder -> Generator on the chosen backend (zoi.compile's hook)."""

from __future__ import annotations

import os
from numbers import Integral
from pathlib import Path

from zoi.decoder.api import PRECISION_ALIASES as ALIASES
from zoi.decoder.generator import Generator
from zoi.decoder.loader import load_decoder
from zoi.decoder.memory import FLAGS
from zoi.decoder.tokenizer import DecoderTokenizer
from zoi.errors import InputError

DEFAULT_MAX_SEQ_LEN = 2048
DEFAULT_MAX_BATCH = 8
DEFAULT_BLOCK_SIZE = 16

# One vocabulary on every zoi model: "int8" is W8A8 (INT8 weights and activations), as the
# encoders' precision="int8"; "w8" is weight-only INT8. The CPU runs "int8" only: its W8A8 GEMM
# reads as many weight bytes as a weight-only one and converts nothing (SmolLM2-135M batch-1
# decode 2.95 vs 5.91 ms per token, docs/DECODERS.md "Measured").
PRECISIONS = {
    "cpu": ("fp32", "int8"),
    "cuda": ("fp32", "fp16", "int8", "w8"),
    "reference": ("fp32",),
}
MEANING = {
    "int8": "W8A8: INT8 weights and activations; 'w8a8' means the same",
    "w8": "weight-only INT8",
}


def decoder_precision(precision, device: str) -> str:
    """`precision` as PRECISIONS spells it for `device` ("cpu", "reference", "cuda" or "gpu"),
    an alias resolved, or an InputError naming the choices."""
    dev = "cuda" if device == "gpu" else device
    ok = PRECISIONS[dev]
    word = ALIASES.get(precision, precision) if isinstance(precision, str) else precision
    if word in ok:
        return word
    if word == "w8" and dev == "cpu":
        raise InputError(
            "precision 'w8' (weight-only INT8) runs on device='cuda' only; on the CPU use "
            "precision='int8' (W8A8: INT8 weights and activations, the faster INT8 path) or 'fp32'"
        )
    choices = [repr(w) + (f" ({MEANING[w]})" if w in MEANING else "") for w in ok]
    raise InputError(
        f"precision {precision!r} is not supported for decoders on device {device!r}; use "
        + (" or ".join([", ".join(choices[:-1]), choices[-1]]) if len(choices) > 1 else choices[0])
    )


def decoder_folder(path, task: str | None = None) -> os.PathLike | None:
    """The folder (a Hub id resolved in the local cache) when `path` is a decoder checkpoint
    to generate with. A task (task="rerank": an LLM reranker) runs on the encoder path,
    which also refuses a task it does not know."""
    from zoi.decoder.loader import is_decoder_folder
    from zoi.frontend.hub import resolve_model

    if task is not None:
        return None
    try:
        folder = resolve_model(path)
    except Exception:  # not resolvable here: the encoder path reports it
        return None
    return folder if is_decoder_folder(folder) and not is_embedding_folder(folder) else None


def is_embedding_folder(folder) -> bool:
    """A decoder architecture saved as an embedder or a reranker runs on the encoder path: a
    sentence-transformers folder (modules.json: Qwen3-Embedding, EmbeddingGemma, a
    CrossEncoder with a LogitScore module such as Qwen3-Reranker), or a base model without a
    language-model head (architectures names no *ForCausalLM)."""
    from zoi.frontend.checkpoint import read_json

    folder = Path(folder)
    if (folder / "modules.json").is_file():
        return True
    try:
        archs = read_json(folder / "config.json", folder).get("architectures")
    except Exception:  # the loader that runs next reports a bad config
        return False
    if isinstance(archs, list) and archs and all(isinstance(a, str) for a in archs):
        return not any(a.endswith("ForCausalLM") for a in archs)
    return False


def compile_decoder(
    path: str | os.PathLike,
    device: str = "cpu",
    precision: str = "fp32",
    max_seq_len: int | None = None,
    max_batch: int | None = None,
    kv_blocks: int | None = None,
    block_size: int | None = None,
    threads: int | None = None,
    isa: str | None = None,
    max_tokens: int | None = None,
    **unused,
) -> Generator:
    """A Generator for a Hugging Face decoder folder.

    device: "cpu" (native core), "reference" (numpy, slow) or "cuda" (zoi.decoder.cuda).
    precision (the words of every zoi model; PRECISIONS lists them per device):
      "int8": W8A8, INT8 weights per output channel and INT8 activations (on the CPU per token,
        the encoders' INT8 GEMM of csrc/kernels; on cuda per (token, K tile) inside the dot / mma
        kernels, batch rows <= 4 weight-only); "w8a8" is an older name of it, same meaning.
      "w8": weight-only INT8 (INT8 weights, float activations), cuda only: on the CPU "int8"
        is the faster INT8 path.
      "fp32" everywhere, "fp16" on cuda; device="reference" runs "fp32" only.
    max_seq_len: prompt + generated tokens of one sequence (default min(2048, the model's limit)).
    max_batch: sequences one step carries; kv_blocks x block_size: the static KV pool (default:
    room for max_batch sequences of max_seq_len / 2 tokens each). max_tokens: tokens one native
    call carries at most (longer prefills are cut into chunks; CPU), packed prefill tokens per
    step on cuda (max_prefill_tokens).
    """
    bad = [k for k, v in unused.items() if v is not None and k not in ("progress",)]
    if bad:
        raise InputError(
            f"compile() options {', '.join(sorted(bad))} do not apply to decoder checkpoints"
        )
    # An explicit size is a positive integer: 0 or a negative one is refused by name here, before
    # the folder is read, instead of silently becoming the default (None asks for the default).
    for name, v in (
        ("max_seq_len", max_seq_len),
        ("max_batch", max_batch),
        ("kv_blocks", kv_blocks),
        ("block_size", block_size),
        ("max_tokens", max_tokens),
    ):
        if v is not None and (isinstance(v, bool) or not isinstance(v, Integral) or v < 1):
            flag = f" (zoi serve {FLAGS[name]})" if name in FLAGS else ""
            raise InputError(
                f"{name}={v!r}{flag} is out of range: it must be an integer >= 1, or None for "
                "the default"
            )
    if device == "auto":
        device = "cpu"
    if device not in ("cpu", "reference", "cuda", "gpu"):
        raise InputError(
            f"device {device!r} is not supported for decoders; use 'cpu', 'reference' or 'cuda'"
        )
    precision = decoder_precision(precision, device)  # before the folder is read
    spec, weights, folder = load_decoder(path)
    tok = DecoderTokenizer(folder)
    limit = spec.max_position_embeddings
    max_seq_len = max_seq_len or min(DEFAULT_MAX_SEQ_LEN, limit)
    if max_seq_len > limit:
        raise InputError(
            f"max_seq_len {max_seq_len} is over the model's max_position_embeddings ({limit})"
        )
    max_batch = max_batch or DEFAULT_MAX_BATCH
    block_size = block_size or DEFAULT_BLOCK_SIZE
    if kv_blocks is None:
        kv_blocks = max(
            -(-max_seq_len // block_size), max_batch * -(-max_seq_len // (2 * block_size))
        )
    if device == "reference":
        from zoi.decoder.reference import ReferenceBackend

        be = ReferenceBackend(spec, weights, kv_blocks, block_size, max_batch, max_seq_len)
    elif device == "cpu":
        from zoi.backends.cpu.options import CpuOptions
        from zoi.decoder.cpu import CpuBackend

        be = CpuBackend(
            spec,
            weights,
            precision=precision,  # "fp32" or "int8" (W8A8)
            num_blocks=kv_blocks,
            block_size=block_size,
            max_batch=max_batch,
            max_seq_len=max_seq_len,
            max_tokens=max_tokens,
            threads=threads,
            isa=isa,
            options=CpuOptions.from_env(),  # the decoder's API edge: ZOI_CPU_ISA, ZOI_NUM_THREADS, ...
        )
    else:  # cuda
        try:
            from zoi.decoder.cuda import CudaBackend  # the decoder on the GPU
        except ImportError as e:
            raise InputError(f"device='cuda' for decoders is not available here ({e})") from e
        be = CudaBackend(
            spec,
            weights,
            precision=precision,
            num_blocks=kv_blocks,
            block_size=block_size,
            max_batch=max_batch,
            max_seq_len=max_seq_len,
            max_prefill_tokens=max_tokens,
        )
    from zoi.frontend.hub import model_name

    return Generator(be, tok, name=model_name(folder), precision=precision, device=device)
