"""The architectures beyond BERT / DistilBERT / RoBERTa: MPNet, ModernBERT, Electra, ALBERT.

For each: config.json -> ModelSpec fields, canonical weight name -> source tensors, the
expected shapes, and the tables derived at load time (docs/ARCHITECTURE.md):

- MPNet: `rel_bias` [heads, 2P-1], the relative position bias of transformers'
  MPNetEncoder.compute_position_bias for every offset j - i in (-P, P) (buckets computed once,
  the float32 log as torch computes it), shared by every layer;
- ModernBERT: `rope.g.cos` / `rope.g.sin` (and `rope.l.*` for the local layers) [P, d/2],
  cos / sin of position * inv_freq in float32 as transformers' ModernBertRotaryEmbedding;
  zero biases where the checkpoint has none (norm_bias / attention_bias / mlp_bias false);
- Electra: `embed.proj` (embeddings_project) when embedding_size != hidden_size;
- ALBERT: `embed.proj` (embedding_hidden_mapping_in); the shared layer weights are copied
  per layer (l{i}.*), so the graph, the quantiser and every backend see an ordinary stack.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from zoi.errors import CheckpointError, UnsupportedModelError
from zoi.frontend.spec import ModelSpec

NEW_ARCHS = ("mpnet", "modernbert", "electra", "albert")
MPNET_BUCKETS, MPNET_MAX_DISTANCE = 32, 128  # literals of transformers' compute_position_bias


def _unsupported(cpath: Path, field: str, value, why: str):
    raise UnsupportedModelError(f"{cpath}: {field} {value!r} is not supported: {why}")


def spec_fields(arch: str, cfg: dict, cpath: Path, field, acts: dict) -> dict:
    """The ModelSpec keyword arguments of a new architecture (`field` is checkpoint._field)."""
    if arch == "modernbert":
        return _modernbert_fields(cfg, cpath, field, acts)
    kw = dict(
        hidden=field(cfg, cpath, "hidden_size"),
        layers=field(cfg, cpath, "num_hidden_layers"),
        heads=field(cfg, cpath, "num_attention_heads"),
        intermediate=field(cfg, cpath, "intermediate_size"),
        eps=field(cfg, cpath, "layer_norm_eps", kind=float, default=1e-12),
    )
    act = cfg.get("hidden_act", "gelu_new" if arch == "albert" else "gelu")
    if not isinstance(act, str) or act not in acts:
        _unsupported(cpath, "hidden_act", act, f"zoi runs {sorted(acts)}")
    kw["act"] = acts[act]
    maxpos = field(cfg, cpath, "max_position_embeddings")
    pet = cfg.get("position_embedding_type", "absolute")
    if pet not in (None, "absolute"):
        _unsupported(cpath, "position_embedding_type", pet, "only 'absolute' is")
    if arch == "mpnet":
        nb = field(cfg, cpath, "relative_attention_num_buckets", default=MPNET_BUCKETS)
        if nb != MPNET_BUCKETS:
            _unsupported(
                cpath,
                "relative_attention_num_buckets",
                nb,
                f"transformers' MPNet buckets relative positions into {MPNET_BUCKETS}",
            )
        kw.update(
            position_offset=2,  # padding_idx 1 + 1, as MPNetEmbeddings
            rel_buckets=MPNET_BUCKETS,
            rel_max_distance=MPNET_MAX_DISTANCE,
            type_vocab_size=0,
        )
    else:  # electra, albert: BERT embeddings of embedding_size
        kw["type_vocab_size"] = field(cfg, cpath, "type_vocab_size", default=0)
        e = field(cfg, cpath, "embedding_size", default=kw["hidden"])
        if arch == "albert":
            groups = field(cfg, cpath, "num_hidden_groups", default=1)
            inner = field(cfg, cpath, "inner_group_num", default=1)
            if inner != 1:
                _unsupported(cpath, "inner_group_num", inner, "zoi runs ALBERT with 1")
            if groups < 1 or kw["layers"] % groups:
                _unsupported(cpath, "num_hidden_groups", groups, "it must divide num_hidden_layers")
            kw["embed_size"] = e  # ALBERT always maps the embeddings in
        else:
            kw["embed_size"] = e if e != kw["hidden"] else 0
    kw["max_positions"] = maxpos - kw.get("position_offset", 0)
    return kw


def _modernbert_fields(cfg: dict, cpath: Path, field, acts: dict) -> dict:
    kw = dict(
        hidden=field(cfg, cpath, "hidden_size"),
        layers=field(cfg, cpath, "num_hidden_layers"),
        heads=field(cfg, cpath, "num_attention_heads"),
        intermediate=field(cfg, cpath, "intermediate_size"),
        eps=field(cfg, cpath, "norm_eps", kind=float, default=1e-5),
        max_positions=field(cfg, cpath, "max_position_embeddings"),
        type_vocab_size=0,
    )
    act = cfg.get("hidden_activation", "gelu")
    if not isinstance(act, str) or act not in acts:
        _unsupported(cpath, "hidden_activation", act, f"zoi runs {sorted(acts)}")
    kw["act"] = acts[act]
    window = field(cfg, cpath, "local_attention", default=128)
    kw["local_window"] = window // 2  # |i - j| <= local_attention // 2, as transformers' mask
    every = field(cfg, cpath, "global_attn_every_n_layers", default=3)
    types = cfg.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or len(types) != kw["layers"]:
            _unsupported(cpath, "layer_types", types, "expected one entry per layer")
        want = [
            "full_attention" if i % max(every, 1) == 0 else "sliding_attention"
            for i in range(kw["layers"])
        ]
        if types != want:  # the one pattern zoi's graph builds: global every n-th layer
            n = next(
                (
                    n
                    for n in range(1, kw["layers"] + 1)
                    if types
                    == [
                        "full_attention" if i % n == 0 else "sliding_attention"
                        for i in range(kw["layers"])
                    ]
                ),
                None,
            )
            if n is None:
                _unsupported(
                    cpath,
                    "layer_types",
                    types,
                    "zoi runs full_attention on every n-th layer from layer 0, "
                    "sliding_attention on the others",
                )
            every = n
    kw["global_every"] = max(every, 1)
    theta = {"full_attention": cfg.get("global_rope_theta"), "sliding_attention": None}
    theta["sliding_attention"] = cfg.get("local_rope_theta")
    rp = cfg.get("rope_parameters")
    if rp is not None:
        if not isinstance(rp, dict):
            _unsupported(cpath, "rope_parameters", rp, "expected a JSON object")
        for kind, p in rp.items():
            if not isinstance(p, dict):
                continue
            rt = p.get("rope_type", "default")
            if rt != "default":
                _unsupported(cpath, f"rope_parameters.{kind}.rope_type", rt, "only 'default' is")
            if p.get("rope_theta") is not None:
                theta[kind] = p["rope_theta"]
    if cfg.get("rope_scaling") is not None:
        _unsupported(cpath, "rope_scaling", cfg["rope_scaling"], "zoi runs plain RoPE")
    g = theta["full_attention"] if theta["full_attention"] is not None else 160000.0
    loc = theta["sliding_attention"] if theta["sliding_attention"] is not None else 10000.0
    for name, v in (("global_rope_theta", g), ("local_rope_theta", loc)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
            raise CheckpointError(f"{cpath}: {name} should be a number > 0, got {v!r}")
    kw["rope_theta"], kw["rope_theta_local"] = float(g), float(loc)
    # classifier_pooling is the classification head's; an embedding pools as
    # sentence-transformers does (checkpoint.default_pooling, or the folder's Pooling config)
    return kw


# ---------------------------------------------------------------- weights
def mapping(spec: ModelSpec, cfg: dict) -> tuple[dict[str, list[str]], set[str]]:
    """(canonical name -> source names, canonical names that may be absent: zero-filled).
    cfg: config.json (ALBERT's num_hidden_groups)."""
    m: dict[str, list[str]] = {}
    optional: set[str] = set()
    L = spec.layers
    if spec.arch == "modernbert":
        m["embed.word"] = ["embeddings.tok_embeddings.weight"]
        m["embed.ln.w"] = ["embeddings.norm.weight"]
        m["embed.ln.b"] = ["embeddings.norm.bias"]
        for i in range(L):
            p = f"layers.{i}."
            names = {
                "qkv": "attn.Wqkv",
                "o": "attn.Wo",
                "ln2": "mlp_norm",
                "ffn1": "mlp.Wi",
                "ffn2": "mlp.Wo",
            }
            if i > 0:
                names["ln1"] = "attn_norm"
            for c, src in names.items():
                m[f"l{i}.{c}.w"] = [p + src + ".weight"]
                m[f"l{i}.{c}.b"] = [p + src + ".bias"]
        m["final_ln.w"] = ["final_norm.weight"]
        m["final_ln.b"] = ["final_norm.bias"]
        optional = {k for k in m if k.endswith(".b")}
        return m, optional
    m["embed.word"] = ["embeddings.word_embeddings.weight"]
    m["embed.pos"] = ["embeddings.position_embeddings.weight"]
    m["embed.ln.w"] = ["embeddings.LayerNorm.weight"]
    m["embed.ln.b"] = ["embeddings.LayerNorm.bias"]
    if spec.type_vocab_size:
        m["embed.type"] = ["embeddings.token_type_embeddings.weight"]
    for t, s in (("w", "weight"), ("b", "bias")):
        if spec.arch == "mpnet":
            m["rel.table"] = ["encoder.relative_attention_bias.weight"]
            for i in range(L):
                p = f"encoder.layer.{i}."
                m[f"l{i}.qkv.{t}"] = [p + f"attention.attn.{x}.{s}" for x in "qkv"]
                m[f"l{i}.o.{t}"] = [p + f"attention.attn.o.{s}"]
                m[f"l{i}.ln1.{t}"] = [p + f"attention.LayerNorm.{s}"]
                m[f"l{i}.ffn1.{t}"] = [p + f"intermediate.dense.{s}"]
                m[f"l{i}.ffn2.{t}"] = [p + f"output.dense.{s}"]
                m[f"l{i}.ln2.{t}"] = [p + f"output.LayerNorm.{s}"]
        elif spec.arch == "electra":
            if spec.embed_size:
                m[f"embed.proj.{t}"] = [f"embeddings_project.{s}"]
            for i in range(L):
                p = f"encoder.layer.{i}."
                qkv = ("query", "key", "value")
                m[f"l{i}.qkv.{t}"] = [p + f"attention.self.{x}.{s}" for x in qkv]
                m[f"l{i}.o.{t}"] = [p + f"attention.output.dense.{s}"]
                m[f"l{i}.ln1.{t}"] = [p + f"attention.output.LayerNorm.{s}"]
                m[f"l{i}.ffn1.{t}"] = [p + f"intermediate.dense.{s}"]
                m[f"l{i}.ffn2.{t}"] = [p + f"output.dense.{s}"]
                m[f"l{i}.ln2.{t}"] = [p + f"output.LayerNorm.{s}"]
        elif spec.arch == "albert":
            m[f"embed.proj.{t}"] = [f"encoder.embedding_hidden_mapping_in.{s}"]
            groups = int(cfg.get("num_hidden_groups") or 1)
            for i in range(L):
                g = int(i / (L / groups))  # transformers' AlbertTransformer group_idx
                p = f"encoder.albert_layer_groups.{g}.albert_layers.0."
                m[f"l{i}.qkv.{t}"] = [p + f"attention.{x}.{s}" for x in ("query", "key", "value")]
                m[f"l{i}.o.{t}"] = [p + f"attention.dense.{s}"]
                m[f"l{i}.ln1.{t}"] = [p + f"attention.LayerNorm.{s}"]
                m[f"l{i}.ffn1.{t}"] = [p + f"ffn.{s}"]
                m[f"l{i}.ffn2.{t}"] = [p + f"ffn_output.{s}"]
                m[f"l{i}.ln2.{t}"] = [p + f"full_layer_layer_norm.{s}"]
    return m, optional


def expected_shapes(spec: ModelSpec) -> dict[str, tuple[int, ...]]:
    H, I, L, P = spec.hidden, spec.intermediate, spec.layers, spec.max_positions
    E = spec.embed_size or H
    s: dict[str, tuple[int, ...]] = {
        "embed.word": (spec.vocab_size, E),
        "embed.ln.w": (E,),
        "embed.ln.b": (E,),
    }
    if spec.arch != "modernbert":
        s["embed.pos"] = (P + spec.position_offset, E)
    if spec.type_vocab_size:
        s["embed.type"] = (spec.type_vocab_size, E)
    if spec.embed_size:
        s["embed.proj.w"], s["embed.proj.b"] = (H, E), (H,)
    glu = 2 if spec.arch == "modernbert" else 1
    for i in range(L):
        s.update(
            {
                f"l{i}.qkv.w": (3 * H, H),
                f"l{i}.qkv.b": (3 * H,),
                f"l{i}.o.w": (H, H),
                f"l{i}.o.b": (H,),
                f"l{i}.ffn1.w": (glu * I, H),
                f"l{i}.ffn1.b": (glu * I,),
                f"l{i}.ffn2.w": (H, I),
                f"l{i}.ffn2.b": (H,),
                f"l{i}.ln2.w": (H,),
                f"l{i}.ln2.b": (H,),
            }
        )
        if spec.arch != "modernbert" or i > 0:
            s[f"l{i}.ln1.w"], s[f"l{i}.ln1.b"] = (H,), (H,)
    if spec.arch == "mpnet":
        s["rel_bias"] = (spec.heads, 2 * P - 1)
    if spec.arch == "modernbert":
        s["final_ln.w"], s["final_ln.b"] = (H,), (H,)
        half = spec.head_dim // 2
        s["rope.g.cos"] = s["rope.g.sin"] = (P, half)
        if any(i % spec.global_every for i in range(L)):
            s["rope.l.cos"] = s["rope.l.sin"] = (P, half)
    return s


def source_shapes(spec: ModelSpec) -> dict[str, tuple[int, ...]]:
    """Shapes of the canonical names as read from the checkpoint (before derive)."""
    s = expected_shapes(spec)
    if spec.arch == "mpnet":
        del s["rel_bias"]
        s["rel.table"] = (MPNET_BUCKETS, spec.heads)
    return s


def relative_position_bucket(rel: np.ndarray, num_buckets: int, max_distance: int) -> np.ndarray:
    """transformers' MPNetEncoder.relative_position_bucket in numpy (float32 log, as torch)."""
    n = -np.asarray(rel, np.int64)
    nb = num_buckets // 2
    ret = (n < 0).astype(np.int64) * nb
    n = np.abs(n)
    max_exact = nb // 2
    is_small = n < max_exact
    with np.errstate(divide="ignore"):
        f = np.log((n.astype(np.float32) / np.float32(max_exact)).astype(np.float32))
    f = (f / np.float32(math.log(max_distance / max_exact))).astype(np.float32)
    f = (f * np.float32(nb - max_exact)).astype(np.float32)
    large = max_exact + np.where(is_small, 0, f).astype(np.int64)
    large = np.minimum(large, nb - 1)
    return ret + np.where(is_small, n, large)


def rope_tables(theta: float, head_dim: int, P: int) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin [P, d/2] float32 of position * inv_freq (transformers' default RoPE, float32)."""
    exps = (np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim)).astype(np.float32)
    inv = (np.float32(1.0) / np.power(np.float32(theta), exps).astype(np.float32)).astype(
        np.float32
    )
    f = (np.arange(P, dtype=np.float32)[:, None] * inv[None, :]).astype(np.float32)
    return np.cos(f).astype(np.float32), np.sin(f).astype(np.float32)


def derive(spec: ModelSpec, w: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The tables computed at load time (module doc); zero biases for absent optional ones."""
    shapes = expected_shapes(spec)
    for n, shp in shapes.items():
        if n not in w and n.endswith(".b"):
            w[n] = np.zeros(shp, np.float32)
    if spec.arch == "mpnet":
        table = w.pop("rel.table")
        P = spec.max_positions
        rel = np.arange(-(P - 1), P)  # j - i
        bucket = relative_position_bucket(rel, spec.rel_buckets, spec.rel_max_distance)
        w["rel_bias"] = np.ascontiguousarray(table[bucket].T, dtype=np.float32)
    if spec.arch == "modernbert":
        P, d = spec.max_positions, spec.head_dim
        w["rope.g.cos"], w["rope.g.sin"] = rope_tables(spec.rope_theta, d, P)
        if "rope.l.cos" in shapes:
            w["rope.l.cos"], w["rope.l.sin"] = rope_tables(spec.rope_theta_local, d, P)
    return w
