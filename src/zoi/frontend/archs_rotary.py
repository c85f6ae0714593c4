"""NomicBERT, GTE and jina-embeddings-v3: BERT's post-norm layers with rotary positions.

Both run through the IR BERT runs (zoi.graph.build): only attributes differ. Per layer

    qkv = Wqkv(x) ; ctx = attention(qkv, RoPE) ; x1 = LN1(x + Wo(ctx))
    x = LN2(x1 + Wdown(act(Wgate x1) * Wup x1))

after x0 = LN(word[ids] + type[0]) (no position table), and no final norm. NomicBERT
(nomic-embed-text v1 / v1.5) has no linear biases and SwiGLU; GTE (gte-base-en-v1.5,
gte-multilingual-base) has biases on q / k / v / o and the down projection, GeGLU, and RoPE
scaled for a longer context. jina-embeddings-v3 (XLM-RoBERTa with RoPE, base 20000) keeps BERT's
plain MLP (fc1, GELU, fc2) and biases everywhere; its task LoRA adapters are read by
zoi.frontend.adapters.

Accepted configs and checkpoints:

- `model_type` nomic_bert / gte as transformers 5 writes them (`rope_parameters`, the class
  defaults where a key is absent). Their tensors carry the hub folders' names (NomicBERT's
  `encoder.layers.N.attn.Wqkv`, `mlp.fc11` / `fc12`, `emb_ln`; GTE's `encoder.layer.N.attention.
  qkv_proj`, `mlp.up_gate_proj`, `attn_ln`): transformers renames them to its modules' names
  when it loads (conversion_mapping.py) and back when it saves. zoi reads both namings, the
  modules' one (`layers.N.self_attn.q_proj`, `mlp.gate_proj` ...) for a bare state_dict.
- NomicBERT's original config (its GPT2Config keys `n_embd`, `n_layer`, `n_head`, `n_inner`,
  `n_positions`, `rotary_emb_base`, `activation_function` "swiglu" / "geglu" ...), alone or
  beside transformers' keys (the hub folders rewritten for transformers 5: `_nomic_view`), and
  GTE's original `model_type` "new" (Alibaba-NLP's code: `rope_scaling` {"type": "ntk"}).
- `model_type` jina_embeddings_v3 as transformers 5 writes it, and the hub's own jina config
  (model_type xlm-roberta, position_embedding_type "rotary", rotary_emb_base); tensors under
  the hub's names (`emb_ln`, `encoder.layers.N.mixer.Wqkv` / `out_proj`, `mlp.fc1` / `fc2`,
  `norm1` / `norm2`, with or without `roberta.`) or transformers' modules' names.
- RoPE: default; linear (`factor`); dynamic NTK (its base at max_position_embeddings, which is
  what transformers computes for every sequence zoi runs); GTE's fixed NTK "ntk" (base *
  factor, then inv_freq / factor^(2/d), as the original code computes it: the same tables as
  linear with those two numbers). Anything else is refused, naming the field.

Tables derived at load time (docs/ARCHITECTURE.md): `rope.g.cos` / `rope.g.sin` [P, d/2] in
float32 as transformers (inv_freq = 1 / base^(2i/d), divided by the linear factor); zero
biases where the architecture has none; `ffn1` = [gate; up] rows (the `glu` op's layout:
act(first half) * second half), GTE's original `up_gate_proj` ([up; gate]) swapped to it.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from zoi.errors import CheckpointError, UnsupportedModelError
from zoi.frontend.adapters import adapter_shapes
from zoi.frontend.archs import _unsupported
from zoi.frontend.spec import GATED_ROTARY_ARCHS, ModelSpec

# config.json model_type -> arch ("new": GTE's original code, Alibaba-NLP/new-impl); the hub's
# jina-embeddings-v3 folder says "xlm-roberta" with position_embedding_type "rotary"
# (checkpoint._spec_from_config: is_original_jina)
MODEL_TYPES = {
    "nomic_bert": "nomic_bert",
    "gte": "gte",
    "new": "gte",
    "jina_embeddings_v3": "jina_v3",
}
_ACTS = {
    "gelu": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "silu": "silu",
    "swish": "silu",
    "relu": "relu",
}
# NomicBERT's original activation_function: the gated ones its GatedMLP runs (glu: sigmoid)
_NOMIC_GATED = {"swiglu": "silu", "geglu": "gelu"}
# transformers' class defaults (NomicBertConfig / GteConfig), used where config.json has no key
_DEFAULTS = {
    "nomic_bert": dict(
        theta=1000.0, act="silu", maxpos=2048, types=2, eps=1e-12, vocab=30528, inter=3072
    ),
    "gte": dict(
        theta=160000.0, act="gelu", maxpos=8192, types=1, eps=1e-12, vocab=250048, inter=3072
    ),
    "jina_v3": dict(
        theta=20000.0, act="gelu", maxpos=8194, types=1, eps=1e-5, vocab=250002, inter=4096
    ),
}
# GTE's original NewConfig defaults (model_type "new")
_NEW_DEFAULTS = dict(
    theta=10000.0, act="gelu", maxpos=2048, types=1, eps=1e-12, vocab=30528, inter=3072
)
ROPE_TYPES = ("default", "linear", "dynamic", "ntk")


def _number(cpath: Path, field: str, v, positive: bool = True) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise CheckpointError(f"{cpath}: {field} should be a finite number, got {v!r}")
    if positive and not v > 0:
        raise CheckpointError(f"{cpath}: {field} should be > 0, got {v!r}")
    return float(v)


def is_original_nomic(cfg: dict) -> bool:
    """NomicBERT's own config (GPT2Config keys), as nomic-ai's hub folders ship it."""
    return any(k in cfg for k in ("n_embd", "n_layer", "n_head"))


def is_original_jina(cfg: dict) -> bool:
    """jina-embeddings-v3's own config (jinaai/xlm-roberta-flash-implementation): model_type
    xlm-roberta with rotary positions (rotary_emb_base) instead of a position table."""
    return cfg.get("model_type") == "xlm-roberta" and cfg.get("position_embedding_type") == "rotary"


def _jina_view(cfg: dict, cpath: Path) -> dict:
    """The original jina config as transformers' keys: rotary_emb_base is the RoPE base; its
    options zoi does not run are refused by name (flash attention and the adapters' training
    switches are not read)."""
    if not is_original_jina(cfg):
        return cfg
    for key, ok, why in (
        ("rotary_emb_interleaved", False, "zoi runs the GPT-NeoX rotation (false)"),
        ("rotary_emb_fraction", 1, "zoi rotates whole heads (1.0)"),
        ("emb_pooler", None, "zoi pools as the sentence-transformers folder says (null)"),
    ):
        if key in cfg and cfg[key] != ok and not (ok is None and cfg[key] is None):
            _unsupported(cpath, key, cfg[key], why)
    v = dict(cfg)
    if "rope_parameters" not in cfg and "rope_theta" not in cfg:
        v["rope_theta"] = cfg.get("rotary_emb_base", _DEFAULTS["jina_v3"]["theta"])
    return v


def spec_fields(arch: str, cfg: dict, cpath: Path, field) -> dict:
    """The ModelSpec keyword arguments (`field`: checkpoint._field)."""
    if arch == "nomic_bert":
        cfg = _nomic_view(cfg, cpath, field)
    if arch == "jina_v3":
        cfg = _jina_view(cfg, cpath)
    new = cfg.get("model_type") == "new"
    dflt = _NEW_DEFAULTS if new else _DEFAULTS[arch]
    hidden = field(cfg, cpath, "hidden_size", default=768)
    heads = field(cfg, cpath, "num_attention_heads", default=12)
    kw = dict(
        hidden=hidden,
        layers=field(cfg, cpath, "num_hidden_layers", default=12),
        heads=heads,
        intermediate=field(cfg, cpath, "intermediate_size", default=dflt["inter"]),
        vocab_size=field(cfg, cpath, "vocab_size", default=dflt["vocab"]),
        eps=field(cfg, cpath, "layer_norm_eps", kind=float, default=dflt["eps"]),
        type_vocab_size=field(cfg, cpath, "type_vocab_size", default=dflt["types"]),
    )
    maxpos = field(cfg, cpath, "max_position_embeddings", default=dflt["maxpos"])
    kw["max_positions"] = maxpos
    act = cfg.get("hidden_act", dflt["act"])
    if not isinstance(act, str) or act not in _ACTS:
        _unsupported(cpath, "hidden_act", act, f"zoi runs {', '.join(sorted(_ACTS))}")
    kw["act"] = _ACTS[act]
    if arch == "gte":
        _gte_checks(cfg, cpath)
    d = hidden // heads if heads else 0
    hd = None if new else cfg.get("head_dim")  # the original GTE code always splits hidden
    if hd is not None:
        d = field(cfg, cpath, "head_dim")
        if d < 1 or d > 1 << 12:
            raise CheckpointError(f"{cpath}: head_dim should be in [1, 4096], got {d}")
        if hidden % max(heads, 1) or d != hidden // max(heads, 1):
            kw["head_size"] = d
    theta, factor = rope_params(cfg, cpath, dflt["theta"], d, maxpos, new=new)
    kw["rope_theta"], kw["rope_factor"] = theta, factor
    return kw


def _gte_checks(cfg: dict, cpath: Path) -> None:
    """GTE's original options zoi does not run (their defaults are what it runs)."""
    pet = cfg.get("position_embedding_type", "rope")
    if pet != "rope":
        _unsupported(cpath, "position_embedding_type", pet, "GTE runs with 'rope' only")
    lnt = cfg.get("layer_norm_type", "layer_norm")
    if lnt != "layer_norm":
        _unsupported(cpath, "layer_norm_type", lnt, "zoi runs GTE with 'layer_norm'")
    for key in ("logn_attention_scale", "logn_attention_clip1"):
        if cfg.get(key):
            _unsupported(cpath, key, cfg[key], "zoi runs GTE without log-n attention scaling")


