"""The pieces the OpenAPI documents of zoi.serve.openapi and zoi.serve.openapi_heads are built
from: request and error schemas, and one entry per kind of route (GET, POST, probe, plain)."""

from __future__ import annotations


def _inputs(vocab: int | None) -> dict:
    """A text, texts, one sequence of token ids or several: what `input`/`inputs` accept
    (an empty text or list is a 400, a token id outside the vocabulary a 422)."""
    tid = {"type": "integer", "minimum": 0}
    if vocab:
        tid["maximum"] = vocab - 1
    text = {"type": "string", "minLength": 1}
    ids = {"type": "array", "minItems": 1, "items": tid, "description": "one sequence of ids"}
    return {
        "oneOf": [
            text,
            {"type": "array", "minItems": 1, "items": text},
            ids,
            {"type": "array", "minItems": 1, "items": {**ids, "description": "id sequences"}},
        ]
    }


_ERROR = {
    "type": "object",
    "properties": {"error": {"type": "string"}, "error_type": {"type": "string"}},
}
_OPENAI_ERROR = {
    "type": "object",
    "properties": {
        "error": {
            "type": "object",
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
        }
    },
}
_TENSOR = {
    "type": "object",
    "required": ["name", "datatype", "shape"],
    "properties": {
        "name": {"type": "string", "examples": ["TEXT"]},
        "datatype": {"type": "string", "enum": ["BYTES", "INT32", "INT64"]},
        "shape": {"type": "array", "items": {"type": "integer"}},
        "data": {"type": "array"},
        "parameters": {"type": "object"},
    },
}


def _json(schema: dict, example=None) -> dict:
    c: dict = {"schema": schema}
    if example is not None:
        c["example"] = example
    return {"content": {"application/json": c}}


def _errors(schema=_ERROR) -> dict:
    """Every status a POST route answers besides 200 (zoi.serve.http.STATUS)."""
    return {
        code: {"description": what, **_json(schema)}
        for code, what in (
            ("400", "an empty input, or a well-formed but unusable value (e.g. dimensions)"),
            ("404", "unknown model name"),
            ("408", "the body did not arrive within --body-timeout"),
            (
                "413",
                "too many inputs, too large a body, or an answer over --max-output-floats",
            ),
            ("422", "invalid request (the message names the field and the fix)"),
            ("429", "too many requests in flight (--max-concurrent-requests); Retry-After"),
            ("500", "the engine failed for this request"),
            ("503", "the server is shutting down; Retry-After"),
        )
    }


def _param(name: str, schema: dict) -> dict:
    return {"name": name, "in": "path", "required": True, "schema": schema}


def _get(
    summary: str,
    tag: str,
    schema: dict | None = None,
    params: list[dict] | None = None,
    not_found: dict | None = None,
) -> dict:
    """A GET answering JSON; with `params`, a 404 (body `not_found`) for an unknown name."""
    op: dict = {
        "summary": summary,
        "tags": [tag],
        "responses": {"200": {"description": "OK", **_json(schema or {"type": "object"})}},
    }
    if params:
        op["parameters"] = params
        op["responses"]["404"] = {
            "description": "unknown model (or version)",
            **_json(not_found or _ERROR),
        }
    return {"get": op}


def _post(
    summary: str,
    tag: str,
    body: dict,
    example,
    resp: dict,
    errors: dict | None = None,
    params: list[dict] | None = None,
    ok: str = "OK",
    also: dict | None = None,
) -> dict:
    """A POST of a JSON body answering JSON `resp` (or the media types of `also` too), and the
    error statuses `errors` (default _errors())."""
    op: dict = {"summary": summary, "tags": [tag]}
    if params:
        op["parameters"] = params
    op["requestBody"] = {"required": True, **_json(body, example)}
    content = {"application/json": {"schema": resp}, **(also or {})}
    op["responses"] = {
        "200": {"description": ok, "content": content},
        **(_errors() if errors is None else errors),
    }
    return {"post": op}


def _plain(summary: str, tag: str, media: str) -> dict:
    """A GET answering a text body of `media` (metrics, the docs page)."""
    return {
        "get": {
            "summary": summary,
            "tags": [tag],
            "responses": {
                "200": {"description": "OK", "content": {media: {"schema": {"type": "string"}}}}
            },
        }
    }


def _probe(summary: str, tag: str, params: list[dict] | None = None) -> dict:
    """A health probe: 200 with no body when ready, 503 when not (a JSON reason where the
    route gives one; KServe's model ready gives none)."""
    op: dict = {
        "summary": summary,
        "tags": [tag],
        "responses": {
            "200": {"description": "ready (no body)"},
            "503": {"description": "not ready, or cannot admit work", **_json(_ERROR)},
        },
    }
    if params:  # KServe model ready: a status, no body, either way
        op["parameters"] = params
        op["responses"]["503"] = {"description": "not ready (no body)"}
        op["responses"]["404"] = {"description": "unknown model (or version)", **_json(_ERROR)}
    return {"get": op}
