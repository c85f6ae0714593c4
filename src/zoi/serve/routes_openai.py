"""OpenAI-compatible POST /v1/embeddings (and GET /v1/models), OpenAI-shaped error bodies."""

from __future__ import annotations

import base64

import numpy as np
from starlette.requests import Request
from starlette.routing import Route

from zoi.serve.handler import Answers, admitted, json_answer
from zoi.serve.http import ApiError, error_headers, json_response, parse_json, timing_headers
from zoi.serve.service import Service, as_json, flat_ids
from zoi.serve.tasks import request_task, tagged, task_prompted

ROUTE = "openai"
_TYPES = {
    400: "invalid_request_error",
    404: "invalid_request_error",
    408: "invalid_request_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "server_error",
}
_CODES = {
    "validation": "invalid_value",
    "empty": "empty_input",
    "invalid": "invalid_value",
    "timeout": "request_timeout",
    "too_large": "input_too_large",
    "overloaded": "rate_limit_exceeded",
    "not_found": "model_not_found",
    "backend": "engine_failure",
    "unavailable": "server_shutting_down",
}


def error_response(e: ApiError):
    body = {
        "error": {
            "message": e.message,
            "type": _TYPES.get(e.status, "invalid_request_error"),
            "param": e.param,
            "code": _CODES.get(e.kind),
        }
    }
    return json_response(body, e.status, headers=error_headers(e))


ANSWERS = Answers(error_response, {"error": {"message": "client went away"}})


def _parse_input(svc: Service, inp):
    """-> ("text", [str]), ("ids", [[int]]) or ("flat", [[int]]): one array of ids sent flat."""
    if isinstance(inp, str):
        return "text", [inp]
    if not isinstance(inp, list):
        raise ApiError(
            "validation",
            "input should be a string, an array of strings, an array of token ids "
            "or an array of arrays of token ids",
            "input",
        )
    if not inp:
        raise ApiError("empty", "input is an empty array", "input")
    if flat_ids(inp):
        return "flat", [inp]
    if all(isinstance(x, str) for x in inp):
        return "text", inp
    if all(isinstance(x, list) for x in inp):
        return "ids", inp
    raise ApiError(
        "validation", "input mixes types; send strings or token id arrays, not both", "input"
    )


# LangChain's OpenAIEmbeddings tokenises with tiktoken by default and sends those ids, which
# belong to another vocabulary: the commonest client to send ids this model never made
IDS_HINT = (
    "LangChain's OpenAIEmbeddings sends tiktoken ids unless built with "
    "check_embedding_ctx_length=False; see docs/CLIENTS.md"
)


def make_routes(svc: Service) -> list[Route]:
    @admitted(svc, ROUTE, ANSWERS)
    async def embeddings(request: Request, raw: bytes, t0: float):
        body = parse_json(raw)
        if not isinstance(body, dict):
            raise ApiError("validation", "request body should be a JSON object")
        if "input" not in body:
            raise ApiError("validation", "missing required field 'input'", "input")
        svc.check_model(body.get("model"))
        fmt = body.get("encoding_format")
        if fmt is None:  # absent or null: the default
            fmt = "float"
        if not isinstance(fmt, str) or fmt not in ("float", "base64"):
            raise ApiError(
                "validation",
                f'encoding_format should be "float" or "base64", got {as_json(fmt)}',
                "encoding_format",
            )
        dims = svc.check_dims(body.get("dimensions"), "dimensions")
        kind, items = _parse_input(svc, body["input"])
        task = request_task(svc, body.get("task"))  # a task adapter (zoi.serve.tasks)
        truncate = svc.config.auto_truncate
        if kind == "text":
            texts = svc.check_texts(items, "input")
            texts = task_prompted(svc, texts, task, body.get("prompt_name"))
            seqs, tok_s = await svc.tokenize(texts, truncate)
        else:
            seqs = svc.check_ids(items, truncate, "input", kind == "flat", IDS_HINT)
            tok_s = 0.0
        res = await svc.embed(request, tagged(seqs, task), True, tok_s, t0)
        emb = res.embeddings
        emb = svc.matryoshka(emb, dims)
        if fmt == "base64":
            rows = [
                base64.b64encode(np.ascontiguousarray(r, "<f4").tobytes()).decode() for r in emb
            ]
        else:
            rows = list(emb)
        data = [{"object": "embedding", "index": i, "embedding": r} for i, r in enumerate(rows)]
        out = {
            "object": "list",
            "data": data,
            "model": svc.model_name,
            "usage": {"prompt_tokens": res.tokens, "total_tokens": res.tokens},
        }
        return await json_answer(out, emb.size, headers=timing_headers(res.timings))

    async def models(request: Request):
        return json_response(
            {
                "object": "list",
                "data": [
                    {"id": svc.model_name, "object": "model", "created": 0, "owned_by": "zoi"}
                ],
            }
        )

    async def model(request: Request):
        name = request.path_params["name"]
        if name != svc.model_name:
            return error_response(
                ApiError("not_found", f"the model {name!r} does not exist", "model")
            )
        return json_response(
            {"id": svc.model_name, "object": "model", "created": 0, "owned_by": "zoi"}
        )

    return [
        Route("/v1/embeddings", embeddings, methods=["POST"]),
        Route("/embeddings", embeddings, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/models/{name:path}", model, methods=["GET"]),
    ]
