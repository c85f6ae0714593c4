"""The ASGI application: every route, /metrics, JSON errors, and a lifespan that drains on exit."""

from __future__ import annotations

import logging

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request

from zoi.serve import routes_cohere, routes_heads, routes_kserve, routes_openai, routes_tei
from zoi.serve.batcher import Batcher, balance_on
from zoi.serve.http import assemble_app, json_response
from zoi.serve.service import Service

log = logging.getLogger("zoi.serve")


def create_app(service: Service) -> Starlette:
    if getattr(service, "is_decoder", False):  # a decoder: the generate routes
        from zoi.serve.routes_generate import create_decoder_app

        return create_decoder_app(service)
    apply_batch_balance(service)

    def root(paths: list[str]) -> dict:
        return {
            "name": "zoi",
            "model": service.model_name,
            "routes": [
                "/v1/embeddings",
                "/v2/embed",
                "/embed",
                "/tokenize",
                "/health",
                "/info",
                "/v2",
                f"/v2/models/{service.model_name}/infer",
                "/metrics",
                "/openapi.json",
                "/docs",
            ],
        }

    async def http_error(request: Request, exc: HTTPException):
        if exc.status_code == 404 and request.url.path in routes_heads.ALL:
            return routes_heads.absent(service, request.url.path)  # names the model's head
        return json_response(
            {"error": exc.detail, "error_type": "Validation"},
            exc.status_code,
            headers=getattr(exc, "headers", None),
        )

    async def server_error(request: Request, exc: Exception):
        log.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
        return json_response(
            {"error": f"internal error: {type(exc).__name__}: {exc}", "error_type": "Backend"}, 500
        )

    def openapi(paths: list[str]) -> dict:
        from zoi._version import __version__
        from zoi.serve.openapi import document

        return document(
            service.model_name,
            service.engine.spec.hidden,
            __version__,
            paths,
            service.vocab_size,
            getattr(service.engine, "head", ""),
        )

    routes = routes_openai.make_routes(service)
    routes += routes_tei.make_routes(service)
    routes += routes_cohere.make_routes(service)
    routes += routes_kserve.make_routes(service)
    # /rerank /predict /embed_sparse /embed_all /v1/rerank
    routes += routes_heads.make_routes(service)
    return assemble_app(
        service,
        routes,
        root,
        openapi,
        http_error,
        server_error,
        "zoi serve: shutting down, answering what is queued",
    )


def apply_batch_balance(service: Service) -> bool:
    """--batch-balance on the service's batchers (embeddings, task heads); returns whether
    they balance. Set here, where every way of serving a Service passes (zoi serve, several
    models, Ray replicas), before the first request."""
    cfg = service.config
    on = balance_on(
        getattr(cfg, "batch_balance", "auto"),
        str(service.engine.device),
        len(service.engines),
        cfg.max_queue_delay_us,
    )
    heads = getattr(service, "heads", None)
    for b in (service.batcher, getattr(heads, "batcher", None)):
        if isinstance(b, Batcher):
            b.balance = on
    return on