def rope_params(
    cfg: dict, cpath: Path, default_theta: float, d: int, maxpos: int, new: bool = False
) -> tuple[float, float]:
    """(base, linear factor or 0) of the RoPE tables, from `rope_scaling` (it wins, as in
    transformers' convert_rope_params_to_dict) or `rope_parameters`, and `rope_theta`."""
    rs = cfg.get("rope_scaling")
    name = "rope_scaling" if rs else "rope_parameters"
    p = rs or cfg.get("rope_parameters") or {}
    if not isinstance(p, dict):
        _unsupported(cpath, name, p, "expected a JSON object")
    if any(isinstance(v, dict) for v in p.values()):
        _unsupported(cpath, name, p, "one RoPE for every layer is expected, not one per layer kind")
    theta = p.get("rope_theta")
    if theta is None:
        theta = cfg.get("rope_theta", default_theta)
    theta = _number(cpath, f"{name}.rope_theta" if "rope_theta" in p else "rope_theta", theta)
    rt = p.get("rope_type", p.get("type", "default"))
    prf = p.get("partial_rotary_factor", cfg.get("partial_rotary_factor"))
    if prf not in (None, 1, 1.0):
        _unsupported(cpath, f"{name}.partial_rotary_factor", prf, "zoi rotates whole heads")
    if new and rt not in ("default", "ntk"):
        _unsupported(cpath, f"{name}.type", rt, "GTE's original code runs 'ntk' scaling only")
    if rt not in ROPE_TYPES:
        _unsupported(
            cpath, f"{name}.rope_type", rt, f"zoi runs RoPE of type {', '.join(ROPE_TYPES)}"
        )
    if rt == "default":
        return theta, 0.0
    factor = _number(cpath, f"{name}.factor", p.get("factor"))
    if rt == "linear":
        return theta, factor
    if d <= 2:
        _unsupported(cpath, f"{name}.rope_type", rt, f"NTK scaling needs head_dim > 2, got {d}")
    if rt == "ntk":  # Alibaba-NLP's NTKScalingRotaryEmbedding, fixed (not mixed) NTK
        if p.get("mixed_b") is not None:
            _unsupported(cpath, f"{name}.mixed_b", p["mixed_b"], "zoi runs fixed NTK scaling")
        return theta * factor, factor ** (2 / d)
    # dynamic NTK: transformers recomputes the base only past max_position_embeddings, which
    # no sequence of zoi reaches (max_positions is that number): its base at that length
    base = theta * ((factor * maxpos / maxpos) - (factor - 1)) ** (d / (d - 2))
    return _number(cpath, f"{name} (the dynamic NTK base)", base), 0.0


