"""Every route that takes a request slot gives it back on every path (zoi.serve.handler.admitted).

Each route is driven through the ASGI app (no socket: the ASGI messages are scripted, so a
client that stalls or leaves is exact) on each path: an answer, an error of the route's own
(ApiError), an unexpected exception (500), a body too large / not JSON / late, a client that
leaves during the body or after admission, a cancelled request, and an overloaded or stopping
server. After each: the admission count (Service.in_flight and the zoi_requests_in_flight
gauge) is back to zero, no slot was released twice or taken and kept, the status and error
body are the route's, and the request metrics moved exactly as they always have.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time

import pytest

from zoi.decoder.scheduler import QueueFull
from zoi.serve import routes_heads
from zoi.serve.app import create_app
from zoi.serve.config import ServeConfig

from .serve_helpers import MODEL_NAME, serve_device

BLOCK_US = 60_000_000  # a batcher that waits this long for a fuller batch holds its jobs


@dataclasses.dataclass(frozen=True)
class R:
    """A route: its service kind, a good and a bad (ApiError after admission) body."""

    path: str
    kind: str  # "emb", "ce", "sp", "gen": which model serves it
    ok: dict
    bad: dict
    label: str  # its route label in the metrics
    shape: str  # error body: "tei", "openai", "kserve"
    bad_status: int = 422
    json_status: int = 422  # a body that is not JSON
    counted: bool = True  # successes / failures counted
    block: str = "batch"  # what holds it after admission: batch / tokthread / in_thread / decode

    @property
    def watched(self) -> bool:  # a client leaving after admission is noticed (499)
        return self.block in ("batch", "decode")

    def __str__(self) -> str:
        return self.path


TEXT = {"name": "TEXT", "datatype": "BYTES", "shape": [1], "data": ["a b c"]}
ROUTES = [
    R("/embed", "emb", {"inputs": ["a b c"]}, {"inputs": "a", "normalize": "yes"}, "tei", "tei"),
    R("/tokenize", "emb", {"inputs": "a b"}, {"inputs": ["a", 3]}, "tokenize", "tei",
      block="tokthread"),
    R("/v1/embeddings", "emb", {"input": "a b c"}, {"input": 5}, "openai", "openai"),
    R(f"/v2/models/{MODEL_NAME}/infer", "emb", {"inputs": [TEXT]},
      {"inputs": [{**TEXT, "datatype": "FP32"}]}, "kserve", "kserve"),
    R("/embed_all", "emb", {"inputs": ["a b"]}, {"inputs": {"a": 1}}, "heads", "tei",
      block="in_thread"),
    R("/rerank", "ce", {"query": "q", "texts": ["a", "b c"]}, {"query": "q", "texts": "a"},
      "heads", "tei"),
    R("/predict", "ce", {"inputs": ["a", "b c"]}, {"inputs": [5]}, "heads", "tei"),
    R("/v1/rerank", "ce", {"query": "q", "documents": ["a", "b"]},
      {"query": "q", "documents": "a"}, "heads", "tei"),
    R("/embed_sparse", "sp", {"inputs": "a b"}, {"inputs": {"a": 1}}, "heads", "tei"),
    R("/v1/completions", "gen", {"prompt": "hi", "max_tokens": 4}, {"prompt": 5},
      "completions", "openai", 400, 400, block="decode"),
    R("/v1/chat/completions", "gen", {"messages": [{"role": "user", "content": "hi"}],
      "max_tokens": 4}, {"messages": []}, "chat", "openai", 400, 400, block="decode"),
]  # fmt: skip
WATCHED = [r for r in ROUTES if r.watched]
GEN = [r for r in ROUTES if r.kind == "gen"]
FAULTED = [r for r in ROUTES if r.path in ("/embed", "/v1/embeddings")]  # token ids in


# ---- the models, the services ------------------------------------------------------------------
@pytest.fixture(scope="module")
def engines(engine, tmp_path_factory):
    """kind -> engine, built on first use."""
    import zoi

    made = {"emb": engine}

    def get(kind):
        if kind not in made:
            from tests.heads.builders import head_checkpoint

            task, labels = {"ce": ("seq", 1), "sp": ("mlm", 3)}[kind]
            folder = head_checkpoint(tmp_path_factory.mktemp(kind), "bert", task, labels, 0)[0]
            made[kind] = zoi.compile(folder, device=serve_device())
        return made[kind]

    return get


class Served:
    """A service and its app; admit/release wrapped to count slots taken and given back."""

    def __init__(self, svc):
        self.svc, self.app = svc, create_app(svc)
        self.taken = self.released = 0
        admit, release = svc.admit, svc.release

        def counted_admit(route):
            admit(route)  # raises when refused: then no slot was taken
            self.taken += 1

        def counted_release():
            self.released += 1
            assert self.released <= self.taken, "a slot released twice"
            release()

        svc.admit, svc.release = counted_admit, counted_release

    def in_flight(self) -> int:
        gauge = self.svc.metrics.in_flight._value.get()
        assert gauge == self.svc.in_flight, (gauge, self.svc.in_flight)
        return self.svc.in_flight

    def assert_free(self) -> None:
        assert self.in_flight() == 0 and self.taken == self.released, (self.taken, self.released)

    def counts(self, label: str) -> dict:
        m = self.svc.metrics
        out = {
            "requests": m.requests.labels(label)._value.get(),
            "ok": m.successes.labels(label)._value.get(),
        }
        for fam in m.failures.collect():
            for s in fam.samples:
                if s.name.endswith("_total") and s.labels["route"] == label and s.value:
                    out[s.labels["status"]] = s.value
        return out


@pytest.fixture
def serve(engines):
    made = []

    def make(route: R, backend=None, **cfg) -> Served:
        cfg.setdefault("payload_limit", 512)
        config = ServeConfig(**cfg)
        if route.kind == "gen":
            from tests.decoder.fakes import ByteTokenizer, FakeBackend

            from zoi.serve.decoder_service import DecoderService

            svc = DecoderService(backend or FakeBackend(), ByteTokenizer(), config, "fake")
        else:
            from zoi.serve.service import Service

            svc = Service(engines(route.kind), config)
        made.append(Served(svc))
        return made[-1]

    yield make
    for s in made:
        s.svc.close()


# ---- the ASGI client ---------------------------------------------------------------------------
@dataclasses.dataclass
class Answer:
    status: int | None
    headers: dict
    body: bytes
    raised: BaseException | None  # what the app raised after answering (a 500)

    def json(self):
        return json.loads(self.body)


def body_of(obj, pad: int = 0) -> bytes:
    return json.dumps(obj).encode() + b" " * pad


async def call(app, path: str, messages: list, declared: int | None, leave=None) -> Answer:
    """POST `path`: `messages` are what receive() gives, in order; then it waits until the
    answer is complete (or `leave` is set) and gives http.disconnect, as a server does."""
    done = asyncio.Event()
    leave = leave or asyncio.Event()
    headers = [(b"content-type", b"application/json")]
    if declared is not None:
        headers.append((b"content-length", str(declared).encode()))
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": "POST", "scheme": "http", "path": path, "raw_path": path.encode(),
             "query_string": b"", "root_path": "", "headers": headers,
             "client": ("127.0.0.1", 5000), "server": ("test", 80)}  # fmt: skip
    queue = list(messages)
    out = Answer(None, {}, b"", None)

    async def receive():
        if queue:
            return queue.pop(0)
        waits = [asyncio.ensure_future(done.wait()), asyncio.ensure_future(leave.wait())]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
        return {"type": "http.disconnect"}

    async def send(msg):
        if msg["type"] == "http.response.start":
            out.status = msg["status"]
            out.headers = {k.decode(): v.decode() for k, v in msg.get("headers", [])}
        elif msg["type"] == "http.response.body":
            out.body += msg.get("body", b"")
            if not msg.get("more_body"):
                done.set()

    try:
        await app(scope, receive, send)
    except Exception as e:  # Starlette re-raises after its 500 answer
        out.raised = e
    return out


def whole(body: bytes) -> list:
    return [{"type": "http.request", "body": body, "more_body": False}]


def post(s: Served, path: str, body: bytes) -> Answer:
    return asyncio.run(call(s.app, path, whole(body), len(body)))


def check_error(route: R, a: Answer, status: int) -> None:
    assert a.status == status, (route, a.status, a.body[:300])
    b = a.json()
    if route.shape == "openai":
        assert isinstance(b["error"]["message"], str) and b["error"]["message"], b
    else:
        assert isinstance(b["error"], str) and b["error"], b
        if route.shape == "tei":
            assert isinstance(b["error_type"], str), b


def moved(route: R, before: dict, after: dict, requests: int, ok: int = 0, **fail) -> None:
    """The request metrics moved by exactly this: `requests` received and, when the route
    counts them, `ok` successes and the failures `fail` by status (s422=1: one 422)."""
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in {*before, *after}}
    delta = {k: v for k, v in delta.items() if v}
    expect = {"requests": requests} if requests else {}
    if route.counted:
        expect.update({"ok": ok} if ok else {})
        expect.update({k[1:]: v for k, v in fail.items()})
    assert delta == expect, (route, delta, expect)


# ---- the paths ----------------------------------------------------------------------------------
@pytest.mark.parametrize("route", ROUTES, ids=str)
def test_success_releases(serve, route):
    s = serve(route)
    c0 = s.counts(route.label)
    for _ in range(2):
        a = post(s, route.path, body_of(route.ok))
        assert a.status == 200 and a.raised is None, (a.status, a.body[:300])
        s.assert_free()
    moved(route, c0, s.counts(route.label), 2, ok=2)
    assert s.taken == 2


@pytest.mark.parametrize("route", ROUTES, ids=str)
def test_handler_error_releases(serve, route):
    s = serve(route)
    c0 = s.counts(route.label)
    a = post(s, route.path, body_of(route.bad))
    check_error(route, a, route.bad_status)
    s.assert_free()
    moved(route, c0, s.counts(route.label), 1, **{f"s{route.bad_status}": 1})
    assert s.taken == 1


@pytest.mark.parametrize("route", ROUTES, ids=str)
def test_unexpected_exception_releases(serve, route, monkeypatch):
    s = serve(route)

    def broken(*a, **k):
        raise RuntimeError("injected bug")

    async def broken_async(*a, **k):
        broken()

    if route.kind == "gen":
        monkeypatch.setattr(s.svc, "encode", broken_async)
    else:
        monkeypatch.setattr(s.svc, "check_texts", broken)
    c0 = s.counts(route.label)
    a = post(s, route.path, body_of(route.ok))
    assert a.status == 500 and isinstance(a.raised, RuntimeError), (a.status, a.body[:300])
    assert "injected bug" in a.body.decode()
    s.assert_free()
    moved(route, c0, s.counts(route.label), 1, s500=1)  # a bug's 500 counts as a failure
    assert s.taken == 1


@pytest.mark.parametrize("route", ROUTES, ids=str)
@pytest.mark.parametrize("declared", [True, False], ids=["content-length", "chunked"])
def test_body_too_large_takes_no_slot(serve, route, declared):
    s = serve(route)
    c0 = s.counts(route.label)
    raw = body_of(route.ok, pad=600)
    if declared:
        a = asyncio.run(call(s.app, route.path, whole(raw), len(raw)))
    else:
        parts = [raw[i : i + 100] for i in range(0, len(raw), 100)]
        msgs = [{"type": "http.request", "body": p, "more_body": True} for p in parts]
        msgs.append({"type": "http.request", "body": b"", "more_body": False})
        a = asyncio.run(call(s.app, route.path, msgs, None))
    check_error(route, a, 413)
    s.assert_free()
    moved(route, c0, s.counts(route.label), 1, s413=1)
    assert s.taken == 0


@pytest.mark.parametrize("route", ROUTES, ids=str)
def test_malformed_json_releases(serve, route):
    s = serve(route)
    c0 = s.counts(route.label)
    a = post(s, route.path, b'{"not json')
    check_error(route, a, route.json_status)
    s.assert_free()
    moved(route, c0, s.counts(route.label), 1, **{f"s{route.json_status}": 1})
    assert s.taken == 1


@pytest.mark.parametrize("route", ROUTES, ids=str)
def test_body_timeout_takes_no_slot(serve, route):
    s = serve(route, body_timeout=0.2)
    c0 = s.counts(route.label)
    raw = body_of(route.ok)
    first = [{"type": "http.request", "body": raw[:5], "more_body": True}]  # then stalls
    a = asyncio.run(call(s.app, route.path, first, len(raw)))
    check_error(route, a, 408)
    assert a.headers.get("connection") == "close"
    s.assert_free()
    moved(route, c0, s.counts(route.label), 1, s408=1)
    assert s.taken == 0


@pytest.mark.parametrize("route", ROUTES, ids=str)
def test_client_gone_during_body_takes_no_slot(serve, route):
    s = serve(route)
    c0 = s.counts(route.label)
    raw = body_of(route.ok)
    msgs = [{"type": "http.request", "body": raw[:5], "more_body": True},
            {"type": "http.disconnect"}]  # fmt: skip
    a = asyncio.run(call(s.app, route.path, msgs, len(raw)))
    assert a.status == 499, (a.status, a.body)
    s.assert_free()
    moved(route, c0, s.counts(route.label), 1, s499=1)
    assert s.taken == 0


def held(route: R, serve, monkeypatch, **cfg) -> Served:
    """A service on which the route, once admitted, waits (until its client leaves or it is
    cancelled)."""
    backend = None
    if route.block == "batch":
        cfg["max_queue_delay_us"] = BLOCK_US
    elif route.block == "decode":
        from tests.decoder.fakes import FakeBackend

        backend = FakeBackend(step_delay=0.05)
    s = serve(route, backend, **cfg)

    async def forever(*a, **k):
        await asyncio.Event().wait()

    if route.block == "tokthread":
        monkeypatch.setattr(s.svc, "run_in_tokenizer_thread", forever)
    elif route.block == "in_thread":
        monkeypatch.setattr(routes_heads, "in_thread", forever)
    return s


def held_body(route: R) -> bytes:
    if route.kind == "gen":  # long enough to be running when the client leaves
        return body_of({**route.ok, "max_tokens": 200, "ignore_eos": True})
    return body_of(route.ok)


def kv_all_free(backend) -> None:
    """The fake decoder holds no sequence and every KV block is free (soon: the scheduler's
    thread cancels)."""
    t0 = time.monotonic()
    while backend.seqs and time.monotonic() - t0 < 10:
        time.sleep(0.01)
    assert not backend.seqs and len(backend.free) == backend.num_blocks


async def until_admitted(s: Served, task: asyncio.Task) -> None:
    t0 = time.monotonic()
    while s.in_flight() == 0:
        assert not task.done(), task.result()
        assert time.monotonic() - t0 < 30, "the request was never admitted"
        await asyncio.sleep(0.005)


@pytest.mark.parametrize("route", WATCHED, ids=str)
def test_client_gone_after_admission_releases(serve, route, monkeypatch):
    s = held(route, serve, monkeypatch)
    c0 = s.counts(route.label)
    raw = held_body(route)

    async def go():
        leave = asyncio.Event()
        task = asyncio.ensure_future(call(s.app, route.path, whole(raw), len(raw), leave))
        await until_admitted(s, task)
        leave.set()  # the client leaves while its request waits
        return await asyncio.wait_for(task, 30)

    a = asyncio.run(go())
    assert a.status == 499, (a.status, a.body)
    s.assert_free()
    moved(route, c0, s.counts(route.label), 1, s499=1)
    if route.kind == "gen":
        kv_all_free(s.svc.backend)  # its sequence went with it


@pytest.mark.parametrize("route", [r for r in ROUTES if not r.watched], ids=str)
def test_client_gone_after_admission_unwatched_route_answers(serve, route):
    """These routes do not watch their client once admitted: it is answered, and released."""
    s = serve(route)
    c0 = s.counts(route.label)
    raw = body_of(route.ok)
    msgs = whole(raw) + [{"type": "http.disconnect"}]
    a = asyncio.run(call(s.app, route.path, msgs, len(raw)))
    assert a.status == 200
    s.assert_free()
    moved(route, c0, s.counts(route.label), 1, ok=1)


@pytest.mark.parametrize("route", ROUTES, ids=str)
def test_cancelled_request_releases(serve, route, monkeypatch):
    s = held(route, serve, monkeypatch)
    c0 = s.counts(route.label)
    raw = held_body(route)

    async def go():
        task = asyncio.ensure_future(call(s.app, route.path, whole(raw), len(raw)))
        await until_admitted(s, task)
        task.cancel()  # the server gives up on it (a shutdown past its grace period)
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(go())
    s.assert_free()
    # a cancelled generation counts as a 499; the encoder routes never counted it
    moved(route, c0, s.counts(route.label), 1, **({"s499": 1} if route.kind == "gen" else {}))
    if route.kind == "gen":
        kv_all_free(s.svc.backend)


@pytest.mark.parametrize("route", ROUTES, ids=str)
def test_overloaded_is_429_and_takes_no_slot(serve, route):
    s = serve(route, max_concurrent_requests=1)
    s.svc.admit("someone else")  # the one slot is taken
    c0 = s.counts(route.label)
    a = post(s, route.path, body_of(route.ok))
    check_error(route, a, 429)
    if route.kind == "gen":
        assert a.headers.get("retry-after") == "1"
    assert s.in_flight() == 1 and s.taken == 1  # the other one's slot, still held
    moved(route, c0, s.counts(route.label), 1, s429=1)
    s.svc.release()
    s.assert_free()
    a = post(s, route.path, body_of(route.ok))  # free again: served
    assert a.status == 200, a.body[:300]
    s.assert_free()


@pytest.mark.parametrize("route", ROUTES, ids=str)
def test_shutting_down_is_503_and_takes_no_slot(serve, route):
    s = serve(route)
    s.svc.ready = False
    c0 = s.counts(route.label)
    a = post(s, route.path, body_of(route.ok))
    check_error(route, a, 503)
    s.assert_free()
    moved(route, c0, s.counts(route.label), 1, s503=1)
    assert s.taken == 0


@pytest.mark.parametrize("route", GEN, ids=str)
def test_scheduler_queue_full_is_503_and_releases(serve, route, monkeypatch):
    s = serve(route)

    def full(*a, **k):
        raise QueueFull("256 requests waiting (--max-waiting-requests 256); retry shortly")

    monkeypatch.setattr(s.svc.scheduler, "submit", full)
    c0 = s.counts(route.label)
    a = post(s, route.path, body_of(route.ok))
    check_error(route, a, 503)
    assert a.headers.get("retry-after") == "1"
    s.assert_free()
    moved(route, c0, s.counts(route.label), 1, s503=1)
    assert s.taken == 1


@pytest.mark.parametrize("route", FAULTED, ids=str)
def test_engine_failure_is_500_and_releases(serve, route):
    s = serve(route, fail_on_token=1)  # token 1: the injected engine fault
    key = "inputs" if route.path == "/embed" else "input"
    c0 = s.counts(route.label)
    a = post(s, route.path, body_of({key: [[101, 1, 102]]}))
    check_error(route, a, 500)
    assert "injected" in a.body.decode()
    s.assert_free()
    moved(route, c0, s.counts(route.label), 1, s500=1)


@pytest.mark.parametrize("route", GEN, ids=str)
def test_stream_releases_when_it_ends_or_fails(serve, route):
    from tests.decoder.fakes import FakeBackend

    s = serve(route, FakeBackend(fail_steps=(3,)))
    c0 = s.counts(route.label)
    body = {**route.ok, "stream": True, "max_tokens": 20, "ignore_eos": True}
    a = post(s, route.path, body_of(body))
    assert a.status == 200 and a.body.endswith(b"data: [DONE]\n\n")
    assert b'"error"' in a.body  # the backend failed mid-stream
    s.assert_free()
    moved(route, c0, s.counts(route.label), 1, sstream=1)
    a = post(s, route.path, body_of(body))
    assert a.status == 200 and b'"error"' not in a.body
    s.assert_free()
    moved(route, c0, s.counts(route.label), 2, sstream=1, ok=1)


def test_kserve_unknown_model_is_404_before_the_body(serve):
    route = next(r for r in ROUTES if r.label == "kserve")
    s = serve(route)
    c0 = s.counts(route.label)
    a = post(s, "/v2/models/nope/infer", body_of(route.ok))
    check_error(route, a, 404)
    s.assert_free()
    moved(route, c0, s.counts(route.label), 1, s404=1)
    assert s.taken == 0
