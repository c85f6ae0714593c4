"""A Hugging Face decoder folder (config.json + safetensors, never pickle) -> DecoderSpec + weights.

Llama (and SmolLM, which is Llama), Qwen2 (q/k/v biases) and Qwen3 (q/k RMSNorm). Weights keep the
checkpoint's names as float32 arrays (BF16 / F16 widened); ``lm_head.weight`` is always present
(tied embeddings resolve to the same array). Anything zoi would compute differently from
transformers is refused with the config field that asks for it.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import numpy as np

from zoi.decoder.api import DecoderSpec
from zoi.errors import CheckpointError, UnsupportedModelError
from zoi.frontend.checkpoint import _weight_files, read_json
from zoi.frontend.safetensors_io import SafetensorsFile

DECODER_TYPES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}
ROPE_TYPES = ("default", "linear", "dynamic", "llama3")


def is_decoder_folder(path: str | os.PathLike) -> bool:
    """True when `path` is a folder whose config.json names a decoder model_type zoi runs
    (llama, qwen2, qwen3); anything else goes to the encoder loader and its message."""
    cfg = Path(path) / "config.json"
    if not cfg.is_file():
        return False
    try:
        c = read_json(cfg, Path(path))
    except CheckpointError:
        return False
    mt = c.get("model_type") if isinstance(c, dict) else None
    return (
        isinstance(mt, str) and mt in DECODER_TYPES
    )  # a list / dict there: the encoder loader says what is wrong


def _get(cfg: dict, cpath: Path, name: str, kind: type, default: Any = ...) -> Any:
    v = cfg.get(name)
    if v is None:
        if default is ...:
            raise CheckpointError(f"{cpath}: missing field {name!r}")
        return default
    if kind is int:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or float(v) != int(v) or v < 0:
            raise CheckpointError(f"{cpath}: field {name!r} should be an integer >= 0, got {v!r}")
        return int(v)
    if kind is float:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise CheckpointError(f"{cpath}: field {name!r} should be a number, got {v!r}")
        return float(v)
    if kind is bool:
        if not isinstance(v, bool):
            raise CheckpointError(f"{cpath}: field {name!r} should be true or false, got {v!r}")
        return v
    return v


def _ids(v: Any) -> tuple[int, ...]:
    if v is None:
        return ()
    if isinstance(v, int) and not isinstance(v, bool):
        return (v,)
    if isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        return tuple(v)
    return ()


def _rope(cfg: dict, cpath: Path) -> tuple[float, dict | None]:
    """(rope_theta, scaling dict or None) from the legacy rope_theta / rope_scaling fields or
    transformers 5's rope_parameters; refuses the rope types zoi does not compute."""
    params = cfg.get("rope_parameters")
    scaling = cfg.get("rope_scaling")
    field = "rope_parameters" if isinstance(params, dict) else "rope_scaling"
    d = params if isinstance(params, dict) else scaling
    if d is not None and not isinstance(d, dict):
        raise CheckpointError(f"{cpath}: field {field!r} should be an object, got {d!r}")
    theta = None
    if isinstance(d, dict) and d.get("rope_theta") is not None:
        theta = _get(d, cpath, "rope_theta", float)
    if theta is None:
        theta = _get(cfg, cpath, "rope_theta", float, 10000.0)
    prf = (d or {}).get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0))
    if prf not in (None, 1, 1.0):
        raise UnsupportedModelError(
            f"{cpath}: partial_rotary_factor {prf!r} is not supported (only 1.0)"
        )
    if not d:
        return theta, None
    rtype = d.get("rope_type", d.get("type", "default"))
    if rtype not in ROPE_TYPES:
        raise UnsupportedModelError(
            f"{cpath}: {field}.rope_type {rtype!r} is not supported; zoi computes RoPE of type "
            f"{', '.join(ROPE_TYPES)} (as transformers' ROPE_INIT_FUNCTIONS)"
        )
    if rtype == "default":
        return theta, None
    out: dict = {"rope_type": rtype}
    need = {
        "linear": ("factor",),
        "dynamic": ("factor",),
        "llama3": (
            "factor",
            "low_freq_factor",
            "high_freq_factor",
            "original_max_position_embeddings",
        ),
    }
    for k in need[rtype]:
        if d.get(k) is None:
            raise CheckpointError(
                f"{cpath}: {field}.{k} is missing (needed by rope_type {rtype!r})"
            )
        out[k] = _get(d, cpath, k, float)
    if rtype == "llama3":
        out["original_max_position_embeddings"] = int(out["original_max_position_embeddings"])
    return theta, out


