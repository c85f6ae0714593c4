"""OpenAI /v1/completions and /v1/chat/completions on a decoder, and the decoder app.

Requests go through zoi.decoder.scheduler (continuous batching); `stream: true` answers server-sent
events in OpenAI's chunk format (`data: {json}\\n\\n` ..., then `data: [DONE]\\n\\n`), otherwise one
JSON body. Errors have OpenAI's shape ({"error": {"message", "type", "param", "code"}}); a bad
request is a 400 naming the field. A client that leaves (mid-stream or while waiting) cancels its
sequence: its KV blocks are free before the next decode step.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from zoi.decoder.api import SamplingParams
from zoi.decoder.scheduler import AsyncSink, Delta, Finished, Queued, QueueFull, SchedulerClosed
from zoi.errors import InputError
from zoi.serve.decoder_service import DEFAULT_MAX_TOKENS, DecoderService
from zoi.serve.handler import Answers, OwnsSlot, admitted
from zoi.serve.http import ApiError, ClientGone, assemble_app, dumps, json_response, parse_json
from zoi.serve.routes_openai import _CODES, _TYPES

log = logging.getLogger("zoi.serve")

ROUTE = "generate"
MAX_STOPS = 16
RETRY_AFTER_S = "1"
_ROLES = ("system", "user", "assistant", "tool", "developer")


def error_body(e: ApiError, code: str | None = None) -> dict:
    return {
        "error": {
            "message": e.message,
            "type": _TYPES.get(e.status, "invalid_request_error"),
            "param": e.param,
            "code": code or getattr(e, "code", None) or _CODES.get(e.kind),
        }
    }


def error_response(e: ApiError) -> Response:
    headers = {"retry-after": RETRY_AFTER_S} if e.status in (429, 503) else None
    if e.kind == "timeout":
        headers = {"connection": "close"}
    return json_response(error_body(e), e.status, headers=headers)


ANSWERS = Answers(error_response, {"error": {"message": "client went away"}})


def _bad(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    e = ApiError("invalid", message, param)
    e.code = code
    return e


# ---- request parsing ---------------------------------------------------------------------------


def _num(body: dict, name: str, default, lo: float, hi: float, lo_open: bool = False):
    v = body.get(name)
    if v is None:
        return default
    if type(v) not in (int, float) or v != v:
        raise _bad(f"{name} should be a number, got {v!r}", name)
    if v < lo or v > hi or (lo_open and v == lo):
        side = "(" if lo_open else "["
        raise _bad(f"{name}={v!r} is out of range: it must lie in {side}{lo:g}, {hi:g}]", name)
    return float(v)


def _int(body: dict, name: str):
    v = body.get(name)
    if v is not None and type(v) is not int:
        raise _bad(f"{name} should be an integer, got {v!r}", name)
    return v


def _unsupported(body: dict, chat: bool) -> None:
    for name in ("n", "best_of"):
        v = body.get(name)
        if v is not None and v != 1:
            raise _bad(f"{name}={v!r} is not supported: this server makes one choice (n=1)", name)
    for name in ("presence_penalty", "frequency_penalty"):
        v = body.get(name)
        if v is not None and v != 0:
            raise _bad(f"{name} is not supported (send 0 or leave it out)", name)
    if body.get("logit_bias"):
        raise _bad("logit_bias is not supported", "logit_bias")
    if body.get("logprobs") not in (None, False, 0) or body.get("top_logprobs"):
        name = "logprobs" if body.get("logprobs") not in (None, False, 0) else "top_logprobs"
        raise _bad(f"{name} is not supported", name)
    if not chat:
        if body.get("echo"):
            raise _bad("echo is not supported", "echo")
        if body.get("suffix") is not None:
            raise _bad("suffix is not supported", "suffix")
    else:
        for name in ("tools", "functions", "tool_choice", "function_call"):
            if body.get(name) not in (None, [], "none"):
                raise _bad(f"{name} is not supported (no tool calling)", name)
        rf = body.get("response_format")
        if rf is not None and rf != {"type": "text"}:
            raise _bad(
                "response_format other than {'type': 'text'} is not supported", "response_format"
            )


def _stops(body: dict) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise _bad("stop should be a string or an array of strings", "stop")
    if len(stop) > MAX_STOPS:
        raise _bad(f"stop has {len(stop)} strings, over the limit of {MAX_STOPS}", "stop")
    if any(not s for s in stop):
        raise _bad("stop holds an empty string", "stop")
    return tuple(stop)


def _params(svc: DecoderService, body: dict, n_prompt: int, chat: bool) -> SamplingParams:
    max_tokens = _int(body, "max_completion_tokens") if chat else None
    name = "max_completion_tokens"
    if max_tokens is None:
        max_tokens, name = _int(body, "max_tokens"), "max_tokens"
    room = svc.max_seq_len - n_prompt
    if room < 1:
        raise _bad(
            f"this model's maximum context length is {svc.max_seq_len} tokens; the prompt has "
            f"{n_prompt}, leaving no room for new tokens: shorten it",
            "messages" if chat else "prompt",
            "context_length_exceeded",
        )
    if max_tokens is None:
        max_tokens = min(DEFAULT_MAX_TOKENS, room)
    elif max_tokens < 1:
        raise _bad(f"{name} must be at least 1, got {max_tokens}", name)
    elif max_tokens > room:
        raise _bad(
            f"this model's maximum context length is {svc.max_seq_len} tokens; the prompt has "
            f"{n_prompt} and {name} asks for {max_tokens} more; lower {name} to at most {room} "
            "or shorten the prompt",
            name,
            "context_length_exceeded",
        )
    temperature = _num(body, "temperature", 1.0, 0.0, 2.0)
    top_p = _num(body, "top_p", 1.0, 0.0, 1.0, lo_open=True)
    top_k = _int(body, "top_k")
    if top_k is not None and top_k < -1:
        raise _bad(f"top_k must be >= 0 (0 or -1: off), got {top_k}", "top_k")
    seed = _int(body, "seed")
    if seed is not None and not -(2**63) <= seed < 2**64:
        raise _bad("seed must fit in 64 bits", "seed")
    stop_ids = body.get("stop_token_ids")
    if stop_ids is not None and (
        not isinstance(stop_ids, list)
        or not all(type(t) is int and 0 <= t < svc.vocab_size for t in stop_ids)
    ):
        raise _bad(f"stop_token_ids should be token ids in [0, {svc.vocab_size})", "stop_token_ids")
    ignore_eos = body.get("ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        raise _bad("ignore_eos should be a boolean", "ignore_eos")
    return SamplingParams(
        max_new_tokens=int(max_tokens),
        temperature=temperature,
        top_k=max(0, top_k or 0),
        top_p=top_p,
        seed=None if seed is None else seed % 2**63,
        stop=_stops(body),
        stop_token_ids=tuple(stop_ids or ()),
        ignore_eos=ignore_eos,
    )


def _stream_flags(body: dict) -> tuple[bool, bool]:
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise _bad("stream should be a boolean", "stream")
    opts = body.get("stream_options")
    if opts is None:
        return stream, False
    if not isinstance(opts, dict):
        raise _bad("stream_options should be an object", "stream_options")
    if not stream:
        raise _bad("stream_options is only allowed with stream: true", "stream_options")
    inc = opts.get("include_usage", False)
    if not isinstance(inc, bool):
        raise _bad("stream_options.include_usage should be a boolean", "stream_options")
    return stream, inc


async def _prompt_ids(svc: DecoderService, body: dict) -> list[int]:
    if "prompt" not in body:
        raise _bad("missing required field 'prompt'", "prompt")
    p = body["prompt"]
    if isinstance(p, list) and len(p) == 1 and isinstance(p[0], (str, list)):
        p = p[0]  # one prompt in an array
    if isinstance(p, str):
        if not p:
            raise _bad("prompt is an empty string", "prompt")
        return await svc.encode(p)
    if isinstance(p, list) and p and all(type(t) is int for t in p):
        if min(p) < 0 or max(p) >= svc.vocab_size:
            raise _bad(f"prompt holds token ids outside [0, {svc.vocab_size})", "prompt")
        return p
    if isinstance(p, list) and len(p) > 1 and all(isinstance(x, (str, list)) for x in p):
        raise _bad(
            f"prompt holds {len(p)} prompts; this server takes one prompt per request", "prompt"
        )
    raise _bad("prompt should be a non-empty string or array of token ids", "prompt")


def _messages(body: dict) -> list[dict]:
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise _bad("messages should be a non-empty array of {role, content} objects", "messages")
    out = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict):
            raise _bad(f"messages[{i}] should be an object", "messages")
        role = m.get("role")
        if role not in _ROLES:
            raise _bad(
                f"messages[{i}].role should be one of {', '.join(_ROLES)}, got {role!r}", "messages"
            )
        c = m.get("content")
        if isinstance(c, list):  # content parts: text only
            texts = []
            for part in c:
                if (
                    not isinstance(part, dict)
                    or part.get("type") != "text"
                    or not isinstance(part.get("text"), str)
                ):
                    raise _bad(f"messages[{i}].content: only text parts are supported", "messages")
                texts.append(part["text"])
            c = "".join(texts)
        if c is None and role == "assistant":
            c = ""
        if not isinstance(c, str):
            raise _bad(f"messages[{i}].content should be a string or text parts", "messages")
        msg = {"role": role, "content": c}
        if isinstance(m.get("name"), str):
            msg["name"] = m["name"]
        out.append(msg)
    return out


# ---- the routes ---------------------------------------------------------------------------------


class _Chunks:
    """OpenAI's bodies and stream chunks for one request."""

    def __init__(self, svc: DecoderService, chat: bool, include_usage: bool):
        self.chat = chat
        self.include_usage = include_usage
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())
        self.model = svc.model_name

    def _head(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    @staticmethod
    def usage(fin: Finished) -> dict:
        return {
            "prompt_tokens": fin.prompt_tokens,
            "completion_tokens": fin.completion_tokens,
            "total_tokens": fin.prompt_tokens + fin.completion_tokens,
        }

    def body(self, text: str, fin: Finished) -> dict:
        if self.chat:
            choice = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": fin.reason,
            }
            out = self._head("chat.completion")
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": fin.reason}
            out = self._head("text_completion")
        out["choices"] = [choice]
        out["usage"] = self.usage(fin)
        return out

    def chunk(self, text: str | None, finish: str | None = None, role: bool = False) -> bytes:
        if self.chat:
            delta: dict = {}
            if role:
                delta["role"] = "assistant"
            if text is not None:
                delta["content"] = text
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            out = self._head("chat.completion.chunk")
        else:
            choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
            out = self._head("text_completion")
        out["choices"] = [choice]
        if self.include_usage:
            out["usage"] = None
        return b"data: " + dumps(out) + b"\n\n"

    def usage_chunk(self, fin: Finished) -> bytes:
        out = self._head("chat.completion.chunk" if self.chat else "text_completion")
        out["choices"] = []
        out["usage"] = self.usage(fin)
        return b"data: " + dumps(out) + b"\n\n"


