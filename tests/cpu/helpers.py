"""Random CompiledModels (no checkpoint needed) for the CPU backend tests (tests/fixtures.py)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the subprocess scripts: tests.*
from tests.fixtures import (  # noqa: E402, F401  (re-exported)
    ISAS,
    batch,
    quantize_linears,
    random_weights,
    supported_isas,
)

from zoi.frontend.spec import ModelSpec  # noqa: E402
from zoi.graph.compiled import CompiledModel  # noqa: E402


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
    W, quant = random_weights(spec, seed), {}
    if precision == "int8":
        W, quant = quantize_linears(
            W, None, schemes, act_transforms, default_scheme, seed, embed_int8=embed_int8
        )
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