def spec_from_config(cfg: dict, cpath: Path, generation: dict | None = None) -> DecoderSpec:
    if not isinstance(cfg, dict):
        raise CheckpointError(f"{cpath}: expected a JSON object")
    mt = cfg.get("model_type")
    if mt not in DECODER_TYPES:
        raise UnsupportedModelError(
            f"{cpath}: model_type {mt!r} (architectures {cfg.get('architectures')}) is not a decoder zoi "
            f"runs; supported: {', '.join(DECODER_TYPES)} (SmolLM checkpoints are llama)"
        )
    arch = DECODER_TYPES[mt]
    hidden = _get(cfg, cpath, "hidden_size", int)
    heads = _get(cfg, cpath, "num_attention_heads", int)
    kv = _get(cfg, cpath, "num_key_value_heads", int, heads)
    if heads == 0 or kv == 0 or heads % kv:
        raise CheckpointError(
            f"{cpath}: num_attention_heads ({heads}) must be a positive multiple of num_key_value_heads ({kv})"
        )
    head_dim = _get(cfg, cpath, "head_dim", int, hidden // heads if heads else 0)
    if head_dim <= 0 or head_dim % 2:
        raise CheckpointError(f"{cpath}: head_dim {head_dim} must be even and positive")
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise UnsupportedModelError(
            f"{cpath}: hidden_act {act!r} is not supported (only 'silu': SwiGLU)"
        )
    if cfg.get("mlp_bias"):
        raise UnsupportedModelError(f"{cpath}: mlp_bias true is not supported")
    if cfg.get("use_sliding_window"):
        raise UnsupportedModelError(
            f"{cpath}: use_sliding_window true is not supported (zoi attends to the whole context)"
        )
    lt = cfg.get("layer_types")
    if isinstance(lt, list) and any(t != "full_attention" for t in lt):
        raise UnsupportedModelError(
            f"{cpath}: layer_types other than 'full_attention' are not supported"
        )
    if cfg.get("pretraining_tp", 1) not in (None, 1):
        raise UnsupportedModelError(
            f"{cpath}: pretraining_tp {cfg.get('pretraining_tp')} is not supported"
        )
    theta, scaling = _rope(cfg, cpath)
    if arch == "qwen2":
        bias = True  # Qwen2Attention: q/k/v always biased, o not
    else:
        bias = _get(cfg, cpath, "attention_bias", bool, False)
    eos = _ids(cfg.get("eos_token_id"))
    if generation:
        eos = tuple(dict.fromkeys(eos + _ids(generation.get("eos_token_id"))))
    bos = cfg.get("bos_token_id")
    return DecoderSpec(
        arch=arch,
        vocab_size=_get(cfg, cpath, "vocab_size", int),
        hidden_size=hidden,
        intermediate_size=_get(cfg, cpath, "intermediate_size", int),
        num_layers=_get(cfg, cpath, "num_hidden_layers", int),
        num_heads=heads,
        num_kv_heads=kv,
        head_dim=head_dim,
        rms_norm_eps=_get(cfg, cpath, "rms_norm_eps", float, 1e-6),
        rope_theta=theta,
        rope_scaling=scaling,
        max_position_embeddings=_get(cfg, cpath, "max_position_embeddings", int, 2048),
        tie_word_embeddings=_get(cfg, cpath, "tie_word_embeddings", bool, False),
        attention_bias=bias,
        qk_norm=arch == "qwen3",
        hidden_act="silu",
        bos_token_id=bos if isinstance(bos, int) and not isinstance(bos, bool) else None,
        eos_token_ids=eos,
    )


def expected_shapes(spec: DecoderSpec) -> dict[str, tuple[int, ...]]:
    H, D, I = spec.hidden_size, spec.head_dim, spec.intermediate_size
    q, kv = spec.num_heads * D, spec.num_kv_heads * D
    s = {"model.embed_tokens.weight": (spec.vocab_size, H), "model.norm.weight": (H,)}
    for i in range(spec.num_layers):
        p = f"model.layers.{i}."
        s.update(
            {
                p + "input_layernorm.weight": (H,),
                p + "post_attention_layernorm.weight": (H,),
                p + "self_attn.q_proj.weight": (q, H),
                p + "self_attn.k_proj.weight": (kv, H),
                p + "self_attn.v_proj.weight": (kv, H),
                p + "self_attn.o_proj.weight": (H, q),
                p + "mlp.gate_proj.weight": (I, H),
                p + "mlp.up_proj.weight": (I, H),
                p + "mlp.down_proj.weight": (H, I),
            }
        )
        if spec.attention_bias:
            s.update(
                {
                    p + "self_attn.q_proj.bias": (q,),
                    p + "self_attn.k_proj.bias": (kv,),
                    p + "self_attn.v_proj.bias": (kv,),
                }
            )
        if spec.qk_norm:
            s.update({p + "self_attn.q_norm.weight": (D,), p + "self_attn.k_norm.weight": (D,)})
    return s


def load_weights(folder: Path, spec: DecoderSpec) -> dict[str, np.ndarray]:
    files = [SafetensorsFile(p) for p in _weight_files(folder)]
    where = {n: f for f in files for n in f.names()}
    shapes = expected_shapes(spec)
    out: dict[str, np.ndarray] = {}
    for name, shape in shapes.items():
        f = where.get(name)
        if f is None:
            raise CheckpointError(
                f"{folder}: weight {name!r} is missing from the safetensors files"
            )
        a = f.get(name)
        if tuple(a.shape) != shape:
            raise CheckpointError(
                f"{f.path}: {name} has shape {tuple(a.shape)}, expected {shape} from config.json"
            )
        out[name] = np.ascontiguousarray(a, dtype=np.float32)
    # optional biases (Llama / Qwen3 attention_bias: o_proj too)
    for i in range(spec.num_layers):
        n = f"model.layers.{i}.self_attn.o_proj.bias"
        if n in where:
            out[n] = np.ascontiguousarray(where[n].get(n), dtype=np.float32)
    if "lm_head.weight" in where and not spec.tie_word_embeddings:
        a = where["lm_head.weight"].get("lm_head.weight")
        if tuple(a.shape) != (spec.vocab_size, spec.hidden_size):
            raise CheckpointError(f"{folder}: lm_head.weight has shape {tuple(a.shape)}")
        out["lm_head.weight"] = np.ascontiguousarray(a, dtype=np.float32)
    elif spec.tie_word_embeddings:
        out["lm_head.weight"] = out["model.embed_tokens.weight"]
    else:
        raise CheckpointError(
            f"{folder}: lm_head.weight is missing and config.json has tie_word_embeddings false"
        )
    for k, a in out.items():
        if not np.isfinite(a).all():
            raise CheckpointError(f"{folder}: weight {k} holds NaN or Inf")
    return out


def load_decoder(path: str | os.PathLike) -> tuple[DecoderSpec, dict[str, np.ndarray], Path]:
    """(spec, weights, folder) of a Hugging Face decoder folder."""
    folder = Path(path)
    if not folder.is_dir():
        raise CheckpointError(f"{folder}: not a model folder")
    cpath = folder / "config.json"
    if not cpath.exists():
        raise CheckpointError(f"{folder}: no config.json")
    cfg = read_json(cpath, folder)
    gpath = folder / "generation_config.json"
    gen = read_json(gpath, folder) if gpath.exists() else None
    spec = spec_from_config(cfg, cpath, gen if isinstance(gen, dict) else None)
    return spec, load_weights(folder, spec), folder
