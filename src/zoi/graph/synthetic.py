"""Random models in zoi's weight names (docs/ARCHITECTURE.md), for tools and tests that need
a model of a given shape without a checkpoint: `random_weights(spec)`, `synthetic_spec(...)`
(a small BERT spec) and `random_model(...)` (a float CompiledModel of that spec)."""

from __future__ import annotations

import numpy as np

from zoi.frontend.spec import ModelSpec
from zoi.graph.compiled import CompiledModel


def random_weights(spec: ModelSpec, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    H, I, V, P = (
        spec.hidden,
        spec.intermediate,
        spec.vocab_size,
        spec.max_positions + spec.position_offset,
    )
    n = lambda *s, sc=0.05: (rng.standard_normal(s) * sc).astype(np.float32)  # noqa: E731
    w = {
        "embed.word": n(V, H, sc=0.5),
        "embed.pos": n(P, H, sc=0.2),
        "embed.ln.w": 1 + n(H, sc=0.1),
        "embed.ln.b": n(H, sc=0.1),
    }
    if spec.type_vocab_size:
        w["embed.type"] = n(spec.type_vocab_size, H, sc=0.2)
    for i in range(spec.layers):
        w[f"l{i}.qkv.w"], w[f"l{i}.qkv.b"] = n(3 * H, H, sc=H**-0.5), n(3 * H, sc=0.02)
        w[f"l{i}.o.w"], w[f"l{i}.o.b"] = n(H, H, sc=H**-0.5), n(H, sc=0.02)
        w[f"l{i}.ffn1.w"], w[f"l{i}.ffn1.b"] = n(I, H, sc=H**-0.5), n(I, sc=0.02)
        w[f"l{i}.ffn2.w"], w[f"l{i}.ffn2.b"] = n(H, I, sc=I**-0.5), n(H, sc=0.02)
        for ln in ("ln1", "ln2"):
            w[f"l{i}.{ln}.w"], w[f"l{i}.{ln}.b"] = 1 + n(H, sc=0.1), n(H, sc=0.1)
    return w


def synthetic_spec(
    *,
    hidden=48,
    heads=3,
    layers=2,
    inter=80,
    act="gelu",
    pooling="mean",
    type_vocab=2,
) -> ModelSpec:
    """A BERT spec of the given shape (vocabulary 97, 40 positions)."""
    return ModelSpec(
        arch="bert",
        vocab_size=97,
        hidden=hidden,
        layers=layers,
        heads=heads,
        intermediate=inter,
        max_positions=40,
        type_vocab_size=type_vocab,
        act=act,
        pooling=pooling,
        eps=1e-12,
        name="tiny",
    )


def random_model(
    precision: str = "fp32", *, max_tokens=64, max_batch=None, seed=0, **shape
) -> CompiledModel:
    """A float ("fp32" / "fp16") CompiledModel of `synthetic_spec(**shape)`, random weights."""
    if precision not in ("fp32", "fp16"):
        raise ValueError(f"random_model builds float models (fp32 / fp16), not {precision!r}")
    spec = synthetic_spec(**shape)
    return CompiledModel.build(spec, random_weights(spec, seed), precision, max_tokens, max_batch)
