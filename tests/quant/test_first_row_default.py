"""The first-row residual's default follows the device zoi.compile builds for: on for the CPU
(and the reference), off for "cuda"; an explicit setting always wins (engine._first_row_default)."""

from __future__ import annotations

import pytest

import zoi
from zoi.engine import _first_row_default
from zoi.quant.config import QuantConfig


@pytest.mark.parametrize("device, on", [("cpu", True), ("reference", True), ("cuda", False)])
def test_unset_follows_the_device(device, on):
    assert _first_row_default(None, device) == {"first_row_residual": on}
    assert _first_row_default({"calibration": "fast"}, device) == {
        "calibration": "fast",
        "first_row_residual": on,
    }
    assert _first_row_default({"first_row_residual": None}, device)["first_row_residual"] is on
    assert _first_row_default(QuantConfig(), device).first_row_residual is on


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("explicit", [True, False])
def test_explicit_setting_wins(device, explicit):
    assert _first_row_default({"first_row_residual": explicit}, device) == {
        "first_row_residual": explicit
    }
    cfg = QuantConfig(first_row_residual=explicit)
    assert _first_row_default(cfg, device) is cfg


def test_the_quantiser_alone_reads_unset_as_off():
    assert QuantConfig().first_row_residual is None


def test_cpu_compile_carries_it_by_default(small_bert):
    calib = ["a short text", "another text with a few more words in it"]
    on = zoi.compile(
        small_bert, device="cpu", max_tokens=64, precision="int8", calibration=calib,
        quant_config={"calibration": "fast"},
    )  # fmt: skip
    off = zoi.compile(
        small_bert, device="cpu", max_tokens=64, precision="int8", calibration=calib,
        quant_config={"calibration": "fast", "first_row_residual": False},
    )  # fmt: skip
    assert any(q.first_row for q in on.model.quant.values())
    assert not any(q.first_row for q in off.model.quant.values())
