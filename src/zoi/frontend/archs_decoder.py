"""Decoder architectures as encoders: Llama, Mistral, Qwen2, Qwen3 and Gemma3 checkpoints for
embeddings (Qwen3-Embedding, EmbeddingGemma, LLM-based embedders) and last-token scoring.

They run through the same IR, planner, quantiser and kernels as BERT (zoi.graph.build_decoder):
what differs is an attribute of the ops (RMSNorm, causal or bidirectional attention with
grouped KV heads, q / k norm, RoPE, sliding windows per layer, a gated MLP). For each
architecture: config.json -> ModelSpec fields, canonical weight name -> source tensors, the
expected shapes, and the tables derived at load time:

- `rope.g.*` / `rope.l.*`: cos / sin [P, d/2] of the full / sliding layers (transformers'
  default RoPE in float32; other RoPE types are refused, naming the field);
- Gemma3's RMSNorm multiplies by (1 + w) in float32: the stored weight becomes float32(1 + w)
  (the same product); its embedding is scaled by sqrt(hidden) in the weight's dtype: the table
  is scaled once (the same product, row by row);
- gate and up projections are one [2I, H] linear (the IR's `glu` splits it: act(gate) * up);
  q, k, v one [(h + 2 kv) d, H] linear; absent biases are zeros, as for ModernBERT.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from zoi.errors import CheckpointError
from zoi.frontend.archs import _unsupported
from zoi.frontend.spec import ModelSpec

MODEL_TYPES = {
    "llama": "llama",
    "mistral": "mistral",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "gemma3_text": "gemma3",
}
_ACTS = {"silu": "silu", "swish": "silu", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu"}


def _theta(cpath: Path, params, kind: str | None, fallback) -> float:
    """rope_theta of one layer kind from rope_parameters (transformers 5) or the legacy keys."""
    p = params
    if isinstance(params, dict) and kind is not None and kind in params:
        p = params[kind]
    theta = fallback
    if isinstance(p, dict):
        rt = p.get("rope_type", "default")
        if rt != "default":
            where = f"rope_parameters.{kind}.rope_type" if kind else "rope_parameters.rope_type"
            _unsupported(cpath, where, rt, "zoi runs the default RoPE")
        if p.get("rope_theta") is not None:
            theta = p["rope_theta"]
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not theta > 0:
        raise CheckpointError(f"{cpath}: rope_theta should be a number > 0, got {theta!r}")
    if not math.isfinite(theta):
        raise CheckpointError(f"{cpath}: rope_theta should be finite, got {theta!r}")
    return float(theta)


def spec_fields(arch: str, cfg: dict, cpath: Path, field) -> dict:
    """The ModelSpec keyword arguments of a decoder architecture (`field`: checkpoint._field)."""
    heads = field(cfg, cpath, "num_attention_heads")
    kw = dict(
        hidden=field(cfg, cpath, "hidden_size"),
        layers=field(cfg, cpath, "num_hidden_layers"),
        heads=heads,
        intermediate=field(cfg, cpath, "intermediate_size"),
        eps=field(cfg, cpath, "rms_norm_eps", kind=float, default=1e-6),
        max_positions=field(cfg, cpath, "max_position_embeddings"),
        type_vocab_size=0,
        norm="rmsnorm",
        kv_heads=field(cfg, cpath, "num_key_value_heads", default=heads),
        pooling="last",  # sentence-transformers' Pooling config, when there is one, decides
    )
    hd = cfg.get("head_dim")
    if hd is not None:
        kw["head_size"] = field(cfg, cpath, "head_dim")
    akey = "hidden_activation" if arch == "gemma3" else "hidden_act"
    act = cfg.get(akey, "gelu_pytorch_tanh" if arch == "gemma3" else "silu")
    if not isinstance(act, str) or act not in _ACTS:
        _unsupported(cpath, akey, act, f"zoi runs {sorted(_ACTS)}")
    kw["act"] = _ACTS[act]
    if cfg.get("rope_scaling") not in (None, {}):
        _unsupported(cpath, "rope_scaling", cfg["rope_scaling"], "zoi runs the default RoPE")
    params = cfg.get("rope_parameters")
    legacy = cfg.get("rope_theta", 10000.0)
    L = kw["layers"]
    types = cfg.get("layer_types")
    if types is None:
        if arch == "mistral" and cfg.get("sliding_window"):
            types = ["sliding_attention"] * L
        elif arch in ("qwen2", "qwen3") and cfg.get("use_sliding_window"):
            first = cfg.get("max_window_layers", L)
            types = ["sliding_attention" if i >= first else "full_attention" for i in range(L)]
        else:
            types = ["full_attention"] * L
    if (
        not isinstance(types, list)
        or len(types) != L
        or any(t not in ("full_attention", "sliding_attention") for t in types)
    ):
        _unsupported(
            cpath, "layer_types", types, "expected full_attention / sliding_attention per layer"
        )
    if arch in ("qwen2", "qwen3") and not cfg.get("use_sliding_window"):
        types = ["full_attention"] * L  # transformers ignores the window then
    windows = [0] * L
    if "sliding_attention" in types:
        w = cfg.get("sliding_window")
        if type(w) is not int or w < 2 or w > 1 << 24:
            raise CheckpointError(
                f"{cpath}: sliding_window should be an integer >= 2 for sliding_attention "
                f"layers, got {w!r}"
            )
        # transformers' masks: 0 <= i - j < w (causal); bidirectional Gemma3 first turns the
        # configured w into w // 2 + 1 (Gemma3TextConfig), then |i - j| < that
        bidir = arch == "gemma3" and bool(cfg.get("use_bidirectional_attention", False))
        span = w // 2 if bidir else w - 1
        windows = [span if t == "sliding_attention" else 0 for t in types]
    kw["layer_windows"] = tuple(windows)
    if arch == "gemma3":
        kw["rope_theta"] = _theta(cpath, params, "full_attention", 1_000_000.0)
        kw["rope_theta_local"] = _theta(cpath, params, "sliding_attention", 10_000.0)
        kw["causal"] = not bool(cfg.get("use_bidirectional_attention", False))
        qs = cfg.get("query_pre_attn_scalar", 256)
        if isinstance(qs, bool) or not isinstance(qs, (int, float)) or not qs > 0:
            raise CheckpointError(f"{cpath}: query_pre_attn_scalar should be > 0, got {qs!r}")
        kw["attn_scale"] = float(qs) ** -0.5
        kw["qk_norm"] = True
        kw["sandwich"] = True
        for key in ("attn_logit_softcapping", "final_logit_softcapping"):
            if cfg.get(key) not in (None, 0):
                _unsupported(cpath, key, cfg[key], "zoi runs Gemma3 without softcapping")
    else:
        kw["rope_theta"] = _theta(cpath, params, None, legacy)
        kw["rope_theta_local"] = kw["rope_theta"]
        kw["causal"] = not bool(cfg.get("is_causal") is False)
        kw["qk_norm"] = arch == "qwen3"
    return kw


def mapping(spec: ModelSpec, cfg: dict) -> tuple[dict[str, list[str]], set[str]]:
    """(canonical name -> source names, canonical names that may be absent: zero-filled)."""
    m: dict[str, list[str]] = {"embed.word": ["embed_tokens.weight"]}
    for i in range(spec.layers):
        p = f"layers.{i}."
        a = p + "self_attn."
        for t, s in (("w", "weight"), ("b", "bias")):
            m[f"l{i}.qkv.{t}"] = [a + f"{x}_proj.{s}" for x in "qkv"]
            m[f"l{i}.o.{t}"] = [a + f"o_proj.{s}"]
            m[f"l{i}.ffn1.{t}"] = [p + f"mlp.{x}_proj.{s}" for x in ("gate", "up")]
            m[f"l{i}.ffn2.{t}"] = [p + f"mlp.down_proj.{s}"]
        m[f"l{i}.ln1.w"] = [p + "input_layernorm.weight"]
        m[f"l{i}.ln2.w"] = [
            p
            + ("pre_feedforward_layernorm" if spec.sandwich else "post_attention_layernorm")
            + ".weight"
        ]
        if spec.sandwich:
            m[f"l{i}.post1.w"] = [p + "post_attention_layernorm.weight"]
            m[f"l{i}.post2.w"] = [p + "post_feedforward_layernorm.weight"]
        if spec.qk_norm:
            m[f"l{i}.q_norm"] = [a + "q_norm.weight"]
            m[f"l{i}.k_norm"] = [a + "k_norm.weight"]
    m["final_ln.w"] = ["norm.weight"]
    optional = {k for k in m if k.endswith(".b")}
    return m, optional


def norm_names(spec: ModelSpec) -> list[str]:
    """Canonical names of the RMSNorm weights (each has a zero bias `.b` beside its `.w`)."""
    out = ["final_ln"]
    for i in range(spec.layers):
        out += [f"l{i}.ln1", f"l{i}.ln2"]
        if spec.sandwich:
            out += [f"l{i}.post1", f"l{i}.post2"]
    return out


def expected_shapes(spec: ModelSpec) -> dict[str, tuple[int, ...]]:
    H, I, d = spec.hidden, spec.intermediate, spec.head_dim
    q, kv = spec.heads * d, spec.num_kv_heads * d
    s: dict[str, tuple[int, ...]] = {"embed.word": (spec.vocab_size, H)}
    for i in range(spec.layers):
        s.update(
            {
                f"l{i}.qkv.w": (q + 2 * kv, H),
                f"l{i}.qkv.b": (q + 2 * kv,),
                f"l{i}.o.w": (H, q),
                f"l{i}.o.b": (H,),
                f"l{i}.ffn1.w": (2 * I, H),
                f"l{i}.ffn1.b": (2 * I,),
                f"l{i}.ffn2.w": (H, I),
                f"l{i}.ffn2.b": (H,),
            }
        )
        if spec.qk_norm:
            s[f"l{i}.q_norm"] = s[f"l{i}.k_norm"] = (d,)
    for n in norm_names(spec):
        s[n + ".w"] = s[n + ".b"] = (H,)
    for k, (din, dout, _bias, _act) in enumerate(spec.dense):
        s[f"dense{k}.w"] = (dout, din)
        s[f"dense{k}.b"] = (dout,)
    if spec.layers:
        P, half = spec.max_positions, d // 2
        s["rope.g.cos"] = s["rope.g.sin"] = (P, half)
        if any(spec.layer_windows):
            s["rope.l.cos"] = s["rope.l.sin"] = (P, half)
    return s


def source_shapes(spec: ModelSpec) -> dict[str, tuple[int, ...]]:
    """Shapes of the canonical names as read from the checkpoint (before derive)."""
    s = expected_shapes(spec)
    for n in list(s):
        if n.startswith("rope.") or n.startswith("dense") or (n.endswith(".b") and "ln" in n):
            del s[n]
    for n in norm_names(spec):
        s.pop(n + ".b", None)
    return s


def derive(spec: ModelSpec, w: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The tables computed at load time (module doc); zero biases for absent optional ones."""
    from zoi.frontend.archs import rope_tables

    shapes = expected_shapes(spec)
    for n, shp in shapes.items():
        if n not in w and n.endswith(".b") and not n.startswith("dense"):
            w[n] = np.zeros(shp, np.float32)
    if spec.arch == "gemma3":
        one = np.float32(1.0)
        for n in norm_names(spec):
            w[n + ".w"] = (one + w[n + ".w"].astype(np.float32)).astype(np.float32)
        for i in range(spec.layers):
            for k in ("q_norm", "k_norm"):
                w[f"l{i}.{k}"] = (one + w[f"l{i}.{k}"].astype(np.float32)).astype(np.float32)
        scale = np.float32(spec.hidden**0.5)
        w["embed.word"] = (w["embed.word"].astype(np.float32) * scale).astype(np.float32)
    P, d = spec.max_positions, spec.head_dim
    w["rope.g.cos"], w["rope.g.sin"] = rope_tables(spec.rope_theta, d, P)
    if "rope.l.cos" in shapes:
        w["rope.l.cos"], w["rope.l.sin"] = rope_tables(spec.rope_theta_local, d, P)
    return w