def _nomic_view(cfg: dict, cpath: Path, field) -> dict:
    """NomicBERT's config as transformers' keys: nomic-ai's own keys (configuration_hf_nomic_bert,
    a GPT2Config: n_embd, n_layer, n_head, n_inner, n_positions, layer_norm_epsilon,
    rotary_emb_base, activation_function) stand in for transformers' keys it lacks. A config with
    only those keys takes that class's defaults (GPT2's, rotary_emb_fraction 0.0, biases on);
    one with transformers' keys too (the hub folders rewritten for transformers 5) takes
    transformers' reading where both speak (rope_parameters decides the RoPE, as there: a
    rotary_scaling_factor beside it is not read). The original options zoi does not run are
    refused by name."""
    if not is_original_nomic(cfg):
        return cfg
    pure = "hidden_size" not in cfg and "rope_parameters" not in cfg
    _nomic_original_checks(cfg, cpath, pure)
    v = dict(cfg)
    for key, orig, dflt in (
        ("hidden_size", "n_embd", 768),
        ("num_hidden_layers", "n_layer", 12),
        ("num_attention_heads", "n_head", 12),
        ("layer_norm_eps", "layer_norm_epsilon", 1e-5 if pure else 1e-12),
    ):
        if key not in v:
            v[key] = cfg.get(orig, dflt)
    hidden = field(v, cpath, "hidden_size")
    if "intermediate_size" not in v and (pure or "n_inner" in cfg):
        # NomciBertGatedMLP widens its MLP up to a multiple of 256 (8/3 of n_embd when unset)
        inner = field(cfg, cpath, "n_inner", default=None)
        inner = inner if inner is not None else int(8 * hidden / 3)
        v["intermediate_size"] = (inner + 255) // 256 * 256
    # RoPE runs at any position: the longer of the two limits (n_positions: the hub's 8192),
    # unless transformers' dynamic NTK starts past max_position_embeddings
    limits = [field(cfg, cpath, k) for k in ("max_position_embeddings", "n_positions") if k in cfg]
    rp = cfg.get("rope_parameters")
    dynamic = isinstance(rp, dict) and rp.get("rope_type", rp.get("type")) == "dynamic"
    if not (dynamic and "max_position_embeddings" in cfg):
        v["max_position_embeddings"] = max(limits) if limits else 1024
    if "hidden_act" not in v:
        v["hidden_act"] = _NOMIC_GATED[cfg.get("activation_function", "swiglu")]
    if "rope_parameters" not in cfg and "rope_theta" not in cfg:
        v["rope_theta"] = cfg.get("rotary_emb_base", 10000.0 if pure else 1000.0)
    vocab = field(cfg, cpath, "vocab_size", default=50257 if pure else 30528)
    mult = field(cfg, cpath, "pad_vocab_size_multiple", default=1) or 1
    v["vocab_size"] = vocab + (-vocab) % mult  # NomicBertModel pads the vocabulary so
    return v


