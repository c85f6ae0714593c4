"""Memory planner invariants: no two live buffers overlap; the arena is as small as possible."""

from __future__ import annotations

import pytest

from zoi.frontend.spec import ModelSpec
from zoi.graph import build_graph, plan_memory
from zoi.graph.planner import ALIGN, liveness


def spec(**kw) -> ModelSpec:
    base = dict(
        arch="bert",
        vocab_size=100,
        hidden=60,
        layers=3,
        heads=5,
        intermediate=97,
        max_positions=64,
        type_vocab_size=2,
    )
    base.update(kw)
    return ModelSpec(**base)


def peak_live_bytes(plan) -> int:
    """Lower bound for any arena: the largest sum of sizes live at one op."""
    n_ops = max((e for _, e in plan.live.values()), default=-1) + 1
    return max(
        (
            sum(plan.sizes[b] for b, (s, e) in plan.live.items() if s <= i <= e)
            for i in range(n_ops)
        ),
        default=0,
    )


@pytest.mark.parametrize("max_tokens", [1, 7, 128, 4099])
@pytest.mark.parametrize(
    "s",
    [
        spec(),
        spec(hidden=384, heads=12, intermediate=1536, layers=6),
        spec(layers=1, intermediate=13),
    ],
)
def test_no_overlap_and_tight(s, max_tokens):
    g = build_graph(s)
    plan = plan_memory(g, max_tokens, max_batch=max(1, max_tokens // 3))
    live = liveness(g)
    names = list(live)
    for i, a in enumerate(names):
        assert plan.offsets[a] % ALIGN == 0
        assert plan.offsets[a] + plan.sizes[a] <= plan.arena_bytes
        assert plan.sizes[a] >= g.buffers[a].nbytes(max_tokens, plan.max_batch)
        for b in names[i + 1 :]:
            (s1, e1), (s2, e2) = live[a], live[b]
            if s1 <= e2 and s2 <= e1:  # both live at some op: memory must be disjoint
                ra = (plan.offsets[a], plan.offsets[a] + plan.sizes[a])
                rb = (plan.offsets[b], plan.offsets[b] + plan.sizes[b])
                assert ra[1] <= rb[0] or rb[1] <= ra[0], (a, b)
    # no larger than needed: the arena equals the peak of simultaneously live bytes
    assert plan.arena_bytes == peak_live_bytes(plan)
    assert plan.arena_bytes < sum(plan.sizes.values())


def test_op_output_never_aliases_its_inputs():
    g = build_graph(spec())
    plan = plan_memory(g, 33)
    for op in g.ops:
        o = (plan.offsets[op.output], plan.offsets[op.output] + plan.sizes[op.output])
        for name in op.inputs:
            if name in plan.offsets:
                i = (plan.offsets[name], plan.offsets[name] + plan.sizes[name])
                assert o[1] <= i[0] or i[1] <= o[0]


def test_bad_sizes():
    with pytest.raises(ValueError):
        plan_memory(build_graph(spec()), 0)
