"""/openapi.json and /docs: an OpenAPI 3.1 description of every route of `zoi serve`.

The description is written here by hand (the routes parse JSON themselves, there are no
models to derive it from) and checked against the app's routes by the tests: a route without
an entry in OPERATIONS is a test failure. /docs is a self-contained HTML page made from the
same document (no script or stylesheet from a CDN: the server may have no internet); any
OpenAPI viewer (Swagger UI, Redoc) can load /openapi.json.
"""

from __future__ import annotations

import html
import json

from zoi.serve.openapi_parts import (
    _OPENAI_ERROR,
    _TENSOR,
    _errors,
    _get,
    _inputs,
    _json,
    _param,
    _plain,
    _post,
    _probe,
)

# a model with task adapters (jina-embeddings-v3's LoRA): the adapter of the request's texts
_TASK = {
    "type": "string",
    "description": "the task adapter of every input (a model with task adapters, e.g. "
    "jina-embeddings-v3: retrieval.query, retrieval.passage, separation, classification, "
    "text-matching); its instruction goes before each text unless prompt_name is given",
}
_PROMPT_NAME = {
    "type": "string",
    "description": "one of the model's prompts (config_sentence_transformers.json); "
    "default: its default_prompt_name",
}


def operations(
    model: str, hidden: int, vocab: int | None = None, head: str = "", extra: tuple = ()
) -> dict[str, dict]:
    """Path -> path item, for every route of create_app (paths as Starlette writes them);
    extra: the multi-vector routes the model registers (openapi_heads.MULTIVECTOR_ROUTES)."""
    vec = {"type": "array", "items": {"type": "number"}, "description": f"{hidden} floats"}
    m_param = _param("model", {"const": model})
    v_param = _param("version", {"const": "1", "description": "the only version"})
    mv = [m_param, v_param]
    openai_body = {
        "type": "object",
        "required": ["input"],
        "properties": {
            "input": _inputs(vocab),
            "model": {"type": "string", "enum": [model], "description": "this server's model"},
            "encoding_format": {"type": "string", "enum": ["float", "base64"]},
            "dimensions": {"type": "integer", "description": f"at most {hidden}"},
            "user": {"type": "string"},
            "prompt_name": _PROMPT_NAME,
            "task": _TASK,
        },
    }
    openai_resp = {
        "type": "object",
        "properties": {
            "object": {"const": "list"},
            "model": {"type": "string"},
            "data": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "object": {"const": "embedding"},
                        "index": {"type": "integer"},
                        "embedding": {"oneOf": [vec, {"type": "string", "format": "base64"}]},
                    },
                },
            },
            "usage": {
                "type": "object",
                "properties": {
                    "prompt_tokens": {"type": "integer"},
                    "total_tokens": {"type": "integer"},
                },
            },
        },
    }
    emb_post = _post(
        "OpenAI embeddings: one vector per input",
        "OpenAI",
        openai_body,
        {"model": model, "input": ["A man is eating food."]},
        openai_resp,
        _errors(_OPENAI_ERROR),
    )
    tei_body = {
        "type": "object",
        "required": ["inputs"],
        "properties": {
            "inputs": _inputs(vocab),
            "normalize": {"type": "boolean", "default": True},
            "truncate": {"type": "boolean", "description": "default: the server's --auto-truncate"},
            "truncation_direction": {"type": "string", "enum": ["Right"]},
            "prompt_name": _PROMPT_NAME,
            "task": _TASK,
        },
    }
    text = {"type": "string", "minLength": 1}
    cohere_body = {
        "type": "object",
        "required": ["texts"],
        "properties": {
            "model": {"type": "string", "enum": [model]},
            "texts": {"type": "array", "minItems": 1, "items": text},
            "input_type": {
                "type": "string",
                "enum": ["search_query", "search_document", "classification", "clustering"],
                "description": "chooses the model's prompt of that name (query, document, ...)",
            },
            "embedding_types": {
                "type": "array",
                "items": {
                    "type": "string",
                    "enum": ["float", "base64", "int8", "uint8", "binary", "ubinary"],
                },
            },
            "output_dimension": {"type": "integer", "description": f"at most {hidden}"},
            "truncate": {"type": "string", "enum": ["END", "NONE"]},
        },
    }
    cohere_error = {"type": "object", "properties": {"message": {"type": "string"}}}
    tokenize_body = {
        "type": "object",
        "required": ["inputs"],
        "properties": {  # texts only (token ids have nothing to tokenise)
            "inputs": {"oneOf": [text, {"type": "array", "minItems": 1, "items": text}]},
            "add_special_tokens": {"type": "boolean", "default": True},
        },
    }
    token = {
        "type": "object",
        "required": ["id", "text", "special", "start", "stop"],
        "properties": {
            "id": {"type": "integer"},
            "text": {"type": "string"},
            "special": {"type": "boolean"},
            "start": {"type": ["integer", "null"], "description": "null for special tokens"},
            "stop": {"type": ["integer", "null"]},
        },
    }
    infer_body = {
        "type": "object",
        "required": ["inputs"],
        "properties": {
            "id": {"type": "string"},
            "inputs": {"type": "array", "minItems": 1, "items": _TENSOR},
            "outputs": {"type": "array", "items": {"type": "object"}},
            "parameters": {"type": "object"},
        },
    }

    def meta(summary: str, params: list[dict]) -> dict:
        return _get(summary, "KServe v2", params=params)

    def ready(summary: str, params: list[dict]) -> dict:
        return _probe(summary, "KServe v2", params)

    def infer(summary: str, params: list[dict]) -> dict:
        return _post(
            summary,
            "KServe v2",
            infer_body,
            {"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [1], "data": ["hello"]}]},
            {"type": "object"},
            params=params,
        )

    # one model's routes, each at /v2/models/{model}S and /v2/models/{model}/versions/{version}S:
    # (S, its entry, its summary, the versioned route's summary)
    infer_what = (
        "KServe v2 inference: TEXT (BYTES) or INPUT_IDS in, EMBEDDING out; "
        "Triton's binary tensor extension accepted and returned"
    )
    kserve_model = (
        ("", meta, "KServe v2 model metadata (inputs, outputs)", "KServe v2 model metadata"),
        ("/ready", ready, "KServe v2 model readiness", "KServe v2 model readiness"),
        ("/config", meta, "the model's Triton-style config", "the model's config"),
        ("/infer", infer, infer_what, infer_what),
    )
    kserve_ops = {}
    for suffix, entry, summary, versioned_summary in kserve_model:
        kserve_ops["/v2/models/{model}" + suffix] = entry(summary, [m_param])
        kserve_ops["/v2/models/{model}/versions/{version}" + suffix] = entry(versioned_summary, mv)
    ops = {
        "/": _get("the server, its model and its routes", "zoi"),
        "/metrics": _plain("Prometheus metrics", "zoi", "text/plain"),
        "/openapi.json": _get("this document", "zoi"),
        "/docs": _plain("this document as a web page", "zoi", "text/html"),
        "/v1/embeddings": emb_post,
        "/embeddings": emb_post,
        "/v1/models": _get("OpenAI model list (this server's one model)", "OpenAI"),
        "/v1/models/{name}": _get(
            "one OpenAI model",
            "OpenAI",
            params=[_param("name", {"type": "string", "examples": [model]})],
            not_found=_OPENAI_ERROR,
        ),
        "/v2/embed": _post(
            "Cohere embed: input_type picks the prompt, embedding_types the formats",
            "Cohere",
            cohere_body,
            {"texts": ["hello"], "input_type": "search_query", "embedding_types": ["float"]},
            {"type": "object", "properties": {"embeddings": {"type": "object"}}},
            _errors(cohere_error),
        ),
        "/embed": _post(
            "TEI embed: an array of vectors, one per input",
            "TEI",
            tei_body,
            {"inputs": ["hello"]},
            {"type": "array", "items": vec},
        ),
        "/tokenize": _post(
            "TEI tokenize: the tokens of each input, with offsets",
            "TEI",
            tokenize_body,
            {"inputs": ["hello"]},
            {"type": "array", "items": {"type": "array", "items": token}},
        ),
        "/health": _probe("TEI health: 200 when ready, 503 when it cannot admit work", "TEI"),
        "/info": _get("TEI info: model id, limits, version", "TEI"),
        "/v2": _get("KServe v2 server metadata", "KServe v2"),
        "/v2/health/live": {
            "get": {
                "summary": "KServe v2 liveness",
                "tags": ["KServe v2"],
                "responses": {"200": {"description": "live (no body)"}},
            }
        },
        "/v2/health/ready": _probe("KServe v2 readiness", "KServe v2"),
        **kserve_ops,
    }
    from zoi.serve.openapi_heads import head_operations

    ops.update(head_operations(head, hidden, extra))  # the routes of the model's head
    return ops


def openapi_path(route_path: str) -> str:
    """Starlette's `{name:path}` convertor syntax as OpenAPI writes a parameter."""
    import re

    return re.sub(r"\{(\w+):\w+\}", r"{\1}", route_path)


def document(
    model: str,
    hidden: int,
    version: str,
    route_paths: list[str],
    vocab: int | None = None,
    head: str = "",
) -> dict:
    from zoi.serve.openapi_heads import MULTIVECTOR_ROUTES

    return _document(
        model,
        version,
        f"Sentence embeddings of {model} ({hidden} dimensions) through "
        "OpenAI-, TEI- and KServe-v2-compatible routes. Options, limits and errors: "
        "docs/SERVE.md.",
        operations(
            model, hidden, vocab, head, tuple(p for p in MULTIVECTOR_ROUTES if p in route_paths)
        ),
        route_paths,
    )


def _document(model: str, version: str, description: str, ops: dict, route_paths) -> dict:
    """The OpenAPI document of the served routes (one not in `ops`: undocumented)."""
    paths = {}
    for rp in route_paths:
        p = openapi_path(rp)
        paths[p] = ops.get(p) or _get("(undocumented route)", "zoi")
    return {
        "openapi": "3.1.0",
        "info": {"title": f"zoi serve: {model}", "version": version, "description": description},
        "paths": paths,
    }


def docs_html(doc: dict) -> str:
    """The document as a plain page: each route, its summary, its request example."""
    e = html.escape
    rows = []
    for path, item in doc["paths"].items():
        for method, op in item.items():
            if method == "parameters":
                continue
            body = op.get("requestBody", {}).get("content", {}).get("application/json", {})
            ex = (
                f"<pre>{e(json.dumps(body['example'], indent=1))}</pre>"
                if "example" in body
                else ""
            )
            rows.append(
                f"<tr><td><code>{e(method.upper())}</code></td><td><code>{e(path)}</code></td>"
                f"<td>{e(op.get('summary', ''))}{ex}</td></tr>"
            )
    info = doc["info"]
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>{e(info['title'])}</title>"
        "<style>body{font-family:sans-serif;margin:2em}td{vertical-align:top;padding:4px 12px;"
        "border-bottom:1px solid #ddd}pre{margin:4px 0;background:#f6f6f6}</style></head><body>"
        f"<h1>{e(info['title'])}</h1><p>{e(info['description'])}</p>"
        "<p>Machine-readable: <a href='/openapi.json'>/openapi.json</a> (OpenAPI 3.1; load it "
        "in Swagger UI or Redoc).</p>"
        "<table><tr><th>method</th><th>path</th><th>what</th></tr>"
        + "".join(rows)
        + "</table></body></html>"
    )