def _nomic_original_checks(cfg: dict, cpath: Path, pure: bool) -> None:
    act = cfg.get("activation_function", "gelu_new" if pure else "swiglu")
    if act not in _NOMIC_GATED:
        _unsupported(
            cpath,
            "activation_function",
            act,
            f"zoi runs NomicBERT's gated MLPs {', '.join(sorted(_NOMIC_GATED))}",
        )
    want = {
        "rotary_emb_fraction": (1, "zoi rotates whole heads (1.0)"),
        "rotary_emb_interleaved": (False, "zoi runs the GPT-NeoX rotation (false)"),
        "rotary_emb_scale_base": (None, "zoi runs RoPE without xPos scaling (null)"),
        "prenorm": (False, "NomicBERT runs post-norm here (false)"),
        "parallel_block": (False, "zoi runs sequential blocks (false)"),
        "use_rms_norm": (False, "zoi runs NomicBERT with LayerNorm (false)"),
        "causal": (False, "an encoder attends both ways (false)"),
        "qkv_proj_bias": (False, "zoi runs NomicBERT without linear biases (false)"),
        "mlp_fc1_bias": (False, "zoi runs NomicBERT without linear biases (false)"),
        "mlp_fc2_bias": (False, "zoi runs NomicBERT without linear biases (false)"),
        "rotary_head_dim": (False, "the rotation is over the head dimension (false)"),
    }
    if pure:  # no rope_parameters: the original code's RoPE is the one this model was run with
        want["rotary_scaling_factor"] = (
            None,
            "its dynamic NTK past max_trained_positions depends on each batch's length (null)",
        )
    defaults = {  # the original class's defaults where they differ from what zoi runs
        "rotary_emb_fraction": 0.0,
        "qkv_proj_bias": True,
        "mlp_fc1_bias": True,
        "mlp_fc2_bias": True,
    }
    for key, (ok, why) in want.items():
        if key not in cfg and not (pure and key in defaults):
            continue
        v = cfg.get(key, defaults.get(key))
        if ok is None or isinstance(ok, bool):
            bad = v is not ok
        else:
            bad = isinstance(v, bool) or not isinstance(v, (int, float)) or v != ok
        if bad:
            _unsupported(cpath, key, v, why)
    for key in ("num_experts", "moe_every_n_layers"):
        if cfg.get(key):
            _unsupported(cpath, key, cfg[key], "zoi runs dense NomicBERT layers (no experts)")
    kvh = cfg.get("num_heads_kv")
    heads = cfg.get("num_attention_heads", cfg.get("n_head"))
    if kvh is not None and kvh != heads:
        _unsupported(cpath, "num_heads_kv", kvh, f"zoi runs NomicBERT with n_head ({heads})")


