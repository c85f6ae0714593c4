"""The ASGI application: every route, /metrics, JSON errors, and a lifespan that drains on exit."""

from __future__ import annotations

import contextlib
import logging

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Route

from zoi.serve import routes_cohere, routes_heads, routes_kserve, routes_openai, routes_tei
from zoi.serve.batcher import Batcher, balance_on
from zoi.serve.http import json_response
from zoi.serve.service import Service

log = logging.getLogger("zoi.serve")


def create_app(service: Service) -> Starlette:
    if getattr(service, "is_decoder", False):  # a decoder: the generate routes
        from zoi.serve.routes_generate import create_decoder_app

        return create_decoder_app(service)
    apply_batch_balance(service)

    async def metrics(request: Request):
        data, ctype = service.metrics.render()
        return Response(data, media_type=ctype)

    async def root(request: Request):
        return json_response(
            {
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
        )

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

    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        # uvicorn has stopped accepting and waited for in-flight requests; drain what is left.
        log.info("zoi serve: shutting down, answering what is queued")
        service.close()

    spec: dict = {}

    def openapi_doc() -> dict:
        if not spec:
            from zoi._version import __version__
            from zoi.serve.openapi import document

            spec.update(
                document(
                    service.model_name,
                    service.engine.spec.hidden,
                    __version__,
                    [r.path for r in routes],
                    service.vocab_size,
                    getattr(service.engine, "head", ""),
                )
            )
        return spec

    async def openapi_json(request: Request):
        return json_response(openapi_doc())

    async def docs(request: Request):
        from zoi.serve.openapi import docs_html

        return HTMLResponse(docs_html(openapi_doc()))

    routes = [
        Route("/", root, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/openapi.json", openapi_json, methods=["GET"]),
        Route("/docs", docs, methods=["GET"]),
    ]
    routes += routes_openai.make_routes(service)
    routes += routes_tei.make_routes(service)
    routes += routes_cohere.make_routes(service)
    routes += routes_kserve.make_routes(service)
    routes += routes_heads.make_routes(
        service
    )  # /rerank /predict /embed_sparse /embed_all /v1/rerank
    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={HTTPException: http_error, Exception: server_error},
    )
    app.state.service = service
    return app


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
