"""jina-embeddings-v3's task LoRA adapters, read from the hub's checkpoint layout.

The hub's model (jinaai/xlm-roberta-flash-implementation, modeling_lora.py) registers a torch
parametrization on every nn.Linear and nn.Embedding of the XLM-RoBERTa encoder, so its
safetensors file holds, per adapted module `M`:

    M.parametrizations.weight.original      the base weight (zoi reads it as M.weight)
    M.parametrizations.weight.0.lora_A      linear: [n, r, in]      embedding: [n, rows, r]
    M.parametrizations.weight.0.lora_B      linear: [n, out, r]     embedding: [n, r, H]

with n = len(config.json `lora_adaptations`) tasks (the stack's order is the task id, as the
hub's `_adaptation_map`), r = `lora_rank`, and the weight task t runs with

    linear:    W_t = W + s * B_t @ A_t        ([out, r] @ [r, in])
    embedding: E_t = E + s * A_t @ B_t        ([rows, r] @ [r, H])

s = `lora_alpha` / `lora_rank` (the hub's LoRAParametrization.scaling; dropout is training
only). The adapted modules are the word and token-type embeddings, each layer's mixer.Wqkv
(one adapter over the packed q, k, v rows), mixer.out_proj, mlp.fc1 and mlp.fc2 (and the pooler,
which embeddings never run). A sequence takes one task (the hub's per-sequence adapter_mask)
or none: the base weights.

zoi never merges: one copy of the base weights, and per adapted op the stacked factors with s
folded into B (docs/ARCHITECTURE.md "Task adapters"):

    l{i}.{qkv,o,ffn1,ffn2}.lora_a  [n, r, K]    A_t
    l{i}.{qkv,o,ffn1,ffn2}.lora_b  [n, N, r]    s * B_t
    embed.lora_a                   [n, V, r]    A_t of the word embeddings
    embed.lora_b                   [n, r, H]    s * B_t
    embed.lora_type                [n, H]       s * A_t[0] @ B_t of the token-type table (row 0)

`task_instructions` (config.json; else the sentence-transformers prompts of the same names) are
the texts the hub's encode(task=...) puts before each text.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np

from zoi.errors import CheckpointError, UnsupportedModelError
from zoi.frontend.spec import GATED_ROTARY_ARCHS, ModelSpec

log = logging.getLogger("zoi")

PARAM = ".parametrizations.weight.original"  # the base weight of an adapted module
_LORA = re.compile(
    r"^(?P<prefix>.*?)(?P<module>embeddings\.(?:word|token_type)_embeddings"
    r"|encoder\.layers\.(?P<layer>\d+)\.(?P<lin>mixer\.Wqkv|mixer\.out_proj|mlp\.fc1|mlp\.fc2)"
    r"|pooler\.dense)\.parametrizations\.weight\.0\.lora_(?P<ab>[AB])$"
)
_LINEARS = {"mixer.Wqkv": "qkv", "mixer.out_proj": "o", "mlp.fc1": "ffn1", "mlp.fc2": "ffn2"}
LINEAR_ROLES = tuple(_LINEARS.values())


def is_lora_weight(name: str) -> bool:
    """A tensor of the adapters (zoi's canonical names)."""
    return ".lora_" in name


def adapter_shapes(spec: ModelSpec) -> dict[str, tuple[int, ...]]:
    """The canonical adapter tensors of `spec` and their shapes ({} without adapters)."""
    if not spec.adapters:
        return {}
    n, r, H, I = len(spec.adapters), spec.adapter_rank, spec.hidden, spec.intermediate
    A = spec.heads * spec.head_dim
    ffn1 = 2 * I if spec.arch in GATED_ROTARY_ARCHS else I
    s: dict[str, tuple[int, ...]] = {
        "embed.lora_a": (n, spec.vocab_size, r),
        "embed.lora_b": (n, r, H),
    }
    if spec.type_vocab_size:
        s["embed.lora_type"] = (n, H)
    dims = {"qkv": (3 * A, H), "o": (H, A), "ffn1": (ffn1, H), "ffn2": (H, I)}
    for i in range(spec.layers):
        for role, (N, K) in dims.items():
            s[f"l{i}.{role}.lora_a"] = (n, r, K)
            s[f"l{i}.{role}.lora_b"] = (n, N, r)
    return s


def lora_config(cfg: dict, cpath: Path) -> dict | None:
    """config.json's adapters: {"tasks", "rank", "alpha", "instructions"}; None when it names
    none (`lora_adaptations` absent or empty)."""
    tasks = cfg.get("lora_adaptations")
    if not tasks:
        return None
    if (
        not isinstance(tasks, list)
        or not all(isinstance(t, str) and t for t in tasks)
        or len(set(tasks)) != len(tasks)
    ):
        raise CheckpointError(
            f"{cpath}: lora_adaptations should be a list of distinct task names, got {tasks!r}"
        )
    rank = cfg.get("lora_rank", 4)
    if type(rank) is not int or not 1 <= rank <= 256:
        raise CheckpointError(f"{cpath}: lora_rank should be an integer in [1, 256], got {rank!r}")
    alpha = cfg.get("lora_alpha", 1)
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha):
        raise CheckpointError(f"{cpath}: lora_alpha should be a number, got {alpha!r}")
    ins = cfg.get("task_instructions") or {}
    if not isinstance(ins, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in ins.items()
    ):
        raise CheckpointError(f"{cpath}: task_instructions should map task names to texts")
    extra = sorted(set(ins) - set(tasks))
    if extra:
        raise CheckpointError(
            f"{cpath}: task_instructions names tasks {extra} that lora_adaptations {tasks} "
            "does not list"
        )
    return {"tasks": list(tasks), "rank": rank, "alpha": float(alpha), "instructions": ins}


