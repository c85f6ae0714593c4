"""ZeroOverhead-Inference: compile a Hugging Face encoder once, run it with zoi's own kernels."""

from __future__ import annotations

from zoi.errors import ZoiError

__version__ = "0.1.0"

__all__ = ["ZoiError", "Engine", "compile", "load", "__version__"]


def __getattr__(name: str):  # lazy: `import zoi` stays cheap
    if name in ("Engine", "compile", "load"):
        from zoi import engine

        return getattr(engine, name)
    raise AttributeError(name)