def _finish_error(fin: Finished) -> ApiError:
    err = fin.error
    kind = {"invalid": "invalid", "backend": "backend", "unavailable": "unavailable"}.get(
        err.kind, "backend"
    )
    e = ApiError(kind, err.message, "prompt" if kind == "invalid" else None)
    e.code = err.code
    return e


async def _watch_disconnect(receive) -> None:
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            return


async def _next(sink: AsyncSink, watcher: asyncio.Future):
    """The next item, or ClientGone when the client leaves first."""
    if not sink.queue.empty():
        return sink.queue.get_nowait()
    get = asyncio.ensure_future(sink.get())
    await asyncio.wait({get, watcher}, return_when=asyncio.FIRST_COMPLETED)
    if get.done():
        return get.result()
    get.cancel()
    raise ClientGone()


class _SSE(OwnsSlot):
    """The event stream of one generation, as a raw ASGI response (so that a client leaving is
    seen at once, even while the request waits for the pool). It owns the request's slot: it
    releases it and counts the request's outcome when it ends."""

    def __init__(self, svc, gen, sink, watcher, chunks: _Chunks, route: str, t0: float):
        self.svc, self.gen, self.sink, self.watcher = svc, gen, sink, watcher
        self.chunks, self.route, self.t0 = chunks, route, t0

    async def __call__(self, scope, receive, send) -> None:
        c, svc = self.chunks, self.svc
        done = False
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [
                        (b"content-type", b"text/event-stream; charset=utf-8"),
                        (b"cache-control", b"no-cache"),
                        (b"x-accel-buffering", b"no"),
                    ],
                }
            )
            if c.chat:
                await send(
                    {
                        "type": "http.response.body",
                        "body": c.chunk("", role=True),
                        "more_body": True,
                    }
                )
            while True:
                item = await _next(self.sink, self.watcher)
                if isinstance(item, Delta):
                    parts = [item.text]
                    while not self.sink.queue.empty():  # coalesce what is already here
                        nxt = self.sink.queue.get_nowait()
                        if not isinstance(nxt, Delta):
                            item = nxt
                            break
                        parts.append(nxt.text)
                    await send(
                        {
                            "type": "http.response.body",
                            "body": c.chunk("".join(parts)),
                            "more_body": True,
                        }
                    )
                if isinstance(item, Finished):
                    done = True
                    out = []
                    if item.reason == "error":
                        out.append(b"data: " + dumps(error_body(_finish_error(item))) + b"\n\n")
                        svc.metrics.failures.labels(self.route, "stream").inc()
                    else:
                        out.append(c.chunk(None if c.chat else "", finish=item.reason))
                        if c.include_usage:
                            out.append(c.usage_chunk(item))
                        svc.metrics.successes.labels(self.route).inc()
                    out.append(b"data: [DONE]\n\n")
                    await send(
                        {"type": "http.response.body", "body": b"".join(out), "more_body": False}
                    )
                    svc.metrics.request_duration.observe(time.perf_counter() - self.t0)
                    return
        except (ClientGone, OSError):
            svc.metrics.failures.labels(self.route, "499").inc()
        except asyncio.CancelledError:
            svc.metrics.failures.labels(self.route, "499").inc()
            raise
        finally:
            if not done:
                self.gen.cancel()
            self.watcher.cancel()
            svc.release()


