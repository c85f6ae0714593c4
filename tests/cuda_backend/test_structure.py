"""The CUDA backend's shape (issue 11): modules of at most ~400 lines, switches passed in as
CudaOptions (no ZOI_* environment read inside the backend; only CudaOptions.from_env at the
engine's edge), shared Triton helpers written once."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from zoi.backends.cuda.options import CudaOptions

CUDA = Path(__file__).resolve().parents[2] / "src" / "zoi" / "backends" / "cuda"
PRODUCT = sorted(p for p in CUDA.glob("*.py") if p.name != "bench.py")


@pytest.mark.parametrize("path", PRODUCT, ids=lambda p: p.name)
def test_backend_modules_are_small(path):
    assert len(path.read_text().splitlines()) <= 400, path.name


@pytest.mark.parametrize("path", PRODUCT + sorted((CUDA / "kernels").glob("*.py")), ids=str)
def test_no_environment_switch_inside_the_backend(path):
    if path.name == "options.py":
        return
    src = path.read_text()
    assert not re.search(r"environ(\.get)?\s*[\[(]\s*['\"]ZOI_", src), path.name


def test_layernorm_and_softmax_written_once():
    """The row LayerNorm / online softmax / rint / activations live in kernels/common.py."""
    for p in (CUDA / "kernels").glob("*.py"):
        if p.name == "common.py":
            continue
        src = p.read_text()
        assert "12582912" not in src, p.name  # rint
        assert "tl.erf(" not in src, p.name  # gelu
        # two-pass LayerNorm (the persistent kernel's chunked one-pass statistics are another
        # algorithm: rows too wide for registers)
        assert not re.search(r"- mean\[:, None\], 0\.0\)", src), p.name
        assert "tl.exp2(m_i - m" not in src, p.name  # online softmax rescale


def test_options_from_env_is_the_only_environment_read():
    assert CudaOptions.from_env({}) == CudaOptions()
    assert CudaOptions.from_env({"ZOI_PERSISTENT": "0"}).persistent == "off"
    assert CudaOptions.from_env({"ZOI_PERSISTENT": "1"}).persistent == "force"
    o = CudaOptions.from_env({"ZOI_PERSISTENT_SPLIT": "1", "ZOI_PERSISTENT_CFG": '{"BK": 64}'})
    assert o.persistent_split is True and o.persistent_cfg == {"BK": 64}
    with pytest.raises(ValueError, match="ZOI_PERSISTENT must be 0 or 1"):
        CudaOptions.from_env({"ZOI_PERSISTENT": "yes"})
    with pytest.raises(ValueError, match="not a JSON object"):
        CudaOptions.from_env({"ZOI_PERSISTENT_CFG": "[1"})
    with pytest.raises(ValueError, match="persistent must be one of"):
        CudaOptions(persistent="sometimes")
    assert CudaOptions().replace(rowq=True, pdl=None) == CudaOptions(rowq=True)
