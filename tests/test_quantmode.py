"""QuantMode: one name per INT8 scheme (zoi.graph.quantmode), interchangeable with the strings
artifacts store, mapped to each backend's codes at its edge only."""

from __future__ import annotations

import json

import pytest

from zoi.graph.compiled import LinearQuant
from zoi.graph.quantmode import QuantMode


def test_modes_are_the_stored_strings():
    assert [m.value for m in QuantMode] == ["fp32", "dynamic", "static", "dynamic_asym", "fp8"]
    for m in QuantMode:
        assert m == m.value and hash(m) == hash(m.value) and str(m) == m.value
        assert {m.value: 1}[m] == 1 and {m: 1}[m.value] == 1
    assert json.dumps({"s": QuantMode.STATIC}) == '{"s": "static"}'


def test_kernel_codes_and_parse():
    assert [m.kernel_code for m in QuantMode] == [0, 1, 2, 3, 5]
    assert QuantMode.parse(None) is QuantMode.DYNAMIC
    assert QuantMode.parse("dynamic_asym") is QuantMode.DYNAMIC_ASYM
    with pytest.raises(ValueError, match=r"l0.qkv: unknown INT8 scheme 'int4'.*dynamic_asym"):
        QuantMode.parse("int4", "l0.qkv")
    assert not QuantMode.FLOAT.is_int8 and QuantMode.STATIC.is_int8
    assert not QuantMode.FP8.is_int8 and QuantMode.FP8.quantized and not QuantMode.FLOAT.quantized
    assert QuantMode.parse("fp8") is QuantMode.FP8


def test_linear_quant_holds_a_mode_and_saves_the_string():
    q = LinearQuant("static", 4.0)
    assert q.scheme is QuantMode.STATIC
    d = q.to_dict()
    assert d["scheme"] == "static" and type(d["scheme"]) is str
    assert LinearQuant.from_dict(d).scheme is QuantMode.STATIC
    assert LinearQuant("int4").scheme == "int4"  # left for the loader to reject with context


def test_the_kernels_modes_come_from_the_enum():
    pytest.importorskip("triton")
    from zoi.backends.cuda.kernels.quantize import QMODES

    assert QMODES == {m.value: m.kernel_code for m in QuantMode if m.quantized}
    assert QMODES["fp8"] == 5
