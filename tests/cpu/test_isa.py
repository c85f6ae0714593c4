"""ISA dispatch of the native CPU kernels (each kernel per ISA: tests/ops/)."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import supported_isas

from zoi import _cpu

ISAS = supported_isas()


def test_isa_dispatch():
    assert _cpu.active_isa() in ISAS
    assert "scalar" in ISAS
    for isa in ISAS:
        lay = _cpu.kernel_layout(isa)
        assert lay["isa"] == isa and lay["i8_kgroup"] == 4
    with pytest.raises(ValueError):
        _cpu.kernel_layout("sse9")


def test_unsupported_isa_is_refused():
    missing = [i for i in ("amx", "vnni", "avx512", "avxvnni", "avx2") if not _cpu.isa_supported(i)]
    for isa in missing:
        with pytest.raises(ValueError):
            _cpu.kernel_layout(isa)
    with pytest.raises(ValueError):
        _cpu.k_activation(np.zeros(3, np.float32), "swish", "")
