"""The IR and ModelSpec name what zoi runs, and refuse anything else."""

from __future__ import annotations

import pytest

from zoi.frontend.spec import SUPPORTED_ACTS, SUPPORTED_POOLING, ModelSpec
from zoi.graph.build import build_graph
from zoi.graph.ir import ACTS, OP_KINDS, Op
from zoi.graph.synthetic import synthetic_spec


@pytest.mark.parametrize("act", SUPPORTED_ACTS)
@pytest.mark.parametrize("pooling", SUPPORTED_POOLING)
def test_the_builder_emits_only_ir_ops(act, pooling):
    g = build_graph(synthetic_spec(act=act, pooling=pooling))
    assert {o.kind for o in g.ops} == set(OP_KINDS) - {"glu"}  # glu: ModernBERT (tests/archs)
    assert {o.attrs["act"] for o in g.linears()} <= set(ACTS)


@pytest.mark.parametrize("kind", ["normalize", "layernorm", "Linear", ""])
def test_an_op_outside_the_ir_is_refused(kind):
    with pytest.raises(ValueError, match="unknown op kind"):
        Op(kind, ["x"], "y")


def test_a_linear_with_an_unknown_activation_is_refused():
    Op("linear", ["x"], "y", {"w": "l0.o.w"}, {"act": "sigmoid"})
    with pytest.raises(ValueError, match="unknown activation 'swish'"):
        Op("linear", ["x"], "y", {"w": "l0.o.w"}, {"act": "swish"})


@pytest.mark.parametrize("field, value", [("act", "swish"), ("pooling", "last")])
def test_a_spec_zoi_cannot_run_is_refused(field, value):
    ok = synthetic_spec()
    with pytest.raises(ValueError, match=f"ModelSpec.{field} {value!r} is not supported"):
        ok.replace(**{field: value})
    with pytest.raises(ValueError, match="is not supported"):
        ModelSpec.from_dict({**ok.to_dict(), field: value})
