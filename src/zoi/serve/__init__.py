"""`zoi serve`: an HTTP server with dynamic batching in front of one Engine.

Routes: OpenAI `/v1/embeddings`, TEI `/embed` `/tokenize` `/health` `/info`, KServe v2 /
Open Inference Protocol `/v2/...` (with Triton's binary tensor extension), `/metrics`.
See docs/SERVE.md.
"""

from __future__ import annotations

from zoi.serve.config import ServeConfig

__all__ = ["ServeConfig", "Service", "create_app"]


def __getattr__(name: str):  # lazy: importing zoi.serve needs no web stack
    if name == "Service":
        from zoi.serve.service import Service

        return Service
    if name == "create_app":
        from zoi.serve.app import create_app

        return create_app
    raise AttributeError(name)
