"""A small random BERT in zoi's weight names (docs/ARCHITECTURE.md), fp32 or INT8."""

from __future__ import annotations

import numpy as np
from tests.fixtures import batch, min_cosine, quantize_linears, rel  # noqa: F401  (re-exported)

from zoi.graph.compiled import CompiledModel, LinearQuant
from zoi.graph.synthetic import random_weights, synthetic_spec

# every INT8 scheme and transform in one 2-layer model (asym / sym / static, act_mul with and
# without act_shift on whole-row and tile producers, a float and a weight-only linear)
MIXED = dict(
    default="dynamic_asym",
    schemes={"l0.o": "dynamic", "l1.qkv": "dynamic", "l1.ffn1": "fp32", "l1.ffn2": "weight_only"},
    static={"l0.ffn2": 4.0},
    transforms={
        "l0.qkv": "shift+mul",
        "l0.o": "mul",
        "l0.ffn2": "mul",
        "l1.ffn1": "shift+mul",
        "l1.ffn2": "mul",
    },
)


def default_quant_model(max_tokens=64, max_batch=None, shape=None, **config) -> CompiledModel:
    """A tiny BERT (trained-like LayerNorm outliers) quantised by zoi.quant with its DEFAULT
    config (dynamic_asym activations, SmoothQuant act_mul, GPTQ) plus `config` overrides."""
    from tests.fixtures import tiny_weights
    from tests.quant.helpers import WordTokenizer, texts, tiny_spec

    from zoi.quant import QuantConfig, quantize_model

    spec = tiny_spec(**(shape or {}))
    w = tiny_weights(spec, seed=3)  # LayerNorm gains with outliers
    w1, q1 = quantize_model(
        spec,
        w,
        WordTokenizer(spec.vocab_size),
        calibration=texts(48, seed=1),
        config=QuantConfig(**config),
    )
    return CompiledModel.build(spec, w1, "int8", max_tokens, max_batch, q1)


def tiny_model(
    precision: str,
    *,
    hidden=48,
    heads=3,
    layers=2,
    inter=80,
    act="gelu",
    pooling="mean",
    max_tokens=64,
    max_batch=None,
    type_vocab=2,
    static=None,
    seed=0,
    schemes=None,
    transforms=None,
    default="dynamic",
) -> CompiledModel:
    spec = synthetic_spec(
        hidden=hidden,
        heads=heads,
        layers=layers,
        inter=inter,
        act=act,
        pooling=pooling,
        type_vocab=type_vocab,
    )
    w = random_weights(spec, seed)
    quant = {}
    if precision == "int8":
        w, quant = quantize_linears(w, static, schemes, transforms, default, seed)
    return CompiledModel.build(spec, w, precision, max_tokens, max_batch, quant)


def required_quant_features(weights: dict, quant: dict[str, LinearQuant]) -> set[str]:
    """The INT8 features (zoi.quant.config.FEATURES) a model's weights and quant dict use."""
    need = set()
    for p, q in quant.items():
        if q.scheme == "fp32":
            if f"{p}.w_q" in weights:
                need.add("weight_only")
        else:
            need.add(q.scheme)
        for extra in ("act_mul", "act_shift"):
            if f"{p}.{extra}" in weights:
                need.add(extra)
    return need