# ---- decoders: the routes of a server whose model generates text --------------------


def _gen_errors() -> dict:
    """The statuses of /v1/completions and /v1/chat/completions besides 200 (OpenAI's shape)."""
    return {
        code: {"description": what, **_json(_OPENAI_ERROR)}
        for code, what in (
            ("400", "invalid request: the message names the field (error.param) and the fix"),
            ("404", "unknown model name"),
            ("408", "the body did not arrive within --body-timeout"),
            ("413", "too large a body or prompt"),
            ("429", "too many requests in flight (--max-concurrent-requests); Retry-After"),
            ("500", "the model failed for this request"),
            (
                "503",
                "the waiting queue is full (--max-waiting-requests) or the server is "
                "shutting down; Retry-After",
            ),
        )
    }


def _sampling_props(chat: bool) -> dict:
    num = {"type": "number"}
    props = {
        "model": {"type": "string", "description": "this server's model (optional)"},
        "max_tokens": {
            "type": ["integer", "null"],
            "minimum": 1,
            "description": "new tokens at most (default min(256, context left))",
        },
        "temperature": {
            **num,
            "minimum": 0,
            "maximum": 2,
            "default": 1,
            "description": "0: greedy",
        },
        "top_p": {**num, "exclusiveMinimum": 0, "maximum": 1, "default": 1},
        "top_k": {"type": "integer", "minimum": -1, "description": "extension; 0 or -1: off"},
        "seed": {"type": "integer", "description": "same seed, prompt and parameters: same text"},
        "stop": {
            "oneOf": [
                {"type": "string", "minLength": 1},
                {"type": "array", "maxItems": 16, "items": {"type": "string", "minLength": 1}},
                {"type": "null"},
            ],
            "description": "stop strings (not part of the text)",
        },
        "stream": {
            "type": "boolean",
            "default": False,
            "description": "server-sent events, OpenAI's chunks, then data: [DONE]",
        },
        "stream_options": {
            "type": "object",
            "properties": {"include_usage": {"type": "boolean"}},
            "description": "only with stream: true",
        },
        "n": {"const": 1, "description": "one choice per request"},
        "stop_token_ids": {
            "type": "array",
            "items": {"type": "integer", "minimum": 0},
            "description": "extension: token ids that end the text",
        },
        "ignore_eos": {"type": "boolean", "description": "extension"},
        "user": {"type": "string"},
    }
    if chat:
        props["max_completion_tokens"] = {"type": ["integer", "null"], "minimum": 1}
    return props


