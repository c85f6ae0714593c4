"""Text Embeddings Inference (TEI) compatible routes: /embed, /tokenize, /health, /info."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from zoi._version import __version__
from zoi.serve.handler import Answers, admitted, json_answer
from zoi.serve.http import ApiError, error_headers, json_response, parse_json, timing_headers
from zoi.serve.service import Service, flat_ids
from zoi.serve.tasks import request_task, tagged, task_prompted

ROUTE = "tei"
_ERROR_TYPES = {
    "validation": "Validation",
    "empty": "Empty",
    "invalid": "Validation",
    "timeout": "Validation",
    "too_large": "Validation",
    "overloaded": "Overloaded",
    "not_found": "Validation",
    "backend": "Backend",
    "unavailable": "Unhealthy",
}


def error_response(e: ApiError):
    return json_response(
        {"error": e.message, "error_type": _ERROR_TYPES.get(e.kind, "Validation")},
        e.status,
        headers=error_headers(e),
    )


ANSWERS = Answers(error_response, {"error": "client went away", "error_type": "Validation"})


def _inputs(body) -> list:
    if not isinstance(body, dict):
        raise ApiError("validation", "request body should be a JSON object with 'inputs'")
    if "inputs" not in body:
        raise ApiError("validation", "missing required field 'inputs'", "inputs")
    inp = body["inputs"]
    if isinstance(inp, str):
        return [inp]
    if isinstance(inp, list):
        return inp
    raise ApiError("validation", "inputs should be a string or an array of strings", "inputs")


def _flag(body: dict, name: str, default: bool) -> bool:
    v = body.get(name)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise ApiError("validation", f"{name} should be true or false", name)
    return v


def make_routes(svc: Service) -> list[Route]:
    @admitted(svc, ROUTE, ANSWERS)
    async def embed(request: Request, raw: bytes, t0: float):
        body = parse_json(raw)
        items = _inputs(body)
        normalize = _flag(body, "normalize", True)
        truncate = _flag(body, "truncate", svc.config.auto_truncate)
        direction = body.get("truncation_direction", "Right")
        if direction not in ("Right", "right"):
            raise ApiError(
                "validation",
                "only truncation_direction 'Right' is supported",
                "truncation_direction",
            )
        task = request_task(svc, body.get("task"))  # a task adapter (zoi.serve.tasks)
        if flat_ids(items):  # one sequence of token ids
            seqs, tok_s = svc.check_ids([items], truncate, "inputs", flat=True), 0.0
        elif items and all(isinstance(x, list) for x in items):
            seqs, tok_s = svc.check_ids(items, truncate, "inputs"), 0.0
        else:
            texts = svc.check_texts(items, "inputs")
            texts = task_prompted(svc, texts, task, body.get("prompt_name"))
            seqs, tok_s = await svc.tokenize(texts, truncate)
        res = await svc.embed(request, tagged(seqs, task), normalize, tok_s, t0)
        emb = res.embeddings
        return await json_answer(list(emb), emb.size, headers=timing_headers(res.timings))

    # it works on the shared tokenizer thread: bounded like /embed; its outcomes have a label of
    # their own (requests = successes + failures per route) and no request_duration (no model)
    @admitted(svc, "tokenize", ANSWERS, timed=False)
    async def tokenize(request: Request, raw: bytes, t0: float):
        body = parse_json(raw)
        texts = svc.check_texts(_inputs(body), "inputs")
        add_special = _flag(body, "add_special_tokens", True)

        def work():
            tok = svc.hf_tokenizer()
            return tok.encode_batch(texts, add_special_tokens=add_special)

        encs = await svc.run_in_tokenizer_thread(work)
        out = []
        for text, enc in zip(texts, encs, strict=True):
            toks = []
            for tid, tstr, (a, b), special in zip(
                enc.ids, enc.tokens, enc.offsets, enc.special_tokens_mask, strict=True
            ):
                sp = bool(special)
                toks.append(
                    {
                        "id": tid,
                        "text": tstr if sp else text[a:b],
                        "special": sp,
                        "start": None if sp else a,
                        "stop": None if sp else b,
                    }
                )
            out.append(toks)
        return json_response(out)

    async def health(request: Request):
        ok, why = svc.can_admit()
        if not ok:
            kind = "Unhealthy" if not svc.ready else "Overloaded"
            return json_response({"error": f"degraded: {why}", "error_type": kind}, 503)
        return Response(status_code=200)

    async def info(request: Request):
        e = svc.engine
        return json_response(
            {
                "model_id": svc.model_name,
                "model_sha": None,
                "model_dtype": svc.dtype,
                "model_type": {"embedding": {"pooling": svc.spec.pooling}},
                "device": svc.device,
                "hidden_size": svc.hidden,
                "normalize_default": True,
                "max_concurrent_requests": svc.config.max_concurrent_requests,
                "max_input_length": svc.max_positions,
                "max_input_chars": svc.max_input_chars,
                "max_output_floats": svc.config.max_output_floats,
                "max_batch_tokens": svc.max_batch_tokens,
                "max_batch_requests": svc.max_batch_requests,
                "max_client_batch_size": svc.config.max_client_batch_size,
                "max_queue_delay_us": svc.config.max_queue_delay_us,
                "payload_limit": svc.config.payload_limit,
                "auto_truncate": svc.config.auto_truncate,
                "tokenization_workers": 1,
                "engine_max_tokens": int(e.max_tokens),
                "version": __version__,
                # several engines: each one's device and figures
                **({"engines": svc.engines_info()} if getattr(svc, "replicated", False) else {}),
            }
        )

    return [
        Route("/embed", embed, methods=["POST"]),
        Route("/tokenize", tokenize, methods=["POST"]),
        Route("/health", health, methods=["GET"]),
        Route("/info", info, methods=["GET"]),
    ]