def load_adapters(
    spec: ModelSpec,
    cfg: dict,
    cpath: Path,
    names: list[str],
    get: Callable[[str], np.ndarray],
) -> tuple[ModelSpec, dict[str, np.ndarray]]:
    """(spec with its adapters, the canonical adapter tensors) of a checkpoint whose tensors are
    `names` (get(name): float32); (spec, {}) when the checkpoint has none."""
    found: dict[
        tuple[str, str], dict[str, str]
    ] = {}  # (module kind, key) -> {"A": name, "B": name}
    prefixes = set()
    for n in names:
        if ".lora_" not in n:
            continue
        m = _LORA.match(n)
        if m is None:
            raise UnsupportedModelError(
                f"{cpath.parent}: tensor {n!r} is a LoRA factor of a module zoi does not adapt "
                "(jina-embeddings-v3 adapts the embeddings, mixer.Wqkv, mixer.out_proj, "
                "mlp.fc1 and mlp.fc2 of each layer)"
            )
        prefixes.add(m["prefix"])
        if m["lin"]:
            key = f"l{int(m['layer'])}.{_LINEARS[m['lin']]}"
        elif "word" in m["module"]:
            key = "word"
        elif "token_type" in m["module"]:
            key = "type"
        else:
            key = "pooler"  # the pooler's adapter: embeddings never run the pooler
        found.setdefault(key, {})[m["ab"]] = n
    conf = lora_config(cfg, cpath)
    if not found:
        if conf is not None:
            log.warning(
                "zoi: %s names task adapters %s but its weights hold no LoRA factors: the "
                "base model only",
                cpath,
                conf["tasks"],
            )
        return spec, {}
    if len(prefixes) > 1:
        raise CheckpointError(f"{cpath.parent}: LoRA factors under several prefixes {prefixes}")
    if conf is None:
        raise CheckpointError(
            f"{cpath}: the weights hold LoRA adapters but lora_adaptations does not name "
            "their tasks"
        )
    tasks, r = conf["tasks"], conf["rank"]
    n = len(tasks)
    s = np.float32(conf["alpha"] / r)  # the hub's LoRAParametrization.scaling

    def pair(key: str, what: str) -> tuple[np.ndarray, np.ndarray]:
        ab = found.get(key, {})
        for x in "AB":
            if x not in ab:
                raise CheckpointError(
                    f"{cpath.parent}: the task adapters have no lora_{x} of {what} (every "
                    "adapted module of jina-embeddings-v3 has both factors)"
                )
        a, b = (np.asarray(get(ab[x]), np.float32) for x in "AB")
        for x, arr in (("A", a), ("B", b)):
            if not np.isfinite(arr).all():
                raise CheckpointError(f"{cpath.parent}: {ab[x]} contains NaN or Inf values")
        return a, b

    def check(name: str, arr: np.ndarray, want: tuple[int, ...]) -> None:
        if arr.shape != want:
            raise CheckpointError(
                f"{cpath.parent}: {name} has shape {arr.shape}, expected {want} ({n} tasks of "
                f"lora_adaptations, lora_rank {r})"
            )

    spec = spec.replace(adapters=tuple(tasks), adapter_rank=r)
    shapes = adapter_shapes(spec)
    out: dict[str, np.ndarray] = {}
    a, b = pair("word", "the word embeddings")
    check(found["word"]["A"], a, shapes["embed.lora_a"])
    check(found["word"]["B"], b, shapes["embed.lora_b"])
    out["embed.lora_a"] = np.ascontiguousarray(a)
    out["embed.lora_b"] = np.ascontiguousarray(b * s)
    if spec.type_vocab_size:
        a, b = pair("type", "the token-type embeddings")
        check(found["type"]["A"], a, (n, spec.type_vocab_size, r))
        check(found["type"]["B"], b, shapes["embed.lora_b"])
        # only row 0 is ever read (embeddings of single texts): its delta per task
        out["embed.lora_type"] = np.einsum("tr,trh->th", a[:, 0, :], b * s).astype(np.float32)
    for i in range(spec.layers):
        for role in LINEAR_ROLES:
            key = f"l{i}.{role}"
            a, b = pair(key, f"layer {i}'s {role}")
            check(found[key]["A"], a, shapes[key + ".lora_a"])
            check(found[key]["B"], b, shapes[key + ".lora_b"])
            out[key + ".lora_a"] = np.ascontiguousarray(a)
            out[key + ".lora_b"] = np.ascontiguousarray(b * s)
    layers = {k for k in found if k.startswith("l")}
    extra = sorted(k for k in layers if int(k[1:].split(".")[0]) >= spec.layers)
    if extra:
        raise CheckpointError(
            f"{cpath.parent}: LoRA factors of layers past num_hidden_layers ({extra[0]}, ...)"
        )
    return spec, out


def task_instructions(folder: Path, spec: ModelSpec, cfg: dict) -> dict[str, str]:
    """The text put before each text of a task (the hub's encode(task=...)): config.json's
    task_instructions, else the sentence-transformers prompt of that name, else none."""
    if not spec.adapters:
        return {}
    conf = lora_config(cfg, folder / "config.json") or {}
    ins = dict(conf.get("instructions") or {})
    st = folder / "config_sentence_transformers.json"
    prompts: dict = {}
    if st.is_file():
        from zoi.frontend.paths import read_json

        c = read_json(st, folder)
        p = c.get("prompts") if isinstance(c, dict) else None
        prompts = p if isinstance(p, dict) else {}
    for t in spec.adapters:
        if t not in ins and isinstance(prompts.get(t), str):
            ins[t] = prompts[t]
    return {t: ins[t] for t in spec.adapters if ins.get(t)}
