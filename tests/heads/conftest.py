"""Fixtures of the head tests: random-init checkpoints built once per session."""

from __future__ import annotations

import pytest
from tests.conftest import build_hf_model, save_checkpoint
from tests.heads.builders import head_checkpoint


@pytest.fixture(scope="session")
def head_ckpts(tmp_path_factory):
    """(arch, task, labels, seed, vocab) -> (folder, transformers model), built once per
    session (vocab: "minilm" or "small", tests.heads.builders.head_checkpoint)."""
    cache: dict = {}

    def get(arch: str, task: str, num_labels: int = 3, seed: int = 0, vocab: str = "minilm"):
        key = (arch, task, num_labels, seed, vocab)
        if key not in cache:
            d = tmp_path_factory.mktemp(f"{arch}-{task}-{num_labels}-{vocab}")
            cache[key] = head_checkpoint(d, arch, task, num_labels, seed, vocab)
        return cache[key]

    return get


@pytest.fixture(scope="session")
def small_bert_path(tmp_path_factory):
    return save_checkpoint(build_hf_model("bert"), tmp_path_factory.mktemp("emb"), pooling="mean")
