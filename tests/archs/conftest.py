"""tests/archs/test_cuda_archs.py runs Triton kernels: through the interpreter on the CPU unless
ZOI_TRITON_COMPILED=1 (tests/triton_mode.py)."""

import pytest
from tests import triton_mode

triton_mode.select()


@pytest.fixture(scope="session")
def arch_ckpts(tmp_path_factory):
    """(arch, seed, pooling, **config overrides) -> (transformers model, folder), built once per
    session (tests.archs.helpers.checkpoint); tests must not change them (copy the folder)."""
    from tests.archs.helpers import checkpoint

    cache: dict = {}

    def get(arch: str, seed: int = 0, pooling: str | None = "mean", **kw):
        key = (arch, seed, pooling, repr(sorted(kw.items())))  # values may be dicts (RoPE)
        if key not in cache:
            d = tmp_path_factory.mktemp(f"{arch}-{seed}")
            cache[key] = checkpoint(arch, d, seed=seed, pooling=pooling, **kw)
        return cache[key]

    return get


def pytest_configure(config):
    triton_mode.configure(config)
