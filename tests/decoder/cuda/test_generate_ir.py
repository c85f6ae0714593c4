"""The GPU's generation runtime reads the one runtime's IR (build_generate's graph): the weight
names of each layer come from the graph's ops, and a graph it does not run is refused naming what
(before anything is allocated)."""

import dataclasses

import pytest

from zoi.backends.cuda.generate import generate_layers
from zoi.errors import BackendUnavailableError
from zoi.frontend.spec import ModelSpec
from zoi.graph.build_decoder import build_generate

BASE = ModelSpec(
    arch="qwen3",
    vocab_size=97,
    hidden=48,
    layers=3,
    heads=4,
    intermediate=80,
    max_positions=64,
    eps=1e-6,
    act="silu",
    pooling="last",
    kv_heads=2,
    head_size=16,
    norm="rmsnorm",
    causal=True,
    qk_norm=True,
)


def test_layers_read_from_the_graph():
    g = generate_layers(build_generate(BASE))
    assert len(g["layers"]) == BASE.layers
    for i, L in enumerate(g["layers"]):
        assert (L["ln1"], L["qkv"], L["o"], L["ln2"], L["gu"], L["down"]) == (
            f"l{i}.ln1.w",
            f"l{i}.qkv.w",
            f"l{i}.o.w",
            f"l{i}.ln2.w",
            f"l{i}.ffn1.w",
            f"l{i}.ffn2.w",
        )
        assert (L["q_norm"], L["k_norm"]) == (f"l{i}.q_norm", f"l{i}.k_norm")
        assert L["rope"] == ("rope.g.cos", "rope.g.sin")
    assert (g["embed"], g["final_ln"], g["lm"], g["eps"]) == (
        "embed.word",
        "final_ln.w",
        "lm_head.w",
        1e-6,
    )
    plain = generate_layers(build_generate(dataclasses.replace(BASE, qk_norm=False)))
    assert plain["layers"][0]["q_norm"] is None


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(act="gelu_tanh"), "'gelu_tanh' gating"),
        (dict(sandwich=True), "op 6 of the graph is 'add_layernorm' where 'linear'"),
        (dict(rms=False), "LayerNorm"),
        (dict(window=8), "a sliding window"),
    ],
)
def test_graphs_it_does_not_run_are_refused_by_name(change, match):
    spec = {k: v for k, v in change.items() if k in ("act", "sandwich")}
    g = build_generate(dataclasses.replace(BASE, **spec))
    if "rms" in change:  # a LayerNorm in place of the second layer's first RMSNorm
        next(o for o in g.ops if o.weights.get("w") == "l1.ln1.w").attrs["rms"] = False
    if "window" in change:  # attention attributes build_generate itself refuses
        next(o for o in g.ops if o.kind == "attention").attrs["window"] = 8
    with pytest.raises(BackendUnavailableError, match=match) as e:
        generate_layers(g)
    assert "device='cpu'" in str(e.value)