def linear_same_input_errors(be, model, lens, seed=0) -> dict[str, float]:
    """Run the backend's unfused launch list step by step and check every linear against
    zoi.numerics.reference.linear_apply (the INT8 emulation, act_shift / act_mul included) on
    the very fp16 input the kernel read: {prefix: relative error} (fp16 output rounding only,
    ~2e-4, when the wiring of schemes and transforms is right). Eager or on the GPU."""
    import torch

    from zoi.numerics.reference import activation, linear_apply

    ids, pos, cu = batch(lens, model.spec.vocab_size, np.random.default_rng(seed))
    T = len(ids)
    tb = next(b for b in be.buckets if b >= T)
    plan = be.plan_for(tb)
    n, _ = be._stage(ids, pos, cu, False, tb)
    be.d_in[:n] = torch.from_numpy(be.h_in[:n].copy()).to(be.d_in.device)
    out: dict[str, float] = {}
    ctx = torch.cuda.stream(be.tstream) if not be.eager else None
    for step, la in zip(be._steps[tb], plan["launches"], strict=True):
        x = None
        if la.kind == "linear":  # its fp16 input, before the step (the arena is reused)
            x = be._act(plan, la.ins[0], tb)[:T].float().cpu().numpy()
        if ctx is not None:
            with ctx:
                step()
            torch.cuda.synchronize()
        else:
            step()
        if x is None:
            continue
        p = la.extra["prefix"]
        got = be._act(plan, la.out, tb)[:T].float().cpu().numpy()
        want = linear_apply(x, model.weights, p, model.quant.get(p)).astype(np.float64)
        want = activation(want, la.op.attrs.get("act", "none"))
        if la.res:
            want = want + be._act(plan, la.res, tb)[:T].float().cpu().numpy()
        out[p] = rel(got, want)
    return out


def fp16_storage_emulation(model, ids, pos, cu, normalize: bool):
    """(naive, gold): the output of a NAIVE same-dtype implementation of an INT8 model on this
    backend and the float64 reference's (DESIGN.md, example 4: a kernel's error may be ~2x the
    naive one's against float64): the float32 INT8 emulation with
    activations stored in fp16 wherever the CUDA backend stores them: its fp16 embedding tables
    (word when float, position, type) and the output of every op but the pool (embed, each
    linear after its activation and residual, attention, add_layernorm, glu), so that every
    int8 copy is quantised from the stored fp16 value, as the backend's producers and quantize
    launches do. Not emulated: attention's fp16 probabilities before the PV product (measured
    negligible: 0.0705 with them, 0.0704 without, below).

    The tiny 24-wide artifacts are sensitive to fp16 storage at sites a narrower emulation
    missed: static + shift (pooled Gram) at [20] * 3 gives rel 0.0704, bit-identical to the
    interpreter's arena (the embed output's rounding alone flips 6 of 1440 codes of l0.qkv's
    static copy: 0.0692); the default artifact at [5, 1, 9, 32] gives 0.0682, the H200's figure
    (qkv's fp16 output into attention alone: 0.0730). Rounding attention's output only (the
    emulation before) gave 0.0042 and 0.0016 there."""
    from zoi.numerics.reference import execute
    from zoi.numerics.reference import normalize as l2

    g = model.graph
    f16 = lambda y: np.asarray(y, np.float32).astype(np.float16).astype(np.float32)  # noqa: E731
    W = dict(model.weights)
    for op in g.ops:
        if op.kind == "embed":  # the tables weights.pack_weights packs as fp16
            for k in ("word", "pos", "type"):
                if k in op.weights and op.weights[k] in W:
                    W[op.weights[k]] = f16(W[op.weights[k]])

    def store(op, y):  # the pool's fp32 output goes to the host as is
        return y if op.kind == "pool" else f16(y)

    gold = execute(g, model.weights, ids, pos, cu, quant=model.quant, dtype=np.float64)[g.output]
    naive = execute(g, W, ids, pos, cu, quant=model.quant, store=store)[g.output]
    if normalize:
        gold, naive = l2(gold), l2(naive)
    return naive, gold


def fp16_storage_rel(model, ids, pos, cu, normalize: bool) -> float:
    """The relative error of fp16_storage_emulation's naive output against float64."""
    return rel(*fp16_storage_emulation(model, ids, pos, cu, normalize))


def run_ahead_of_time(code: str, arg):
    """`code` (Python that reads json.loads(sys.argv[1]) and prints one JSON line last) run in
    a process without TRITON_INTERPRET, from the repository root (tests/ importable), so Triton
    compiles for sm_90 for real without a GPU: its parsed last line. Skips where ptxas is
    missing; any other failure fails with the process's stderr."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    import pytest

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run(
        [sys.executable, "-c", code, json.dumps(arg)],
        env=env,
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    if r.returncode != 0 and "ptxas" in r.stderr and "not found" in r.stderr:
        pytest.skip("no ptxas")
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])
