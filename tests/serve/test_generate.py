"""OpenAI /v1/completions and /v1/chat/completions over the fake decoder backend, through a real
uvicorn server: formats (SSE parsed strictly), errors, continuous batching seen from clients,
cancellation on disconnect, overload, 32 concurrent streams."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("uvicorn")

from tests.decoder.fakes import ByteTokenizer, FakeBackend, expected_tokens  # noqa: E402

from zoi.decoder.api import SamplingParams  # noqa: E402

from .gen_helpers import MODEL, LiveServer, parse_sse  # noqa: E402
from .serve_helpers import metric  # noqa: E402

TOK = ByteTokenizer()


def want_text(prompt: str, chat: bool = False, **params) -> tuple[str, int, str]:
    """(text, completion tokens, finish reason) the fake gives alone (no stop strings)."""
    if chat:
        ids = TOK.encode(TOK.apply_chat_template(prompt), add_special_tokens=False)
    else:
        ids = TOK.encode(prompt)
    params.setdefault("temperature", 1.0)
    toks = expected_tokens(np.asarray(ids, np.int32), SamplingParams(**params), 256)
    reason = "stop" if toks[-1] == 257 and not params.get("ignore_eos") else "length"
    return TOK.decode(toks), len(toks), reason


@pytest.fixture
def live(request):
    servers = []

    def make(backend=None, **config):
        s = LiveServer(backend, **config)
        servers.append(s)
        return s

    yield make
    for s in servers:
        s.stop()


@pytest.fixture
def srv(live):
    return live()


def post(srv, path, body, **kw):
    return httpx.post(srv.url + path, json=body, timeout=30, **kw)


def test_completion_body(srv):
    r = post(
        srv,
        "/v1/completions",
        {"model": MODEL, "prompt": "hello", "max_tokens": 12, "temperature": 0},
    )
    assert r.status_code == 200, r.text
    b = r.json()
    text, n, reason = want_text("hello", max_new_tokens=12, temperature=0.0)
    assert b["object"] == "text_completion" and b["id"].startswith("cmpl-")
    assert b["model"] == MODEL and isinstance(b["created"], int)
    assert b["choices"] == [{"index": 0, "text": text, "logprobs": None, "finish_reason": reason}]
    assert b["usage"] == {"prompt_tokens": 6, "completion_tokens": n, "total_tokens": 6 + n}


def test_prompt_as_token_ids_and_one_element_array(srv):
    ids = TOK.encode("hello")
    a = post(srv, "/v1/completions", {"prompt": ids, "max_tokens": 5, "seed": 3}).json()
    b = post(srv, "/v1/completions", {"prompt": ["hello"], "max_tokens": 5, "seed": 3}).json()
    assert a["choices"] == b["choices"] and a["usage"]["prompt_tokens"] == 6


def test_chat_body_uses_the_template(srv):
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi ü"}]
    r = post(srv, "/v1/chat/completions", {"messages": msgs, "max_tokens": 9, "seed": 1})
    assert r.status_code == 200, r.text
    b = r.json()
    text, n, reason = want_text(msgs, chat=True, max_new_tokens=9, seed=1)
    assert b["object"] == "chat.completion" and b["id"].startswith("chatcmpl-")
    assert b["choices"][0]["message"] == {"role": "assistant", "content": text}
    assert b["choices"][0]["finish_reason"] == reason
    rendered = TOK.apply_chat_template(msgs)
    assert b["usage"]["prompt_tokens"] == len(TOK.encode(rendered, add_special_tokens=False))
    parts = [{"type": "text", "text": "hi "}, {"type": "text", "text": "ü"}]
    msgs2 = [msgs[0], {"role": "user", "content": parts}]
    b2 = post(srv, "/v1/chat/completions", {"messages": msgs2, "max_tokens": 9, "seed": 1}).json()
    assert b2["choices"] == b["choices"]


def _stream(srv, path, body) -> tuple[list, httpx.Response]:
    with httpx.stream("POST", srv.url + path, json={**body, "stream": True}, timeout=30) as r:
        raw = r.read()
    assert r.status_code == 200, raw
    assert r.headers["content-type"].startswith("text/event-stream")
    return parse_sse(raw), r


def test_completion_stream_chunks(live):
    srv = live(FakeBackend(step_delay=0.005))  # slow enough that deltas are not coalesced
    body = {"prompt": "stream me", "max_tokens": 40, "temperature": 0, "ignore_eos": True}
    chunks, _ = _stream(srv, "/v1/completions", body)
    full = post(srv, "/v1/completions", body).json()
    ids = {c["id"] for c in chunks}
    assert len(ids) == 1 and ids.pop().startswith("cmpl-")
    assert all(c["object"] == "text_completion" and c["model"] == MODEL for c in chunks)
    assert all("usage" not in c for c in chunks)
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])
    assert chunks[-1]["choices"][0] == {
        "index": 0,
        "text": "",
        "logprobs": None,
        "finish_reason": "length",
    }
    text = "".join(c["choices"][0]["text"] for c in chunks)
    assert (
        text
        == full["choices"][0]["text"]
        == want_text("stream me", max_new_tokens=40, temperature=0.0, ignore_eos=True)[0]
    )
    assert len(chunks) > 5  # a chunk per step or so (deltas already queued are sent as one)


def test_stream_include_usage(srv):
    body = {
        "prompt": "u",
        "max_tokens": 7,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
    }
    chunks, _ = _stream(srv, "/v1/completions", body)
    assert all(c["usage"] is None for c in chunks[:-1])
    last = chunks[-1]
    assert last["choices"] == [] and last["usage"] == {
        "prompt_tokens": 2,
        "completion_tokens": 7,
        "total_tokens": 9,
    }
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"


def test_chat_stream_chunks(srv):
    msgs = [{"role": "user", "content": "日本語 please"}]
    chunks, _ = _stream(
        srv,
        "/v1/chat/completions",
        {"messages": msgs, "max_tokens": 30, "seed": 5, "ignore_eos": True},
    )
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert chunks[-1]["choices"][0]["delta"] == {}
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert text == want_text(msgs, chat=True, max_new_tokens=30, seed=5, ignore_eos=True)[0]
    assert all("\ufffd" not in c["choices"][0]["delta"].get("content", "") for c in chunks)


def test_stop_strings_across_deltas(srv):
    text, _, _ = want_text("zz", max_new_tokens=120, temperature=0.0, ignore_eos=True)
    stop = text[10:14]
    assert text.index(stop) >= 1
    body = {
        "prompt": "zz",
        "max_tokens": 120,
        "temperature": 0,
        "ignore_eos": True,
        "stop": [stop, "not in it"],
    }
    chunks, _ = _stream(srv, "/v1/completions", body)
    got = "".join(c["choices"][0]["text"] for c in chunks)
    assert got == text[: text.index(stop)]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    b = post(srv, "/v1/completions", {**body, "stop": stop}).json()
    assert b["choices"][0]["text"] == got and b["choices"][0]["finish_reason"] == "stop"
    assert b["usage"]["completion_tokens"] < 120


@pytest.mark.parametrize(
    ("body", "param", "status"),
    [
        ({"prompt": "x", "n": 2}, "n", 400),
        ({"prompt": "x", "best_of": 3}, "best_of", 400),
        ({"prompt": "x", "temperature": 3}, "temperature", 400),
        ({"prompt": "x", "temperature": "hot"}, "temperature", 400),
        ({"prompt": "x", "top_p": 0}, "top_p", 400),
        ({"prompt": "x", "top_k": -2}, "top_k", 400),
        ({"prompt": "x", "max_tokens": 0}, "max_tokens", 400),
        ({"prompt": "x", "max_tokens": True}, "max_tokens", 400),
        ({"prompt": "x", "max_tokens": 10_000}, "max_tokens", 400),
        ({"prompt": "x", "stop": [""]}, "stop", 400),
        ({"prompt": "x", "stop": 3}, "stop", 400),
        ({"prompt": "x", "stream_options": {"include_usage": True}}, "stream_options", 400),
        ({"prompt": "x", "stream": "yes"}, "stream", 400),
        ({"prompt": "x", "logprobs": 2}, "logprobs", 400),
        ({"prompt": "x", "echo": True}, "echo", 400),
        ({"prompt": "x", "seed": 2**70}, "seed", 400),
        ({"prompt": ""}, "prompt", 400),
        ({"prompt": []}, "prompt", 400),
        ({"prompt": ["a", "b"]}, "prompt", 400),
        ({"prompt": [1, 99999]}, "prompt", 400),
        ({"prompt": "x" * 300}, "prompt", 400),
        ({}, "prompt", 400),
        ({"prompt": "x", "model": "other"}, "model", 404),
    ],
)
def test_completion_errors_name_the_field(srv, body, param, status):
    r = post(srv, "/v1/completions", body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["message"] and err["type"] == "invalid_request_error"
    assert set(err) == {"message", "type", "param", "code"}


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "messages"),
        ({"messages": [{"role": "user", "content": 3}]}, "messages"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages"),
        ({"messages": [{"role": "user", "content": "x"}], "n": 4}, "n"),
        (
            {"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]},
            "tools",
        ),
        (
            {"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 0},
            "max_completion_tokens",
        ),
    ],
)
def test_chat_errors_name_the_field(srv, body, param):
    r = post(srv, "/v1/chat/completions", body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_malformed_json_and_context_length(srv):
    r = httpx.post(
        srv.url + "/v1/completions",
        content=b"{nope",
        timeout=10,
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
    r = post(srv, "/v1/completions", {"prompt": "x" * 250, "max_tokens": 10})
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "context_length_exceeded"
    assert "256 tokens" in r.json()["error"]["message"]


def test_a_request_the_pool_can_never_hold_is_refused(live):
    s = live(FakeBackend(num_blocks=4, block_size=4))  # 16 tokens in all, context 256
    r = post(s, "/v1/completions", {"prompt": "x" * 10, "max_tokens": 20, "stream": True})
    assert r.status_code == 400 and "KV blocks" in r.json()["error"]["message"]
    assert s.backend.steps == 0


def test_a_request_joins_a_running_stream(live):
    s = live(FakeBackend(step_delay=0.01))
    body = {"prompt": "long one", "max_tokens": 80, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", s.url + "/v1/completions", json=body, timeout=30) as r:
        it = r.iter_bytes()
        got = next(it)
        while got.count(b"data: ") < 5:
            got += next(it)
        short = post(s, "/v1/completions", {"prompt": "short", "max_tokens": 3, "ignore_eos": True})
        assert short.status_code == 200
        assert short.json()["usage"]["completion_tokens"] == 3
        rest = b"".join(it)
    chunks = parse_sse(got + rest)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    both = [h for h in s.backend.history if len(h) == 2]
    assert both and s.backend.history[-1] == (1,)  # the short one left, the long one went on


def test_client_disconnect_cancels_mid_stream(live):
    s = live(FakeBackend(step_delay=0.01))
    body = {"prompt": "bye", "max_tokens": 200, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", s.url + "/v1/completions", json=body, timeout=30) as r:
        n = 0
        for line in r.iter_lines():
            n += line.startswith("data: ")
            if n >= 3:
                break
    t0 = time.time()
    while not s.backend.cancelled and time.time() - t0 < 10:
        time.sleep(0.01)
    assert s.backend.cancelled == [1]
    assert len(s.backend.free) == s.backend.num_blocks and not s.backend.seqs
    assert s.backend.steps < 150
    assert s.service.in_flight == 0


def test_client_disconnect_while_waiting_and_non_streaming(live):
    s = live(FakeBackend(step_delay=0.01, max_batch=1))
    blocker = {"prompt": "a", "max_tokens": 100, "ignore_eos": True}

    async def go():
        async with httpx.AsyncClient(base_url=s.url, timeout=30) as c:
            first = asyncio.ensure_future(c.post("/v1/completions", json=blocker))
            await asyncio.sleep(0.1)
            waiting = asyncio.ensure_future(c.post("/v1/completions", json={"prompt": "b"}))
            await asyncio.sleep(0.1)
            waiting.cancel()  # the client gives up while its request waits for a slot
            await asyncio.sleep(0.1)
            first.cancel()  # and while one runs, non-streaming
            await asyncio.sleep(0.2)

    asyncio.run(go())
    t0 = time.time()
    while (s.backend.seqs or s.service.in_flight) and time.time() - t0 < 10:
        time.sleep(0.01)
    assert not s.backend.seqs and len(s.backend.free) == s.backend.num_blocks
    assert s.backend.cancelled == [1]
    assert all(2 not in h for h in s.backend.history)
    assert s.service.in_flight == 0 and s.service.scheduler.waiting == 0


def test_overload_is_503_with_retry_after(live):
    s = live(FakeBackend(step_delay=0.01, max_batch=1), max_waiting_requests=2)
    body = {"prompt": "a", "max_tokens": 60, "ignore_eos": True}

    async def go():
        async with httpx.AsyncClient(base_url=s.url, timeout=30) as c:
            running = [asyncio.ensure_future(c.post("/v1/completions", json=body))]
            await asyncio.sleep(0.1)
            running += [
                asyncio.ensure_future(c.post("/v1/completions", json=body)) for _ in range(2)
            ]
            await asyncio.sleep(0.1)
            over = await c.post("/v1/completions", json=body)
            health = await c.get("/health")
            return over, health, await asyncio.gather(*running)

    over, health, ok = asyncio.run(go())
    assert over.status_code == 503 and over.headers["retry-after"] == "1"
    assert "max-waiting-requests 2" in over.json()["error"]["message"]
    assert health.status_code == 503
    assert [r.status_code for r in ok] == [200, 200, 200]


def test_too_many_in_flight_is_429(live):
    s = live(FakeBackend(step_delay=0.01, max_batch=1), max_concurrent_requests=1)

    async def go():
        async with httpx.AsyncClient(base_url=s.url, timeout=30) as c:
            a = asyncio.ensure_future(
                c.post(
                    "/v1/completions", json={"prompt": "a", "max_tokens": 30, "ignore_eos": True}
                )
            )
            await asyncio.sleep(0.1)
            b = await c.post("/v1/completions", json={"prompt": "b"})
            return await a, b

    a, b = asyncio.run(go())
    assert a.status_code == 200 and b.status_code == 429
    assert b.json()["error"]["type"] == "rate_limit_error"


def test_32_concurrent_streams_match_alone(live):
    s = live(FakeBackend(step_delay=0.002, max_batch=8, num_blocks=256))
    prompts = [f"client {i} " * (1 + i % 4) for i in range(32)]

    async def one(c, i):
        body = {
            "prompt": prompts[i],
            "max_tokens": 8 + i,
            "seed": i,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        async with c.stream("POST", "/v1/completions", json=body) as r:
            raw = b"".join([b async for b in r.aiter_bytes()])
        assert r.status_code == 200
        chunks = parse_sse(raw)
        return "".join(c["choices"][0]["text"] for c in chunks[:-1]), chunks[-1]["usage"]

    async def go():
        limits = httpx.Limits(max_connections=64)
        async with httpx.AsyncClient(base_url=s.url, timeout=60, limits=limits) as c:
            return await asyncio.gather(*(one(c, i) for i in range(32)))

    got = asyncio.run(go())
    for i, (text, usage) in enumerate(got):
        want, n, _ = want_text(prompts[i], max_new_tokens=8 + i, seed=i)
        assert text == want and usage["completion_tokens"] == n
    assert max(len(h) for h in s.backend.history) == 8
    assert len(s.backend.free) == 256


def test_metrics_and_models(srv):
    post(srv, "/v1/completions", {"prompt": "m", "max_tokens": 4, "ignore_eos": True})
    text = httpx.get(srv.url + "/metrics").text
    assert metric(text, "zoi_decoder_generated_tokens_total") == 4
    assert metric(text, "zoi_decoder_kv_blocks_total") == 64
    assert metric(text, "zoi_decoder_time_to_first_token_seconds_count") == 1
    for name in (
        "zoi_decoder_running",
        "zoi_decoder_waiting",
        "zoi_decoder_kv_blocks_used",
        "zoi_decoder_tokens_per_second",
    ):
        assert f"\n{name} " in text
    m = httpx.get(srv.url + "/v1/models").json()
    assert m["data"][0]["id"] == MODEL and m["data"][0]["max_model_len"] == 256
    assert httpx.get(srv.url + f"/v1/models/{MODEL}").status_code == 200
    assert httpx.get(srv.url + "/v1/models/nope").status_code == 404
    assert httpx.get(srv.url + "/health").status_code == 200


def test_openapi_lists_exactly_the_decoder_routes(srv):
    from zoi.serve.openapi import decoder_operations

    doc = httpx.get(srv.url + "/openapi.json").json()
    assert sorted(doc["paths"]) == sorted(decoder_operations(MODEL))
    assert "/v1/embeddings" not in doc["paths"]
    assert httpx.get(srv.url + "/docs").status_code == 200
    r = post(srv, "/v1/embeddings", {"input": "x"})
    assert r.status_code in (404, 405)


def test_a_backend_failure_is_an_error_event_or_a_500(live):
    s = live(FakeBackend(step_delay=0.005, fail_steps=(6, 30)))
    chunks, _ = _stream(s, "/v1/completions", {"prompt": "f", "max_tokens": 50, "ignore_eos": True})
    assert "error" in chunks[-1] and "injected failure" in chunks[-1]["error"]["message"]
    assert chunks[-1]["error"]["type"] == "server_error"
    assert all("choices" in c for c in chunks[:-1]) and len(chunks) > 1
    while s.backend.steps < 20:  # fail step 30 under a non-streaming request
        post(s, "/v1/completions", {"prompt": "g", "max_tokens": 2, "ignore_eos": True})
    r = post(s, "/v1/completions", {"prompt": "h", "max_tokens": 40, "ignore_eos": True})
    assert r.status_code == 500 and r.json()["error"]["code"] == "engine_failure"
    ok = post(s, "/v1/completions", {"prompt": "i", "max_tokens": 3})
    assert ok.status_code == 200
    assert len(s.backend.free) == s.backend.num_blocks


def test_chat_without_a_template_is_400(live):
    s = live()
    s.service.tokenizer.chat_template = None  # the instance's, not the class's
    r = post(s, "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 400 and "no chat template" in r.json()["error"]["message"]
    assert post(s, "/v1/completions", {"prompt": "x", "max_tokens": 2}).status_code == 200


def test_a_full_pool_queues_requests_then_admits_them(live):
    # 10 blocks of 4 tokens, 5 per request (6 prompt + 14 new): two run, the others wait
    s = live(FakeBackend(num_blocks=10, block_size=4, step_delay=0.003))
    body = {"max_tokens": 14, "ignore_eos": True, "temperature": 0}

    async def go():
        async with httpx.AsyncClient(base_url=s.url, timeout=60) as c:
            return await asyncio.gather(
                *(
                    c.post(
                        "/v1/completions",
                        json={**body, "prompt": f"p{i:03d}", "stream": i % 2 == 1},
                    )
                    for i in range(6)
                )
            )

    rs = asyncio.run(go())
    assert [r.status_code for r in rs] == [200] * 6
    assert max(len(h) for h in s.backend.history) == 2
    text = httpx.get(s.url + "/metrics").text
    assert metric(text, "zoi_decoder_kv_blocks_used") == 0
    assert metric(text, "zoi_decoder_generated_tokens_total") == 6 * 14
