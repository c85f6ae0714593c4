"""Fixtures of the bench tests: the real MiniLM folder (skips when it is not installed)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def model_dir():
    from zoi.bench.models import minilm_path

    try:
        return minilm_path()
    except RuntimeError as e:
        pytest.skip(str(e))
