"""The native engine on the real all-MiniLM-L6-v2 (bundled weights), FP32, through the public API."""

from __future__ import annotations

import numpy as np
import pytest

import zoi


def _sentences(n: int) -> list[str]:
    from pathlib import Path

    p = Path(zoi.__file__).parent / "data" / "eval.txt"
    lines = [ln.strip() for ln in p.read_text(encoding="utf-8").splitlines() if ln.strip()]
    return lines[:n]


def test_real_minilm_fp32_cpu_matches_reference():
    try:
        cpu = zoi.compile(device="cpu", precision="fp32", max_tokens=512)
    except Exception as e:  # the bundled model package is part of the project's install
        pytest.fail(f"cannot load the bundled model: {e}")
    ref = zoi.compile(device="reference", precision="fp32", max_tokens=512)
    texts = _sentences(48) + ["hello", "", "word " * 300]
    a = cpu.encode(texts, batch_size=16)
    b = ref.encode(texts, batch_size=16)
    assert a.shape == b.shape and np.isfinite(a).all()
    assert np.abs(a - b).max() <= 1e-5
    assert cpu.memory()["isa"] == zoi._cpu.active_isa()
