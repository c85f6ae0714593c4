"""Session fixture: the decoder checkpoints of dec_helpers.MODELS, built once."""

from __future__ import annotations

import pytest

from .dec_helpers import decoder_checkpoint


@pytest.fixture(scope="session")
def ckpt(tmp_path_factory):
    return lambda name: decoder_checkpoint(tmp_path_factory, name)
