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
        # finite first: int(inf) / int(nan) would raise OverflowError / ValueError
        if (
            isinstance(v, bool)
            or not isinstance(v, (int, float))
            or not math.isfinite(v)
            or float(v) != int(v)
            or v < 0
        ):
            raise CheckpointError(f"{cpath}: field {name!r} should be an integer >= 0, got {v!r}")
        return int(v)
    if kind is float:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise CheckpointError(f"{cpath}: field {name!r} should be a finite number, got {v!r}")
        return float(v)
    if kind is bool:
        if not isinstance(v, bool):
            raise CheckpointError(f"{cpath}: field {name!r} should be true or false, got {v!r}")
        return v
    return v


# Shape limits of a decoder config. The native core indexes with int32; the layer bound keeps a
# corrupt count from building millions of expected weight names before the weights are read.
INT32_MAX = 2**31 - 1
MAX_LAYERS = 1024
MAX_HEADS = 65536
MAX_HEAD_DIM = 4096


def _number(d: dict, cpath: Path, name: str, default: Any, label: str | None) -> Any:
    v = d.get(name)
    if v is None:
        if default is ...:
            raise CheckpointError(f"{cpath}: missing field {label or name!r}")
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise CheckpointError(f"{cpath}: field {label or name!r} should be a number, got {v!r}")
    return v


def _dim(
    cfg: dict, cpath: Path, name: str, lo: int, hi: int, default: Any = ..., label=None
) -> int:
    """An integer field in [lo, hi]; the message names the field, the value and the range."""
    v = _number(cfg, cpath, name, default, label)
    # finite first: int(inf) / int(nan) would raise OverflowError / ValueError
    if not (math.isfinite(v) and float(v) == int(v) and lo <= v <= hi):
        raise CheckpointError(
            f"{cpath}: field {label or name!r} is {v!r}, out of range: it must be an integer "
            f"in [{lo}, {hi}]"
        )
    return int(v)


def _positive(
    d: dict, cpath: Path, name: str, default: Any = ..., below: float | None = None, label=None
) -> float:
    """A finite number > 0 (and < below when given): a zero or negative RoPE base, scaling
    factor or norm epsilon gives non-finite activations, never an error of its own."""
    v = _number(d, cpath, name, default, label)
    if not (math.isfinite(v) and v > 0 and (below is None or v < below)):
        rng = "a finite number > 0" if below is None else f"a number in (0, {below:g})"
        raise CheckpointError(
            f"{cpath}: field {label or name!r} is {v!r}, out of range: it must be {rng}"
        )
    return float(v)


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
        theta = _positive(d, cpath, "rope_theta", label=f"{field}.rope_theta")
    if theta is None:
        theta = _positive(cfg, cpath, "rope_theta", 10000.0)
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
        if k == "original_max_position_embeddings":
            out[k] = _dim(d, cpath, k, 1, INT32_MAX, label=f"{field}.{k}")
        else:  # the factors divide positions and wavelengths
            out[k] = _positive(d, cpath, k, label=f"{field}.{k}")
    if rtype == "llama3" and not out["high_freq_factor"] > out["low_freq_factor"]:
        # llama3 smooths between the two wavelengths, dividing by their difference
        raise CheckpointError(
            f"{cpath}: field '{field}.high_freq_factor' is {out['high_freq_factor']!r}, out of "
            f"range: it must be greater than {field}.low_freq_factor ({out['low_freq_factor']!r})"
        )
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
    # each shape field on its own, before any weight is read: the native core's one "bad model
    # shape" could not say which field is wrong
    hidden = _dim(cfg, cpath, "hidden_size", 1, INT32_MAX)
    heads = _dim(cfg, cpath, "num_attention_heads", 1, MAX_HEADS)
    kv = _dim(cfg, cpath, "num_key_value_heads", 1, heads, heads)
    if heads % kv:
        raise CheckpointError(
            f"{cpath}: field 'num_key_value_heads' is {kv}, which does not divide "
            f"num_attention_heads ({heads}): it must be one of "
            f"{', '.join(str(k) for k in range(1, heads + 1) if heads % k == 0)}"
        )
    if cfg.get("head_dim") is None and hidden % heads:
        # head_dim would be hidden_size // num_attention_heads, silently dropping the remainder
        raise CheckpointError(
            f"{cpath}: field 'num_attention_heads' is {heads}, which does not divide hidden_size "
            f"({hidden}), and the config gives no head_dim: it must be a divisor of {hidden}"
        )
    head_dim = _dim(cfg, cpath, "head_dim", 2, MAX_HEAD_DIM, hidden // heads)
    if head_dim % 2:
        raise CheckpointError(
            f"{cpath}: field 'head_dim' is {head_dim}, out of range: it must be an even integer "
            f"in [2, {MAX_HEAD_DIM}] (RoPE rotates pairs)"
        )
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
    spec = DecoderSpec(
        arch=arch,
        vocab_size=_dim(cfg, cpath, "vocab_size", 1, INT32_MAX),
        hidden_size=hidden,
        intermediate_size=_dim(cfg, cpath, "intermediate_size", 1, INT32_MAX),
        num_layers=_dim(cfg, cpath, "num_hidden_layers", 1, MAX_LAYERS),
        num_heads=heads,
        num_kv_heads=kv,
        head_dim=head_dim,
        rms_norm_eps=_positive(cfg, cpath, "rms_norm_eps", 1e-6, below=1.0),
        rope_theta=theta,
        rope_scaling=scaling,
        max_position_embeddings=_dim(cfg, cpath, "max_position_embeddings", 1, INT32_MAX, 2048),
        tie_word_embeddings=_get(cfg, cpath, "tie_word_embeddings", bool, False),
        attention_bias=bias,
        qk_norm=arch == "qwen3",
        hidden_act="silu",
        bos_token_id=bos if isinstance(bos, int) and not isinstance(bos, bool) else None,
        eos_token_ids=eos,
    )
    _check_rope(spec, cpath)
    return spec


def _check_rope(spec: DecoderSpec, cpath: Path) -> None:
    """The inverse frequencies as the backends compute them (float32, as transformers) must be
    finite: a base or factor too small for float32 rounds to 0 and divides by it."""
    from zoi.decoder.rope import rope_inv_freq

    with np.errstate(all="ignore"):
        inv = rope_inv_freq(spec)
    if not np.isfinite(inv).all():
        scaling = f" with rope_scaling {spec.rope_scaling}" if spec.rope_scaling else ""
        raise CheckpointError(
            f"{cpath}: field 'rope_theta' is {spec.rope_theta!r}{scaling}: its RoPE inverse "
            "frequencies overflow float32; it must be a number > 0 well within float32's range "
            "(checkpoints use 10000 to 1e6)"
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
