"""Random CompiledModels (no checkpoint needed) and packed batches for the CPU backend tests."""

from __future__ import annotations

import numpy as np

from zoi.frontend.spec import ModelSpec
from zoi.graph.compiled import CompiledModel, LinearQuant
from zoi.numerics import primitives as qp

ISAS = ("vnni", "avx512", "avx2", "scalar")


def supported_isas() -> list[str]:
    from zoi import _cpu

    return [i for i in ISAS if _cpu.isa_supported(i)]


def random_weights(spec: ModelSpec, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    H, I = spec.hidden, spec.intermediate

    def r(*shape, s=0.08):
        return (rng.standard_normal(shape) * s).astype(np.float32)

    W = {
        "embed.word": r(spec.vocab_size, H, s=0.5),
        "embed.pos": r(spec.max_positions + spec.position_offset, H, s=0.3),
        "embed.ln.w": 1 + r(H, s=0.1),
        "embed.ln.b": r(H, s=0.05),
    }
    if spec.type_vocab_size:
        W["embed.type"] = r(spec.type_vocab_size, H, s=0.3)
    for i in range(spec.layers):
        W[f"l{i}.qkv.w"], W[f"l{i}.qkv.b"] = r(3 * H, H), r(3 * H, s=0.05)
        W[f"l{i}.o.w"], W[f"l{i}.o.b"] = r(H, H), r(H, s=0.05)
        W[f"l{i}.ln1.w"], W[f"l{i}.ln1.b"] = 1 + r(H, s=0.1), r(H, s=0.05)
        W[f"l{i}.ffn1.w"], W[f"l{i}.ffn1.b"] = r(I, H), r(I, s=0.05)
        W[f"l{i}.ffn2.w"], W[f"l{i}.ffn2.b"] = r(H, I), r(H, s=0.05)
        W[f"l{i}.ln2.w"], W[f"l{i}.ln2.b"] = 1 + r(H, s=0.1), r(H, s=0.05)
    return W


def quantize_weights(W: dict, spec: ModelSpec, embed_int8: bool = True, keep_fp32=()) -> dict:
    Q = dict(W)
    for i in range(spec.layers):
        for n in ("qkv", "o", "ffn1", "ffn2"):
            p = f"l{i}.{n}"
            if p in keep_fp32:
                continue
            Q[f"{p}.w_q"], Q[f"{p}.w_scale"] = qp.quantize_weight(Q.pop(f"{p}.w"))
    if embed_int8:
        Q["embed.word_q"], Q["embed.word_scale"] = qp.quantize_embedding(Q.pop("embed.word"))
    return Q


def make_model(
    spec: ModelSpec,
    precision: str = "fp32",
    max_tokens: int = 256,
    max_batch: int | None = None,
    seed: int = 0,
    embed_int8: bool = True,
    schemes: dict | None = None,
    default_scheme: str = "dynamic",
    act_transforms: dict | None = None,
) -> CompiledModel:
    """schemes: {prefix: dynamic|static|dynamic_asym|fp32|weight_only}; act_transforms: {prefix: "mul" | "shift+mul"}
    adds random `p.act_mul` / `p.act_shift` (the pre-quantisation transform of zoi.quant)."""
    W = random_weights(spec, seed)
    quant = {}
    if precision == "int8":
        schemes = schemes or {}
        keep = tuple(p for p, s in schemes.items() if s == "fp32")
        W = quantize_weights(W, spec, embed_int8, keep)
        rng = np.random.default_rng(seed + 1000)
        for i in range(spec.layers):
            for n in ("qkv", "o", "ffn1", "ffn2"):
                p = f"l{i}.{n}"
                s = schemes.get(p, default_scheme)
                if s == "weight_only":  # INT8 weights, float compute
                    quant[p] = LinearQuant("fp32", None, {"weights": "int8"})
                    continue
                quant[p] = LinearQuant(s, 2.5 if s == "static" else None)
                t = (act_transforms or {}).get(p)
                if t:
                    K = W[f"{p}.w_q"].shape[1] if f"{p}.w_q" in W else W[f"{p}.w"].shape[1]
                    W[f"{p}.act_mul"] = (0.5 + rng.random(K)).astype(np.float32)
                    if "shift" in t:
                        W[f"{p}.act_shift"] = (0.1 * rng.standard_normal(K)).astype(np.float32)
    return CompiledModel.build(spec, W, precision, max_tokens, max_batch, quant)


def small_spec(**kw) -> ModelSpec:
    d = dict(
        arch="bert",
        vocab_size=300,
        hidden=60,
        layers=2,
        heads=5,
        intermediate=97,
        max_positions=80,
        type_vocab_size=2,
        eps=1e-12,
        act="gelu",
        pooling="mean",
        name="tiny",
    )
    d.update(kw)
    return ModelSpec(**d)


def minilm_spec(layers: int = 6) -> ModelSpec:
    return ModelSpec(
        arch="bert",
        vocab_size=30522,
        hidden=384,
        layers=layers,
        heads=12,
        intermediate=1536,
        max_positions=512,
        type_vocab_size=2,
        eps=1e-12,
        act="gelu",
        pooling="mean",
        name="minilm-shape",
    )


def batch(lengths, vocab: int, seed: int = 0, position_offset: int = 0):
    rng = np.random.default_rng(seed)
    T = int(sum(lengths))
    ids = rng.integers(0, vocab, T).astype(np.int32)
    pos = np.concatenate([np.arange(n) + position_offset for n in lengths]).astype(np.int32)
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    return ids, pos, cu