# ---------------------------------------------------------------- weights
def _layout(spec: ModelSpec, names: list[str]) -> str:
    """Which tensor names the checkpoint uses: "hub" (the hub folders' and save_pretrained's)
    or "modules" (transformers' module names, a state_dict saved as it is)."""
    if spec.arch == "nomic_bert":
        anchors = ("encoder.layers.0.attn.Wqkv.weight",)
    elif spec.arch == "jina_v3":
        anchors = ("encoder.layers.0.mixer.Wqkv.weight",)
    else:  # GTE's NewModel, packed (qkv_proj) or not
        anchors = tuple(f"encoder.layer.0.attention.{x}.weight" for x in ("qkv_proj", "q_proj"))
    hub = any(n == a or n.endswith("." + a) for n in names for a in anchors)
    return "hub" if hub else "modules"


def mapping(spec: ModelSpec, names: list[str]) -> tuple[dict[str, list[str]], set[str]]:
    """(canonical name -> source names, canonical names that may be absent). `names`: the
    checkpoint's tensors (the layout is read from them)."""
    if spec.head:
        raise UnsupportedModelError(
            f"task heads on {spec.arch} are not supported yet (head {spec.head!r}); use the "
            "base model's checkpoint for embeddings"
        )
    m: dict[str, list[str]] = {"embed.word": ["embeddings.word_embeddings.weight"]}
    if spec.type_vocab_size:
        m["embed.type"] = ["embeddings.token_type_embeddings.weight"]
    layout = _layout(spec, names)
    if spec.arch == "jina_v3":
        return _jina_mapping(spec, m, layout), set()
    nomic = spec.arch == "nomic_bert"
    bias = not nomic  # GTE: q / k / v / o and the down projection carry biases
    if layout == "hub" and nomic:
        m["embed.ln.w"], m["embed.ln.b"] = ["emb_ln.weight"], ["emb_ln.bias"]
        for i in range(spec.layers):
            p = f"encoder.layers.{i}."
            m[f"l{i}.qkv.w"] = [p + "attn.Wqkv.weight"]
            m[f"l{i}.o.w"] = [p + "attn.out_proj.weight"]
            m[f"l{i}.ffn1.w"] = [p + "mlp.fc12.weight", p + "mlp.fc11.weight"]  # gate, up
            m[f"l{i}.ffn2.w"] = [p + "mlp.fc2.weight"]
            for j, n in ((1, "norm1"), (2, "norm2")):
                m[f"l{i}.ln{j}.w"], m[f"l{i}.ln{j}.b"] = [p + n + ".weight"], [p + n + ".bias"]
        return m, set()
    m["embed.ln.w"] = ["embeddings.LayerNorm.weight"]
    m["embed.ln.b"] = ["embeddings.LayerNorm.bias"]
    for i in range(spec.layers):
        if layout == "hub":  # GTE's NewModel names
            p = f"encoder.layer.{i}."
            a = p + "attention."
            packed = any(n.endswith(a + "qkv_proj.weight") for n in names)
            qkv = [a + "qkv_proj"] if packed else [a + f"{x}_proj" for x in "qkv"]
            o, ln1, ln2 = a + "o_proj", p + "attn_ln", p + "mlp_ln"
            m[f"l{i}.up_gate.w"] = [p + "mlp.up_gate_proj.weight"]  # [up; gate]: derive swaps
        else:
            p = f"layers.{i}."
            a = p + "self_attn."
            qkv = [a + f"{x}_proj" for x in "qkv"]
            o, ln1, ln2 = a + "o_proj", p + "post_attention_layernorm", p + "post_mlp_layernorm"
            m[f"l{i}.ffn1.w"] = [p + f"mlp.{x}_proj.weight" for x in ("gate", "up")]
        m[f"l{i}.qkv.w"] = [s + ".weight" for s in qkv]
        m[f"l{i}.o.w"] = [o + ".weight"]
        m[f"l{i}.ffn2.w"] = [p + "mlp.down_proj.weight"]
        if bias:
            m[f"l{i}.qkv.b"] = [s + ".bias" for s in qkv]
            m[f"l{i}.o.b"] = [o + ".bias"]
            m[f"l{i}.ffn2.b"] = [p + "mlp.down_proj.bias"]
        for j, n in ((1, ln1), (2, ln2)):
            m[f"l{i}.ln{j}.w"], m[f"l{i}.ln{j}.b"] = [n + ".weight"], [n + ".bias"]
    return m, set()


