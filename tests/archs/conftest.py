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
            carried = _carried(arch, seed, pooling, kw)
            if carried is not None:
                cache[key] = carried
            else:
                d = tmp_path_factory.mktemp(f"{arch}-{seed}")
                cache[key] = checkpoint(arch, d, seed=seed, pooling=pooling, **kw)
        return cache[key]

    return get


def _carried(arch, seed, pooling, kw):
    """A checkpoint written on another machine (scripts/make_carry.sh: .carry/arch-ckpts/<arch>-<seed>),
    used where this machine's transformers cannot write the architecture (the GPU machine's lacks
    GteModel): (None, folder); the tests that compare with transformers itself skip there."""
    import os
    from pathlib import Path

    base = os.environ.get("ZOI_ARCH_CKPTS")
    if not base or kw or pooling != "mean":
        return None
    folder = Path(base) / f"{arch}-{seed}"
    if not (folder / "config.json").is_file():
        return None
    from tests.archs.helpers import PREFIX

    try:
        import transformers

        if hasattr(transformers, PREFIX[arch] + "Model"):
            return None  # this machine writes its own
    except ImportError:
        pass
    return None, folder


def pytest_configure(config):
    triton_mode.configure(config)
