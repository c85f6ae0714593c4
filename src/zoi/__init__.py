"""ZeroOverhead-Inference: compile a Hugging Face encoder once, run it with zoi's own kernels."""

from __future__ import annotations

from zoi._version import __version__
from zoi.api import compile, load  # noqa: A004 - the public names, as torch.compile
from zoi.errors import ZoiError

__all__ = ["ZoiError", "Engine", "compile", "load", "__version__"]


def __getattr__(name: str):  # lazy: `import zoi` stays cheap
    if name == "Engine":
        from zoi.engine import Engine

        return Engine
    raise AttributeError(name)