def _jina_mapping(spec: ModelSpec, m: dict, layout: str) -> dict[str, list[str]]:
    """jina-embeddings-v3: the hub's names (its original folder, and what save_pretrained
    writes: transformers' conversion_mapping renames them back) or transformers' modules'."""
    if layout == "hub":
        m["embed.ln.w"], m["embed.ln.b"] = ["emb_ln.weight"], ["emb_ln.bias"]
    else:
        m["embed.ln.w"] = ["embeddings.LayerNorm.weight"]
        m["embed.ln.b"] = ["embeddings.LayerNorm.bias"]
    for i in range(spec.layers):
        if layout == "hub":
            p = f"encoder.layers.{i}."
            names = {"qkv": [p + "mixer.Wqkv"], "o": [p + "mixer.out_proj"]}
            names.update(ln1=[p + "norm1"], ln2=[p + "norm2"])
        else:
            p = f"layers.{i}."
            names = {"qkv": [p + f"self_attn.{x}_proj" for x in "qkv"]}
            names.update(o=[p + "self_attn.o_proj"], ln1=[p + "post_attention_layernorm"])
            names["ln2"] = [p + "post_mlp_layernorm"]
        names.update(ffn1=[p + "mlp.fc1"], ffn2=[p + "mlp.fc2"])
        for key, srcs in names.items():
            m[f"l{i}.{key}.w"] = [s + ".weight" for s in srcs]
            m[f"l{i}.{key}.b"] = [s + ".bias" for s in srcs]
    return m


