"""Slow and greedy clients cannot lock the others out.

1,000 sockets that stall (partial headers, or headers and a few body bytes) from other
loopback addresses: the real client on 127.0.0.1 keeps getting answers, a new connection of a
client at its connection limit sheds that client's oldest stalled one, stalled headers and bodies
time out with 408, and /health says degraded when the server cannot admit work.
"""

from __future__ import annotations

import socket
import threading
import time

import numpy as np
import pytest

from zoi.bench.loadtest import ServerProcess

from .serve_helpers import host_port, metric

httpx = pytest.importorskip("httpx")

HEADER_TIMEOUT = 3.0
BODY_TIMEOUT = 4.0
PER_CLIENT = 100


@pytest.fixture(scope="module")
def guarded(device, tmp_path_factory):
    srv = ServerProcess(
        args=[
            "--header-timeout",
            str(HEADER_TIMEOUT),
            "--body-timeout",
            str(BODY_TIMEOUT),
            "--max-connections-per-client",
            str(PER_CLIENT),
        ],
        env={"ZOI_DEVICE": device, "ZOI_LOG_LEVEL": "warning"},
        log_path=tmp_path_factory.mktemp("guarded") / "server.log",
    )
    yield srv
    assert srv.stop() == 0, srv.log()[-3000:]


def _connect(url: str, src: str) -> socket.socket:
    s = socket.create_connection(host_port(url), timeout=30, source_address=(src, 0))
    return s


def _read_status(s: socket.socket, timeout: float) -> int | None:
    """The status of what the server sends before it closes (None: closed without a word)."""
    s.settimeout(timeout)
    buf = b""
    try:
        while b"\r\n" not in buf:
            chunk = s.recv(4096)
            if not chunk:
                break
            buf += chunk
    except TimeoutError:
        return -1  # still open, nothing sent
    if not buf:
        return None
    return int(buf.split(b" ", 2)[1])


def _p99(url: str, n: int) -> float:
    ts = []
    with httpx.Client(timeout=60) as c:
        for i in range(n):
            t = time.perf_counter()
            r = c.post(url + "/embed", json={"inputs": [f"a real request, number {i}"]})
            ts.append(time.perf_counter() - t)
            assert r.status_code == 200, r.text
            assert len(r.json()[0]) == 384
    return float(np.percentile(ts, 99))


def test_stalled_sockets_do_not_lock_out_real_clients(guarded):
    url = guarded.url
    unloaded = _p99(url, 40)
    stalled: list[socket.socket] = []
    body_head = (
        b"POST /embed HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 1000\r\n\r\n" + b'{"inputs":'
    )
    try:
        # 5 x 100 sockets that send headers and 10 body bytes, then stall (each would hold a
        # request slot if slots were taken before the body was read: 512 are allowed)
        for src in ("127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.10", "127.0.0.11"):
            for _ in range(PER_CLIENT):
                s = _connect(url, src)
                s.sendall(body_head)
                stalled.append(s)
        # 5 x 100 sockets that send half of their headers, then stall
        for src in ("127.0.0.5", "127.0.0.6", "127.0.0.7", "127.0.0.12", "127.0.0.13"):
            for _ in range(PER_CLIENT):
                s = _connect(url, src)
                s.sendall(b"POST /embed HTTP/1.1\r\nHost: x\r\nContent-Le")
                stalled.append(s)
        # a new connection of a client at its limit sheds that client's oldest stalled one,
        # which is told why (503), and is served
        extra = _connect(url, "127.0.0.2")
        assert _read_status(stalled[0], 10) == 503
        extra.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert _read_status(extra, 10) == 200
        extra.close()
        time.sleep(0.5)
        # 1,000 stalled sockets, and the real client is answered at once
        assert httpx.get(url + "/health").status_code == 200
        loaded = _p99(url, 40)
        print(
            f"p99 unloaded {unloaded * 1e3:.1f} ms, with 1000 stalled sockets {loaded * 1e3:.1f} ms"
        )
        assert metric(httpx.get(url + "/metrics").text, "zoi_requests_in_flight") == 0
        # then the stalled ones are answered 408 and closed: headers first, then bodies
        statuses = [_read_status(s, HEADER_TIMEOUT + BODY_TIMEOUT + 10) for s in stalled[1:]]
        assert statuses.count(408) == len(stalled) - 1, sorted(set(statuses))
    finally:
        for s in stalled:
            s.close()
    assert httpx.post(url + "/embed", json={"inputs": ["still fine"]}).status_code == 200


def test_idle_connection_closed_after_header_timeout(guarded):
    s = _connect(guarded.url, "127.0.0.8")
    t = time.perf_counter()
    assert _read_status(s, HEADER_TIMEOUT + 10) == 408
    assert time.perf_counter() - t >= HEADER_TIMEOUT * 0.8
    s.close()


def test_slow_body_gets_408_and_holds_no_slot(guarded):
    s = _connect(guarded.url, "127.0.0.9")
    s.sendall(
        b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 100\r\n\r\n{"
    )
    stop = threading.Event()

    def trickle():  # one byte a second: never finishes within the body timeout
        while not stop.wait(1.0):
            try:
                s.sendall(b" ")
            except OSError:
                return

    th = threading.Thread(target=trickle, daemon=True)
    th.start()
    try:
        assert _read_status(s, BODY_TIMEOUT + 10) == 408
    finally:
        stop.set()
        s.close()


@pytest.fixture()
def small(device, tmp_path):
    srv = ServerProcess(
        args=["--max-connections", "20", "--max-concurrent-requests", "2"],
        env={"ZOI_DEVICE": device, "ZOI_LOG_LEVEL": "warning", "ZOI_MAX_QUEUE_DELAY_US": "3000000"},
        log_path=tmp_path / "server.log",
    )
    yield srv
    srv.stop()


def test_health_degraded_when_it_cannot_admit(small):
    url = small.url
    assert httpx.get(url + "/health").status_code == 200
    # both request slots taken (each request waits 3 s in the queue for a fuller batch)
    results = []
    threads = [
        threading.Thread(
            target=lambda i=i: results.append(
                httpx.post(url + "/embed", json={"inputs": [f"held {i}"]}, timeout=60)
            )
        )
        for i in range(2)
    ]
    for th in threads:
        th.start()
    deadline = time.time() + 20
    while time.time() < deadline:
        r = httpx.get(url + "/health")
        if r.status_code == 503:
            break
        time.sleep(0.05)
    assert r.status_code == 503 and "degraded" in r.json()["error"], r.text
    assert httpx.get(url + "/v2/health/ready").status_code == 503
    # /tokenize shares the tokenizer thread: it is admitted like /embed
    assert httpx.post(url + "/tokenize", json={"inputs": "x"}).status_code == 429
    for th in threads:
        th.join()
    assert [x.status_code for x in results] == [200, 200]
    assert httpx.get(url + "/health").status_code == 200
    # idle connections up to the total limit: a new connection sheds them, so /health is not
    # degraded, and one over the limit closes the oldest idle one (told why) instead of being
    # refused
    idle = [_connect(url, "127.0.0.1") for _ in range(18)]
    try:
        time.sleep(0.3)
        r = httpx.get(url + "/health")
        assert r.status_code == 200, r.text
        more = [_connect(url, "127.0.0.1") for _ in range(3)]
        assert _read_status(idle[0], 10) == 503
        more[-1].sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert _read_status(more[-1], 10) == 200
        for m in more:
            m.close()
    finally:
        for s in idle:
            s.close()
