"""kserve_heads.output_binary: the one check of a KServe request's `outputs` (embeddings and heads)."""

from __future__ import annotations

import pytest

pytest.importorskip("starlette")

from zoi.serve.http import ApiError  # noqa: E402
from zoi.serve.kserve_heads import output_binary  # noqa: E402


def test_outputs_absent_keep_the_request_default():
    assert output_binary(None, ["EMBEDDINGS"], True) is True
    assert output_binary(None, ["EMBEDDINGS"], False) is False


def test_binary_data_of_an_output_overrides():
    outs = [{"name": "EMBEDDINGS", "parameters": {"binary_data": True}}]
    assert output_binary(outs, ["EMBEDDINGS"], False) is True
    assert output_binary([{"name": "EMBEDDINGS"}], ["EMBEDDINGS"], True) is True


@pytest.mark.parametrize(
    "outs,names,msg",
    [
        ({"name": "X"}, ["EMBEDDINGS"], "outputs should be an array"),
        ([{"name": "X"}], ["EMBEDDINGS"], "unknown output 'X'; the only output is EMBEDDINGS"),
        (["X"], ["A", "B"], "unknown output 'X'; this model's outputs are A, B"),
    ],
)
def test_bad_outputs_are_refused_naming_the_valid_ones(outs, names, msg):
    with pytest.raises(ApiError) as e:
        output_binary(outs, names, False)
    assert msg in str(e.value) or msg in str(getattr(e.value, "message", ""))
