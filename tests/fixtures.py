"""The fixtures every test folder shares (built on zoi.graph.synthetic): the CPU ISAs this
machine runs, the INT8 weight quantiser of random models, packed batches, error measures."""

from __future__ import annotations

import numpy as np

from zoi.graph.compiled import LinearQuant
from zoi.graph.synthetic import random_weights, synthetic_spec  # noqa: F401  (re-exported)
from zoi.numerics import primitives as qp

# x86 then Arm: supported_isas() keeps the ones this CPU runs (each ISA forced in the tests)
ISAS = ("amx", "vnni", "avx512", "avxvnni", "avx2", "i8mm", "dotprod", "neon", "scalar")
LINEARS = ("qkv", "o", "ffn1", "ffn2")


def supported_isas() -> list[str]:
    """Every ISA this CPU runs; with ZOI_TEST_ISAS=quick (`make check`, the edit loop) only the
    one the core picks and scalar. CI and `make test` run them all."""
    import os

    from zoi import _cpu

    isas = [i for i in ISAS if _cpu.isa_supported(i)]
    if os.environ.get("ZOI_TEST_ISAS", "all") == "quick":
        isas = [i for i in isas if i in (_cpu.active_isa(), "scalar")]
    return isas


def tiny_weights(spec, seed: int = 0, outliers: bool = True) -> dict[str, np.ndarray]:
    """random_weights, LayerNorm gains with a few large channels (x12), as trained BERTs have."""
    w = random_weights(spec, seed)
    if outliers:
        rng = np.random.default_rng(seed + 1)
        for k in w:
            if k.endswith(("ln.w", "ln1.w", "ln2.w")):
                w[k][rng.choice(spec.hidden, 2, replace=False)] *= 12.0
    return w


def quantize_linears(
    weights: dict[str, np.ndarray],
    static: dict[str, float] | None = None,
    schemes: dict[str, str] | None = None,
    transforms: dict[str, str] | None = None,
    default: str = "dynamic",
    seed: int = 0,
    embed_int8: bool = False,
    static_amax: float = 2.5,
):
    """Per-channel INT8 weights for every linear: `default` scheme unless `static` names an
    amax or `schemes` names dynamic | static (amax `static_amax`) | dynamic_asym | weight_only |
    fp32 (float weights); `transforms` {prefix: "mul" | "shift+mul"} adds random p.act_mul /
    p.act_shift; `embed_int8` stores the word table as INT8 rows. Returns (weights, quant)."""
    out, quant = dict(weights), {}
    rng = np.random.default_rng(seed + 1000)
    for k in list(weights):
        if k.endswith(".w") and k.split(".")[1] in LINEARS:
            p = k[:-2]
            K = weights[k].shape[1]
            s = (schemes or {}).get(p, default)
            if s != "fp32":
                out[f"{p}.w_q"], out[f"{p}.w_scale"] = qp.quantize_weight(out.pop(k))
            amax = (static or {}).get(p)
            if amax is not None:
                quant[p] = LinearQuant("static", amax)
            elif s == "static":
                quant[p] = LinearQuant("static", static_amax)
            elif s in ("weight_only", "fp32"):
                quant[p] = LinearQuant("fp32")
            else:
                quant[p] = LinearQuant(s)
            t = (transforms or {}).get(p)
            if t:
                out[f"{p}.act_mul"] = (0.5 + rng.random(K)).astype(np.float32)
                if "shift" in t:
                    out[f"{p}.act_shift"] = (0.1 * rng.standard_normal(K)).astype(np.float32)
    if embed_int8:
        out["embed.word_q"], out["embed.word_scale"] = qp.quantize_embedding(out.pop("embed.word"))
    return out, quant


def batch(lengths, vocab: int = 97, seed=0, position_offset: int = 0):
    """Packed (ids, positions, cu_seqlens) of sequences of `lengths`; seed: an int or a Generator."""
    rng = np.random.default_rng(seed)
    T = int(sum(lengths))
    ids = rng.integers(0, vocab, T).astype(np.int32)
    pos = np.concatenate([np.arange(n) + position_offset for n in lengths]).astype(np.int32)
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    return ids, pos, cu


def rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert np.isfinite(a).all()
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def min_cosine(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(((a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)).min())
