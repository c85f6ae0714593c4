"""Task adapters chosen per request (jina-embeddings-v3's LoRA): the Engine's side.

The model compiles once, with one copy of the base weights and every task's low-rank factors
beside them (zoi.frontend.adapters, docs/ARCHITECTURE.md "Task adapters"); each sequence of a
call names its task (or none: the base weights), and one backend call runs a batch whose
sequences mix tasks. Here:

- `TasksMixin` (mixed into zoi.engine.Engine): `tasks`, `task_instructions`, and encode's
  `task=` resolution: a name for every text or one per text, checked against the model's
  adapters; the task's instruction (config.json task_instructions, as the hub's
  encode(task=...)) goes before each text unless the call names a prompt itself.
- `TaskBackend`: what the chunk loop (zoi.pipeline.run_chunks) drives for a call with tasks:
  each chunk's slice of the per-sequence task ids goes to the backend with it.
- `quantize_with_adapters`: INT8 of a model with adapters. The base model is calibrated and
  quantised as any other; the adapters stay FP32 (their term is added to each linear's
  dequantised output). SmoothQuant's exact folds rescale what the adapters see (a v_fold
  divides the V rows of qkv by s and multiplies o's input columns by s): the factors follow.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from zoi.errors import InputError
from zoi.frontend.adapters import is_lora_weight, task_instructions
from zoi.frontend.tokenizer import Tokenizer

__all__ = [
    "TaskBackend",
    "TaskIds",
    "TasksMixin",
    "adapter_meta",
    "check_task_ids",
    "quantize_with_adapters",
]


class TaskIds(tuple):
    """Per-text task ids already resolved (and the texts already given their instructions):
    what encode passes to itself."""


def adapter_meta(folder, spec) -> dict:
    """What a compiled model keeps of its adapters besides the weights: the instructions."""
    if not spec.adapters:
        return {}
    from zoi.frontend.paths import read_json

    folder = Path(folder)
    cfg = read_json(folder / "config.json", folder)
    return {"task_instructions": task_instructions(folder, spec, cfg)}


def check_task_ids(tasks, n_tasks: int, B: int) -> np.ndarray:
    """int32 [B] task ids, each -1 (none) or in [0, n_tasks)."""
    t = np.ascontiguousarray(tasks, dtype=np.int32)
    if t.shape != (B,):
        raise InputError(f"tasks must hold one task id per sequence ({B}), got shape {t.shape}")
    if len(t) and (t.min() < -1 or t.max() >= n_tasks):
        raise InputError(
            f"task ids must be -1 (no adapter) or in [0, {n_tasks}) (the model's adapters), "
            f"got {t.min()}..{t.max()}"
        )
    return t


class TaskBackend:
    """The backend as one call's chunk loop sees it: chunk k of sequences [s, s + n) runs with
    tasks[s : s + n] (chunks come in order, synchronously: the backends that run adapters, the
    CPU core and the reference, finish a chunk in submit)."""

    def __init__(self, backend, tasks: np.ndarray):
        self.backend, self.tasks, self.done = backend, tasks, 0

    def submit(self, ids, positions, cu_seqlens, normalize: bool, out: np.ndarray):
        n = len(cu_seqlens) - 1
        t = self.tasks[self.done : self.done + n]
        self.done += n
        return self.backend.run_tasks_into(ids, positions, cu_seqlens, normalize, out, t)

    def wait(self, ticket):
        return ticket


class TasksMixin:
    """encode(task=...) and the model's task adapters (the Engine mixes it in)."""

    @property
    def tasks(self) -> list[str]:
        """The task adapters' names (the model's lora_adaptations); [] without adapters."""
        return list(self.spec.adapters)

    @property
    def task_instructions(self) -> dict[str, str]:
        """The text encode(task=name) puts before each text (none for a task not listed)."""
        return dict(self.model.meta.get("task_instructions") or {})

    def task_ids(self, names: Sequence[str | None], param: str = "task") -> np.ndarray:
        """int32 ids of task names (None: -1, the base weights); an unknown name is an
        InputError listing the model's tasks."""
        index = {t: i for i, t in enumerate(self.spec.adapters)}
        out = np.empty(len(names), np.int32)
        for i, n in enumerate(names):
            if n is None:
                out[i] = -1
            elif isinstance(n, str) and n in index:
                out[i] = index[n]
            elif not self.spec.adapters:
                raise InputError(
                    f"{param}={n!r}: {self.spec.name} has no task adapters (only "
                    "jina-embeddings-v3 style models with lora_adaptations have); leave "
                    f"{param} out"
                )
            else:
                raise InputError(
                    f"{param}={n!r} is not one of {self.spec.name}'s tasks: "
                    f"{', '.join(self.spec.adapters)} (or None for the base weights)"
                )
        return out

    def _with_task(self, sentences, task, prompt, prompt_name):
        """(texts, TaskIds, prompt) for encode: `task` a name (every text), a list of names
        (one per text, None: no adapter) or encode's own TaskIds. Without prompt / prompt_name
        each text gets its task's instruction, and prompt becomes "" (no default prompt)."""
        if isinstance(task, TaskIds):
            return sentences, task, prompt
        single = isinstance(sentences, str)
        texts = [sentences] if single else Tokenizer.check_texts(sentences)
        if isinstance(task, str):
            names: list = [task] * len(texts)
        elif isinstance(task, (list, tuple)):
            names = list(task)
            if len(names) != len(texts):
                raise InputError(
                    f"task: {len(names)} task names for {len(texts)} texts; give one name for "
                    "all of them or one per text"
                )
        else:
            raise TypeError(f"task should be a str or a list of str, got {type(task).__name__}")
        ids = self.task_ids(names)
        if prompt is None and prompt_name is None:  # the hub's encode(task=...)
            ins = self.task_instructions
            texts = [
                ins.get(n, "") + t if n is not None else t
                for n, t in zip(names, texts, strict=True)
            ]
            prompt = ""
        return (texts[0] if single else texts), TaskIds(int(i) for i in ids), prompt