def decoder_operations(model: str) -> dict[str, dict]:
    """Path -> path item, for every route of routes_generate.create_decoder_app."""
    usage = {
        "type": "object",
        "required": ["prompt_tokens", "completion_tokens", "total_tokens"],
        "properties": {
            "prompt_tokens": {"type": "integer"},
            "completion_tokens": {"type": "integer"},
            "total_tokens": {"type": "integer"},
        },
    }
    finish = {"type": ["string", "null"], "enum": ["stop", "length", None]}
    head = {
        "id": {"type": "string"},
        "created": {"type": "integer"},
        "model": {"type": "string"},
    }

    def response(obj: str, key: str, value: dict) -> dict:
        """A non-streamed answer: one choice whose `key` (text or message) is `value`."""
        return {
            "type": "object",
            "required": ["id", "object", "choices", "usage"],
            "properties": {
                **head,
                "object": {"const": obj},
                "choices": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["index", key, "finish_reason"],
                        "properties": {
                            "index": {"type": "integer"},
                            key: value,
                            "logprobs": {"type": "null"},
                            "finish_reason": finish,
                        },
                    },
                },
                "usage": usage,
            },
        }

    completion = response("text_completion", "text", {"type": "string"})
    chat_resp = response(
        "chat.completion",
        "message",
        {
            "type": "object",
            "properties": {"role": {"const": "assistant"}, "content": {"type": "string"}},
        },
    )
    # OpenAPI 3.1: the schema of an event stream describes one event (schemathesis checks each)
    sse = {
        "text/event-stream": {
            "schema": {
                "type": "object",
                "description": "one server-sent event: data: {chunk}\\n\\n ... data: [DONE]",
                "required": ["data"],
                "properties": {
                    "data": {"type": "string", "description": "a chunk as JSON; [DONE] last"},
                    "event": {"type": "string"},
                    "id": {"type": "string"},
                    "retry": {"type": "integer"},
                },
            }
        }
    }
    tid = {"type": "integer", "minimum": 0}
    comp_body = {
        "type": "object",
        "required": ["prompt"],
        "properties": {
            "prompt": {
                "oneOf": [
                    {"type": "string", "minLength": 1},
                    {"type": "array", "minItems": 1, "items": tid},
                    {
                        "type": "array",
                        "minItems": 1,
                        "maxItems": 1,
                        "items": {"type": "string", "minLength": 1},
                    },
                ]
            },
            **_sampling_props(False),
        },
    }
    message = {
        "type": "object",
        "required": ["role", "content"],
        "properties": {
            "role": {
                "type": "string",
                "enum": ["system", "user", "assistant", "tool", "developer"],
            },
            "content": {
                "oneOf": [
                    {"type": "string"},
                    {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "required": ["type", "text"],
                            "properties": {"type": {"const": "text"}, "text": {"type": "string"}},
                        },
                    },
                ]
            },
            "name": {"type": "string"},
        },
    }
    chat_body = {
        "type": "object",
        "required": ["messages"],
        "properties": {
            "messages": {"type": "array", "minItems": 1, "items": message},
            **_sampling_props(True),
        },
    }

    def post(summary, body, example, resp):
        return _post(
            summary,
            "OpenAI",
            body,
            example,
            resp,
            _gen_errors(),
            ok="OK: JSON, or server-sent events with stream: true",
            also=sse,
        )

    return {
        "/": _get("the server, its model and its routes", "zoi"),
        "/metrics": _plain("Prometheus metrics", "zoi", "text/plain"),
        "/openapi.json": _get("this document", "zoi"),
        "/docs": _plain("this document as a web page", "zoi", "text/html"),
        "/v1/completions": post(
            "OpenAI completions: text after a prompt (continuous batching)",
            comp_body,
            {"model": model, "prompt": "Once upon a time", "max_tokens": 16},
            completion,
        ),
        "/v1/chat/completions": post(
            "OpenAI chat completions: the chat template of the model folder",
            chat_body,
            {"model": model, "messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 16},
            chat_resp,
        ),
        "/v1/models": _get("OpenAI model list (this server's one model)", "OpenAI"),
        "/v1/models/{name}": _get(
            "one OpenAI model",
            "OpenAI",
            params=[_param("name", {"type": "string", "examples": [model]})],
            not_found=_OPENAI_ERROR,
        ),
        "/health": _probe("200 when ready, 503 when it cannot admit work", "zoi"),
    }


def decoder_document(model: str, version: str, route_paths: list[str]) -> dict:
    return _document(
        model,
        version,
        f"Text generation by {model} through OpenAI-compatible routes "
        "(in-flight batching over a paged KV cache). Options, limits and errors: "
        "docs/SERVE.md.",
        decoder_operations(model),
        route_paths,
    )
