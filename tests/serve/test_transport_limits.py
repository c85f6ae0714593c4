"""Hostile clients at the transport, through real sockets against real servers: huge request
headers and URLs (431 / 414 while the event loop stays responsive), stalled uploads that fill
the connection limits (shed for a complete request), gzip bodies that are not exactly one
complete member (422), and clients that half-close after a complete request (answered)."""

from __future__ import annotations

import gzip
import json
import re
import socket
import threading
import time
import zlib

import pytest

from zoi.bench.loadtest import ServerProcess

from .serve_helpers import MODEL_NAME, host_port, metric

httpx = pytest.importorskip("httpx")

LIMIT = 20  # --max-connections and --max-connections-per-client of the small server


@pytest.fixture(scope="module")
def small(device, tmp_path_factory):
    """Default header and URL limits (64 KiB, 8 KiB); 20 connections in all and per address."""
    srv = ServerProcess(
        args=["--max-connections", str(LIMIT), "--max-connections-per-client", str(LIMIT)],
        env={"ZOI_DEVICE": device, "ZOI_LOG_LEVEL": "warning"},
        log_path=tmp_path_factory.mktemp("transport") / "server.log",
    )
    yield srv
    assert srv.stop() == 0, srv.log()[-3000:]


def _connect(url: str) -> socket.socket:
    return socket.create_connection(host_port(url), timeout=30)


def _read_response(s: socket.socket, timeout: float = 30) -> tuple[int, bytes, list[int]]:
    """(status, body, statuses of the 1xx answers before it); status 0: closed without one."""
    s.settimeout(timeout)
    buf = b""
    interim: list[int] = []
    while True:
        while b"\r\n\r\n" not in buf:
            chunk = s.recv(65536)
            if not chunk:
                return 0, buf, interim
            buf += chunk
        head, _, buf = buf.partition(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        if status >= 200:
            break
        interim.append(status)
    m = re.search(rb"content-length: *(\d+)", head, re.I)
    n = int(m.group(1)) if m else 0
    while len(buf) < n:
        chunk = s.recv(65536)
        if not chunk:
            break
        buf += chunk
    return status, buf[:n], interim


def _closed(s: socket.socket, timeout: float = 10) -> bool:
    """The server closed the connection (an orderly end or a reset) within `timeout`."""
    s.settimeout(timeout)
    try:
        return s.recv(65536) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def _get(path: str, extra: bytes = b"") -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: x\r\n".encode() + extra + b"\r\n"


def _post(path: str, body: bytes, extra: bytes = b"") -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n".encode()
        + extra
        + b"\r\n"
        + body
    )