def make_routes(svc: DecoderService) -> list[Route]:
    async def generate(request: Request, raw: bytes, t0: float, chat: bool) -> Response:
        route = "chat" if chat else "completions"
        streaming = False
        gen = watcher = None
        try:
            try:
                body = parse_json(raw)
            except ApiError as e:
                raise _bad(e.message) from None
            if not isinstance(body, dict):
                raise _bad("request body should be a JSON object")
            model = body.get("model")
            if model is not None and not isinstance(model, str):
                raise _bad("model should be a string", "model")
            if model and model != svc.model_name:
                raise ApiError(
                    "not_found",
                    f"the model {model!r} does not exist; this server serves {svc.model_name!r}",
                    "model",
                )
            _unsupported(body, chat)
            stream, include_usage = _stream_flags(body)
            if chat:
                msgs = _messages(body)
                if not svc.has_chat_template:
                    raise _bad(
                        "this model has no chat template (tokenizer_config.json 'chat_template' "
                        "or chat_template.jinja): use /v1/completions with a prompt",
                        "messages",
                    )
                try:
                    text = svc.render_chat(msgs)
                except InputError as e:
                    raise _bad(str(e), "messages") from None
                ids = await svc.encode(text, add_special_tokens=False)
            else:
                ids = await _prompt_ids(svc, body)
            if not ids:
                raise _bad("the prompt has no tokens", "messages" if chat else "prompt")
            params = _params(svc, body, len(ids), chat)
            sink = AsyncSink()
            try:
                gen = svc.scheduler.submit(ids, params, sink)
            except QueueFull as e:
                raise ApiError("unavailable", str(e)) from None
            except SchedulerClosed:
                raise ApiError("unavailable", "the server is shutting down") from None
            watcher = asyncio.ensure_future(_watch_disconnect(request.receive))
            first = await _next(sink, watcher)
            if isinstance(first, Finished):  # refused at intake
                raise _finish_error(first)
            assert isinstance(first, Queued), first
            chunks = _Chunks(svc, chat, include_usage)
            if stream:
                streaming = True  # the stream owns the watcher and the slot now
                return _SSE(svc, gen, sink, watcher, chunks, route, t0)
            parts = []
            while True:
                item = await _next(sink, watcher)
                if isinstance(item, Delta):
                    parts.append(item.text)
                elif isinstance(item, Finished):
                    break
            if item.reason == "error":
                raise _finish_error(item)
            return json_response(chunks.body("".join(parts), item))
        except (ClientGone, asyncio.CancelledError):
            if gen is not None:
                gen.cancel()  # its KV blocks are free before the next decode step
            raise  # counted and answered 499 by zoi.serve.handler.admitted
        finally:
            if not streaming and watcher is not None:
                watcher.cancel()

    @admitted(svc, "completions", ANSWERS, cancelled_is_499=True)
    async def completions(request: Request, raw: bytes, t0: float):
        return await generate(request, raw, t0, chat=False)

    @admitted(svc, "chat", ANSWERS, cancelled_is_499=True)
    async def chat_completions(request: Request, raw: bytes, t0: float):
        return await generate(request, raw, t0, chat=True)

    def _model_obj() -> dict:
        return {
            "id": svc.model_name,
            "object": "model",
            "created": 0,
            "owned_by": "zoi",
            "max_model_len": svc.max_seq_len,
        }

    async def models(request: Request):
        return json_response({"object": "list", "data": [_model_obj()]})

    async def model(request: Request):
        name = request.path_params["name"]
        if name != svc.model_name:
            return error_response(
                ApiError("not_found", f"the model {name!r} does not exist", "model")
            )
        return json_response(_model_obj())

    async def health(request: Request):
        ok, why = svc.can_admit()
        if ok:
            return Response(status_code=200)
        return json_response({"error": why, "error_type": "Unhealthy"}, 503)

    return [
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/models/{name:path}", model, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
    ]


def create_decoder_app(svc: DecoderService) -> Starlette:
    """The app of a decoder: the generate routes, /health, /metrics, /openapi.json, /docs."""

    def openapi(paths: list[str]) -> dict:
        from zoi._version import __version__
        from zoi.serve.openapi import decoder_document

        return decoder_document(svc.model_name, __version__, paths)

    async def http_error(request: Request, exc: HTTPException):
        return json_response(
            error_body(
                ApiError("not_found" if exc.status_code == 404 else "invalid", str(exc.detail))
            ),
            exc.status_code,
            headers=getattr(exc, "headers", None),
        )

    async def server_error(request: Request, exc: Exception):
        log.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
        return json_response(
            error_body(ApiError("backend", f"internal error: {type(exc).__name__}: {exc}")), 500
        )

    return assemble_app(
        svc,
        make_routes(svc),
        lambda paths: {"name": "zoi", "model": svc.model_name, "routes": paths},
        openapi,
        http_error,
        server_error,
        "zoi serve: shutting down",
    )