def expected_shapes(spec: ModelSpec) -> dict[str, tuple[int, ...]]:
    H, I, d = spec.hidden, spec.intermediate, spec.head_dim
    gated = spec.arch in GATED_ROTARY_ARCHS
    q = spec.heads * d
    s: dict[str, tuple[int, ...]] = {
        "embed.word": (spec.vocab_size, H),
        "embed.ln.w": (H,),
        "embed.ln.b": (H,),
    }
    if spec.type_vocab_size:
        s["embed.type"] = (spec.type_vocab_size, H)
    for i in range(spec.layers):
        s.update(
            {
                f"l{i}.qkv.w": (3 * q, H),
                f"l{i}.qkv.b": (3 * q,),
                f"l{i}.o.w": (H, q),
                f"l{i}.o.b": (H,),
                f"l{i}.ln1.w": (H,),
                f"l{i}.ln1.b": (H,),
                f"l{i}.ffn1.w": (2 * I if gated else I, H),
                f"l{i}.ffn1.b": (2 * I if gated else I,),
                f"l{i}.ffn2.w": (H, I),
                f"l{i}.ffn2.b": (H,),
                f"l{i}.ln2.w": (H,),
                f"l{i}.ln2.b": (H,),
            }
        )
    s["rope.g.cos"] = s["rope.g.sin"] = (spec.max_positions, d // 2)
    s.update(adapter_shapes(spec))
    return s


def source_shapes(spec: ModelSpec) -> dict[str, tuple[int, ...]]:
    """Shapes of the canonical names as read from the checkpoint (before derive)."""
    s = {
        k: v
        for k, v in expected_shapes(spec).items()
        if not k.startswith("rope.") and ".lora_" not in k
    }
    for i in range(spec.layers):
        s[f"l{i}.up_gate.w"] = s[f"l{i}.ffn1.w"]
    return s


def rope_tables(spec: ModelSpec) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin [P, d/2] float32: position * inv_freq, inv_freq = 1 / base^(2i/d) (then / the
    linear factor), each step in float32 as transformers' rotary embeddings compute it."""
    d, P = spec.head_dim, spec.max_positions
    exps = (np.arange(0, d, 2, dtype=np.float32) / np.float32(d)).astype(np.float32)
    inv = (np.float32(1.0) / np.power(np.float32(spec.rope_theta), exps)).astype(np.float32)
    if spec.rope_factor:
        inv = (inv / np.float32(spec.rope_factor)).astype(np.float32)
    f = (np.arange(P, dtype=np.float32)[:, None] * inv[None, :]).astype(np.float32)
    return np.cos(f).astype(np.float32), np.sin(f).astype(np.float32)


def derive(spec: ModelSpec, w: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The tables computed at load time (module doc); zero biases the architecture lacks."""
    I = spec.intermediate
    for i in range(spec.layers):
        ug = w.pop(f"l{i}.up_gate.w", None)
        if ug is not None:  # GTE's original [up; gate] -> the glu op's [gate; up]
            w[f"l{i}.ffn1.w"] = np.ascontiguousarray(np.concatenate([ug[I:], ug[:I]], axis=0))
    for n, shp in expected_shapes(spec).items():
        if n not in w and n.endswith(".b"):
            w[n] = np.zeros(shp, np.float32)
    w["rope.g.cos"], w["rope.g.sin"] = rope_tables(spec)
    return w
