"""Session fixture: the decoder checkpoints of dec_helpers.MODELS, built once."""

from __future__ import annotations

import pytest

from zoi.decoder.synthetic import write_decoder

from .dec_helpers import MODELS


@pytest.fixture(scope="session")
def ckpt(tmp_path_factory):
    made = {}

    def get(name: str):
        if name not in made:
            made[name] = write_decoder(tmp_path_factory.mktemp(name), **MODELS[name])
        return made[name]

    return get