# ---- request headers and URL: counted as they arrive --------------------------------------------
def _health_latencies(url: str, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        assert httpx.get(url + "/health", timeout=60).status_code == 200
        out.append(time.perf_counter() - t)
        time.sleep(0.05)
    return out


@pytest.mark.parametrize(
    ("start", "status"),
    [(b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: ", 431), (b"GET /", 414)],
    ids=["header", "url"],
)
def test_huge_header_or_url_is_refused_while_health_stays_fast(small, start, status):
    """A client streams 200 MB of one header (or of the URL): it is answered 431 (414) after the
    limit, and /health keeps answering at once meanwhile."""
    url = small.url
    s = _connect(url)
    s.sendall(start)
    sent = [0]
    stop = threading.Event()

    def stream():
        chunk = b"a" * (1 << 20)
        try:
            while not stop.is_set() and sent[0] < 200 << 20:
                s.sendall(chunk)
                sent[0] += len(chunk)
        except OSError:
            pass  # the server closed the connection

    th = threading.Thread(target=stream, daemon=True)
    th.start()
    try:
        lat = _health_latencies(url, 10)
        got, body, _ = _read_response(s, 30)
    finally:
        stop.set()
        th.join(30)
        s.close()
    print(f"/health under a streamed huge {start[:4]!r}: max {max(lat) * 1e3:.1f} ms")
    assert max(lat) < 0.5, [round(x, 3) for x in lat]
    assert got == status, (got, body[:200])
    err = json.loads(body)["error"]
    flag = "--max-header-bytes" if status == 431 else "--max-url-bytes"
    assert flag in err and "raise" in err, err
    assert httpx.get(url + "/health").status_code == 200


def test_headers_and_url_within_the_limits_are_served(small):
    url = small.url
    # 60 KiB of headers, twice on one keep-alive connection: the count starts again per request
    headers = b"".join(b"X-H%d: %s\r\n" % (i, b"v" * 1000) for i in range(60))
    s = _connect(url)
    try:
        for _ in range(2):
            s.sendall(_get("/health", headers))
            assert _read_response(s)[0] == 200
    finally:
        s.close()
    # a URL of 8 KiB is served (a 404, from the app); over it is not
    assert httpx.get(url + "/" + "p" * (8192 - 1)).status_code == 404
    assert httpx.get(url + "/" + "p" * 8192).status_code == 414
    # many small headers add up to the limit
    s = _connect(url)
    try:
        s.sendall(_get("/health", headers + headers[:6000]))
        status, body, _ = _read_response(s)
        assert status == 431, body
        assert _closed(s)
    finally:
        s.close()
    # a body of 1.5 MB sent in the same write as the headers is not counted as headers: the
    # route answers it (413 for its one over-long input, --max-input-chars)
    big = json.dumps({"inputs": "word " * 300_000}).encode()
    s = _connect(url)
    try:
        s.sendall(_post("/tokenize", big))
        status, body, _ = _read_response(s, 120)
        assert status == 413 and "--max-input-chars" in body.decode(), (status, body[:300])
    finally:
        s.close()


# ---- stalled uploads: shed for a complete request ---------------------------------------------
def test_tracker_sheds_idle_then_waiting_oldest_first_and_never_busy():
    from zoi.serve.guard import BUSY, IDLE, WAITING, ConnectionTracker

    t = ConnectionTracker(total=10, per_client=4, header_timeout=1)
    a, b, c, d = "a", "b", "c", "d"  # stand-ins for connections
    for conn in (a, b, c):
        t.add(conn, "10.0.0.1")
    t.add(d, "10.0.0.2")
    assert t.open == 4 and t.by_client["10.0.0.1"] == 3 and t.sheddable() == 4
    t.move(a, WAITING)  # a's request is arriving
    t.move(b, BUSY)  # b's is being served
    assert t.oldest_sheddable("10.0.0.1") is c  # idle before waiting, whatever their age
    assert t.oldest_sheddable() is c
    t.move(c, WAITING)
    t.move(d, WAITING)
    assert t.oldest_sheddable() is a and t.oldest_sheddable("10.0.0.2") is d
    t.move(a, BUSY)
    t.move(a, IDLE)  # answered: the newest idle one
    assert t.oldest_sheddable("10.0.0.1") is a
    t.remove(a)
    t.remove(c)
    assert t.oldest_sheddable("10.0.0.1") is None  # only b, being served
    assert t.oldest_sheddable("10.0.0.9") is None
    t.remove(b)
    t.remove(d)
    assert t.open == 0 and not t.by_client and t.sheddable() == 0
    # /health: degraded only when the connections being served near the limit
    for i in range(9):
        t.add(i, "10.0.0.3")
    assert not t.full()
    for i in range(9):
        t.move(i, BUSY)
    assert t.full()


STALLED_HEAD = _post("/embed", b'{"inputs": "' + b"x" * 1000 + b'"}')[:-990]  # part of the body


def test_stalled_uploads_from_one_address_are_shed_for_a_complete_request(small):
    """20 uploads from 127.0.0.1 that stall mid-body fill both connection limits; a well-behaved
    client on the same address still gets its answers, and the stalled ones that made room are
    told why."""
    url = small.url
    stalled: list[socket.socket] = []

    def stall():
        s = _connect(url)
        s.sendall(STALLED_HEAD)
        stalled.append(s)

    try:
        for _ in range(LIMIT):
            stall()
        time.sleep(0.3)
        codes = []
        for i in range(5):  # each on a new connection, the limits full before each
            codes.append(httpx.post(url + "/embed", json={"inputs": f"good {i}"}).status_code)
            stall()
        assert codes == [200] * 5
        # the oldest stalled ones made room, each told why; the others still wait for their body
        time.sleep(0.3)
        got = [_read_response(s, 5) if _readable(s, 0.02) else None for s in stalled]
        n = sum(g is not None for g in got)
        assert n >= 1 and all(g is not None for g in got[:n]), got
        assert all(g is None for g in got[n:]), got
        for status, body, _ in got[:n]:
            err = json.loads(body)["error"]
            assert status == 503 and "make room" in err and "without pausing" in err, err
    finally:
        for s in stalled:
            s.close()


def _readable(s: socket.socket, timeout: float = 0.3) -> bool:
    """The server sent something (or closed) within `timeout`."""
    s.settimeout(timeout)
    try:
        s.recv(1, socket.MSG_PEEK)
        return True
    except TimeoutError:
        return False


def test_idle_connections_are_shed_before_stalled_ones(small):
    url = small.url
    stalled, idle = [], []
    try:
        for _ in range(LIMIT // 2):
            s = _connect(url)
            s.sendall(STALLED_HEAD)
            stalled.append(s)
        for _ in range(LIMIT // 2):  # keep-alive connections, answered once, now idle
            s = _connect(url)
            s.sendall(_get("/health"))
            assert _read_response(s)[0] == 200
            idle.append(s)
        time.sleep(0.2)
        # at the limit: a new connection is served, and /health is not degraded (nothing is
        # being served: every open connection can be shed)
        new = _connect(url)
        new.sendall(_get("/health"))
        status, body, _ = _read_response(new)
        new.close()
        assert status == 200, body
        # the oldest idle one was closed without a word (an answer could be taken for the
        # answer of its next request); the stalled uploads, older, are untouched
        assert _closed(idle[0])
        assert not any(_readable(s, 0.02) for s in idle[1:] + stalled)
    finally:
        for s in stalled + idle:
            s.close()


@pytest.fixture()
def held(device, tmp_path):
    """4 connections at most; each request waits 2 s in the queue (a fuller batch)."""
    srv = ServerProcess(
        args=["--max-connections", "4", "--max-queue-delay-us", "2000000"],
        env={"ZOI_DEVICE": device, "ZOI_LOG_LEVEL": "warning"},
        log_path=tmp_path / "server.log",
    )
    yield srv
    assert srv.stop() == 0, srv.log()[-3000:]


def test_connections_being_served_are_never_shed(held):
    url = held.url
    busy = []
    try:
        for i in range(4):
            s = _connect(url)
            s.sendall(_post("/embed", json.dumps({"inputs": f"held {i}"}).encode()))
            busy.append(s)
        time.sleep(0.5)
        extra = _connect(url)
        status, body, _ = _read_response(extra, 10)
        extra.close()
        assert status == 503, (status, body)
        assert "being served" in json.loads(body)["error"]
        assert [_read_response(s, 30)[0] for s in busy] == [200] * 4
    finally:
        for s in busy:
            s.close()


# ---- gzip bodies: exactly one complete member ---------------------------------------------------
def _gz(obj) -> bytes:
    return gzip.compress(json.dumps(obj).encode())


@pytest.mark.parametrize(
    ("name", "body", "why"),
    [
        ("two members", _gz({"inputs": "hello"}) + _gz({"inputs": "other"}), "follow its end"),
        ("trailing data", _gz({"inputs": "hello"}) + b"junk", "follow its end"),
        ("no trailer", _gz({"inputs": "hello"})[:-8], "before its end"),
        ("cut short", _gz({"inputs": "hello"})[:-20], "before its end"),
    ],
    ids=["two members", "trailing data", "no trailer", "cut short"],
)
def test_gzip_body_must_be_one_complete_member(server, name, body, why):
    url = server.url
    h = {"content-encoding": "gzip", "content-type": "application/json"}
    r = httpx.post(url + "/embed", content=body, headers=h)
    assert r.status_code == 422, (name, r.status_code, r.text)
    assert r.json()["error_type"] == "Validation" and why in r.json()["error"], r.text
    assert "single stream" in r.json()["error"]
    r = httpx.post(url + "/v1/embeddings", content=body, headers=h)  # the OpenAI error shape
    assert r.status_code == 422, (name, r.text)
    assert r.json()["error"]["type"] == "invalid_request_error", r.text


def test_single_gzip_and_deflate_members_are_accepted_and_bombs_refused(server):
    url = server.url
    h = {"content-encoding": "gzip"}
    assert httpx.post(url + "/embed", content=_gz({"inputs": "one"}), headers=h).status_code == 200
    deflated = zlib.compress(json.dumps({"inputs": "one"}).encode())
    hd = {"content-encoding": "deflate"}
    assert httpx.post(url + "/embed", content=deflated, headers=hd).status_code == 200
    r = httpx.post(url + "/embed", content=deflated + b"x", headers=hd)
    assert r.status_code == 422 and "follow its end" in r.json()["error"], r.text
    limit = httpx.get(url + "/info").json()["payload_limit"]
    bomb = gzip.compress(b'{"inputs": ["' + b"a" * (limit + 10) + b'"]}')
    assert httpx.post(url + "/embed", content=bomb, headers=h).status_code == 413


# ---- half-closed clients: a complete request is answered ---------------------------------------
def _half_closed(url: str, request: bytes) -> tuple[int, bytes, list[int], bool]:
    s = _connect(url)
    try:
        s.sendall(request)
        s.shutdown(socket.SHUT_WR)
        status, body, interim = _read_response(s, 60)
        return status, body, interim, _closed(s)
    finally:
        s.close()


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/embed", {"inputs": "hello"}),
        ("/v1/embeddings", {"input": "hello", "model": MODEL_NAME}),
        ("/tokenize", {"inputs": "hello"}),
        ("/info", None),
    ],
)
def test_half_closed_client_gets_its_answer(server, path, body):
    req = _get(path) if body is None else _post(path, json.dumps(body).encode())
    status, got, _, closed = _half_closed(server.url, req)
    assert status == 200, (status, got[:300])
    assert closed  # and then the server closes: the client sends nothing more
    if path == "/embed":
        assert len(json.loads(got)[0]) == 384


def test_half_closed_client_with_a_partial_body_is_dropped(server):
    before = metric(
        httpx.get(server.url + "/metrics").text,
        "zoi_request_failure_total",
        'route="tei",status="499"',
    )
    status, _, _, closed = _half_closed(server.url, STALLED_HEAD)
    assert status == 0 and closed
    deadline = time.time() + 10
    while time.time() < deadline:
        now = metric(
            httpx.get(server.url + "/metrics").text,
            "zoi_request_failure_total",
            'route="tei",status="499"',
        )
        if now == before + 1:
            break
        time.sleep(0.05)
    assert now == before + 1


class _GuardedDecoder:
    """The decoder app over the fake backend, served by uvicorn with the guard's protocol (as
    `zoi serve` runs it) on a thread."""

    def __init__(self, backend):
        import uvicorn
        from tests.decoder.fakes import ByteTokenizer

        from zoi.serve.app import create_app
        from zoi.serve.decoder_service import DecoderService
        from zoi.serve.guard import ConnectionTracker, make_protocol

        self.backend = backend
        self.service = DecoderService(backend, ByteTokenizer(), None, "fake-decoder")
        tracker = ConnectionTracker(64, 64, 10.0)
        self.service.connections = tracker
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        cfg = uvicorn.Config(
            create_app(self.service),
            log_level="warning",
            lifespan="on",
            http=make_protocol(tracker),
        )
        self.server = uvicorn.Server(cfg)
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [sock]}, daemon=True
        )
        self.thread.start()
        t0 = time.time()
        while not self.server.started:
            assert time.time() - t0 < 30 and self.thread.is_alive(), "the server did not start"
            time.sleep(0.01)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)