def quantize_with_adapters(spec, weights, tokenizer, calibration, config, progress):
    """INT8 of a model with task adapters: (weights, quant, report) as zoi.quant.quantize_model
    gives them for the base model, with the FP32 adapter factors beside the base weights,
    rescaled where SmoothQuant folded a factor into the weights around them."""
    from zoi import quant
    from zoi.graph.build import build_graph

    base_spec = spec.replace(adapters=(), adapter_rank=0)
    lora = {k: v for k, v in weights.items() if is_lora_weight(k)}
    base = {k: v for k, v in weights.items() if not is_lora_weight(k)}
    report: dict = {}
    w, q = quant.quantize_model(
        base_spec,
        base,
        tokenizer,
        calibration=calibration,
        config=config,
        progress=progress,
        report=report,
    )
    lora = follow_smoothing(build_graph(base_spec), lora, q)
    return {**w, **lora}, q, report


def follow_smoothing(graph, lora: dict, quant: dict) -> dict:
    """The adapter factors of a smoothed model. A linear p whose input SmoothQuant divided by s
    (quant[p].info["in_scale"], exact folds only) reads x / s: A_p * s keeps (x A^T) as it was;
    a v_fold divided the V rows of the qkv before it by s: so are the V rows of its B."""
    from zoi.graph.build import linear_prefix
    from zoi.quant.smoothquant import smoothing_site

    out = dict(lora)
    ops = {linear_prefix(o): o for o in graph.linears()}
    producer = {o.output: o for o in graph.ops}
    for p, lq in quant.items():
        s = (lq.info or {}).get("in_scale")
        if s is None or f"{p}.lora_a" not in out:
            continue
        s = np.asarray(s, np.float32)
        out[f"{p}.lora_a"] = (out[f"{p}.lora_a"] * s[None, None, :]).astype(np.float32)
        if smoothing_site(graph, p) == "v_fold":
            att = producer[ops[p].inputs[0]]
            qp = linear_prefix(producer[att.inputs[0]])
            b = out[f"{qp}.lora_b"].copy()
            H = s.shape[0]
            b[:, 2 * H :, :] /= s[None, :, None]
            out[f"{qp}.lora_b"] = b.astype(np.float32)
    return out
