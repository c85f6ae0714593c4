"""HTTP plumbing shared by the routes: errors, bounded body reading, fast JSON, timing headers,
and the app around the routes (assemble_app)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import zlib
from typing import Any

import numpy as np
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Route

log = logging.getLogger("zoi.serve")

try:
    import orjson

    def dumps(obj: Any) -> bytes:
        return orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY)

    def loads(data: bytes) -> Any:
        return orjson.loads(data)

    JSONDecodeError = orjson.JSONDecodeError
except ImportError:  # pragma: no cover - orjson is in the serve extra; stdlib as a fallback

    def _default(o):
        if isinstance(o, np.ndarray):
            return o.tolist()
        if isinstance(o, np.generic):
            return o.item()
        raise TypeError(f"cannot serialise {type(o).__name__}")

    def dumps(obj: Any) -> bytes:
        return json.dumps(obj, default=_default, separators=(",", ":")).encode()

    def loads(data: bytes) -> Any:
        return json.loads(data)

    JSONDecodeError = json.JSONDecodeError

# error kind -> HTTP status (the same for every protocol; only the body's shape differs)
STATUS = {
    "validation": 422,  # malformed JSON, wrong types, unknown fields' values
    "empty": 400,  # no input, or an empty string
    "invalid": 400,  # well-formed but unusable (e.g. unsupported `dimensions`)
    "timeout": 408,  # the body did not arrive within --body-timeout
    "too_large": 413,  # body over the payload limit, too many inputs, input over the length cap
    "overloaded": 429,  # too many requests in flight
    "not_found": 404,  # unknown model
    "backend": 500,  # the engine failed on this request
    "unavailable": 503,  # shutting down
}


class ClientGone(Exception):
    """The client closed its connection before its answer was ready."""


class ApiError(Exception):
    def __init__(self, kind: str, message: str, param: str | None = None):
        super().__init__(message)
        self.kind = kind
        self.status = STATUS[kind]
        self.message = message
        self.param = param


RETRY_AFTER_S = "1"  # seconds a client told 429 / 503 waits before it tries again


def error_headers(e: ApiError) -> dict | None:
    """A request whose body timed out is answered and its connection closed (the rest of its
    body may still be on the way). 429 and 503 say when to try again (Retry-After), as the
    decoder routes do, so clients back off instead of retrying at once."""
    if e.kind == "timeout":
        return {"connection": "close"}
    if e.status in (429, 503):
        return {"retry-after": RETRY_AFTER_S}
    return None


def json_response(obj: Any, status: int = 200, headers: dict | None = None) -> Response:
    return Response(dumps(obj), status_code=status, headers=headers, media_type="application/json")


async def read_body(request: Request, limit: int, timeout: float | None = None) -> bytes:
    """The request body, at most `limit` bytes (after decompression), else ApiError 413;
    all of it within `timeout` seconds, else ApiError 408. Routes read the body before they
    take a request slot, so a client that stalls mid-body never holds one."""
    try:
        if timeout is None:
            return await _read_body(request, limit)
        return await asyncio.wait_for(_read_body(request, limit), timeout)
    except ClientDisconnect:
        raise ClientGone() from None
    except asyncio.TimeoutError:
        raise ApiError(
            "timeout",
            f"the request body did not arrive within {timeout:g} s (--body-timeout)",
        ) from None


async def _read_body(request: Request, limit: int) -> bytes:
    cl = request.headers.get("content-length")
    if cl is not None:
        try:
            declared = int(cl)
        except ValueError:
            raise ApiError("validation", f"bad Content-Length {cl!r}") from None
        if declared > limit:
            # Read (and drop) a bounded amount so the client sees our answer instead of a reset.
            if declared <= max(4 * limit, 64 << 20):
                async for _ in request.stream():
                    pass
            raise ApiError(
                "too_large",
                f"request body of {declared} bytes is over the payload limit of "
                f"{limit} bytes (--payload-limit / ZOI_PAYLOAD_LIMIT)",
            )
    chunks = []
    n = 0
    over = False
    async for chunk in request.stream():
        n += len(chunk)
        if n > limit:
            over = True  # keep draining, bounded, then answer 413
            if n > max(4 * limit, 64 << 20):
                break
            continue
        chunks.append(chunk)
    if over:
        raise ApiError(
            "too_large",
            f"request body is over the payload limit of {limit} bytes "
            "(--payload-limit / ZOI_PAYLOAD_LIMIT)",
        )
    body = b"".join(chunks)
    enc = (request.headers.get("content-encoding") or "").lower().strip()
    if enc in ("gzip", "deflate"):
        d = zlib.decompressobj(wbits=31 if enc == "gzip" else 15)
        try:
            out = d.decompress(body, limit + 1)
        except zlib.error as e:
            raise ApiError("validation", f"body is not valid {enc} data ({e})") from None
        if len(out) > limit or d.unconsumed_tail:
            raise ApiError(
                "too_large", f"decompressed body is over the payload limit of {limit} bytes"
            )
        if not d.eof or d.unused_data:  # zlib stops at the first end; say what it left
            why = (
                f"{len(d.unused_data)} bytes follow its end (a second member or trailing data)"
                if d.eof
                else "it stops before its end and checksum (truncated)"
            )
            raise ApiError(
                "validation",
                f"body is not one complete {enc} stream: {why}; compress the whole body "
                "as a single stream",
            )
        body = out
    elif enc not in ("", "identity"):
        raise ApiError(
            "validation", f"unsupported Content-Encoding {enc!r} (use gzip, deflate or none)"
        )
    return body


def parse_json(body: bytes) -> Any:
    if not body:
        raise ApiError("validation", "request body is empty; expected a JSON object")
    try:
        return loads(body)
    except (JSONDecodeError, ValueError, UnicodeDecodeError) as e:
        raise ApiError("validation", f"request body is not valid JSON ({e})") from None


def timing_headers(t) -> dict[str, str]:
    """TEI-style timing headers, in milliseconds."""
    return {
        "x-tokenization-time": f"{t.tokenize_s * 1e3:.3f}",
        "x-queue-time": f"{t.queue_s * 1e3:.3f}",
        "x-inference-time": f"{t.infer_s * 1e3:.3f}",
        "x-total-time": f"{t.total_s * 1e3:.3f}",
    }


def assemble_app(
    svc, routes: list[Route], root, document, http_error, server_error, closing: str
) -> Starlette:
    """The app of `routes` with / (root(paths)), /metrics, /openapi.json (document(paths),
    built at the first request), /docs, the error handlers, and a lifespan that closes `svc`."""
    spec: dict = {}

    def openapi_doc() -> dict:
        if not spec:
            spec.update(document([r.path for r in every]))
        return spec

    async def root_json(request: Request):
        return json_response(root([r.path for r in every]))

    async def metrics(request: Request):
        data, ctype = svc.metrics.render()
        return Response(data, media_type=ctype)

    async def openapi_json(request: Request):
        return json_response(openapi_doc())

    async def docs(request: Request):
        from zoi.serve.openapi import docs_html

        return HTMLResponse(docs_html(openapi_doc()))

    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        # uvicorn has stopped accepting and waited for in-flight requests; drain what is left.
        log.info(closing)
        svc.close()

    every = [
        Route("/", root_json, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/openapi.json", openapi_json, methods=["GET"]),
        Route("/docs", docs, methods=["GET"]),
        *routes,
    ]
    app = Starlette(
        routes=every,
        lifespan=lifespan,
        exception_handlers={HTTPException: http_error, Exception: server_error},
    )
    app.state.service = svc
    return app