@pytest.fixture()
def decoder():
    from tests.decoder.fakes import FakeBackend

    s = _GuardedDecoder(FakeBackend(step_delay=0.01))
    yield s
    s.stop()


def test_half_closed_completion_is_answered(decoder):
    """A generation of ~0.5 s: the half-closed client is probed (100 Continue), answers the
    probe as any open socket does, and gets its completion."""
    body = {"prompt": "hi", "max_tokens": 40, "ignore_eos": True}
    status, got, interim, closed = _half_closed(
        decoder.url, _post("/v1/completions", json.dumps(body).encode())
    )
    assert status == 200, got[:300]
    assert json.loads(got)["usage"]["completion_tokens"] == 40
    assert interim == [100] and closed
    assert decoder.backend.cancelled == []


def test_closed_client_generation_is_cancelled(decoder):
    """A client that closes both ways after a complete request: the probe finds it gone and
    the generation stops (its KV blocks freed), instead of running to max_tokens."""
    body = {"prompt": "bye", "max_tokens": 200, "ignore_eos": True}
    s = _connect(decoder.url)
    s.sendall(_post("/v1/completions", json.dumps(body).encode()))
    time.sleep(0.05)
    s.close()
    t0 = time.time()
    while not decoder.backend.cancelled and time.time() - t0 < 10:
        time.sleep(0.01)
    print(f"cancelled {time.time() - t0:.2f} s after the close")
    assert decoder.backend.cancelled == [1]
    assert decoder.backend.steps < 150
    while decoder.service.in_flight and time.time() - t0 < 10:
        time.sleep(0.01)
    assert decoder.service.in_flight == 0
