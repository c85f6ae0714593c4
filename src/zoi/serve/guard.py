"""Admission and connection guard: the request limits every service shares (Admission), and
the limits of each connection (ConnectionTracker, enforced by the protocol of make_protocol).

Admission is the one place for "can this request start": the embedding Service and the
DecoderService both take it, so their limits, /health reasons and error messages agree; a
service with a queue of its own adds that queue's reason (Admission.queue_full).

Connection guard:

uvicorn calls the ASGI app only once a request's headers are complete, but it neither bounds
nor times the headers, nor limits connections. The guard is uvicorn's httptools protocol with:

- header size: a request's line and headers are counted as they arrive, before httptools
  buffers them (its buffering costs more than linear time, and blocks the event loop): over
  `max_url_bytes` of URL is answered 414, over `max_header_bytes` in all 431, and closed;
- header timeout: a connection must complete each request's headers within `header_timeout`
  seconds of its first byte (or of connecting): else it is answered 408 and closed;
- connection limits: at most `per_client` connections from one IP address (0: no limit) and
  `total` in all. At a limit, a new connection sheds the oldest one that is not being served
  (idle first, then one whose headers or body are still arriving) instead of being refused:
  behind a reverse proxy every client shares one address, so refusing would let one slow
  client lock out every other. Only when every connection is being served is the new one
  answered 503 and closed;
- half-closed clients: a client that sends a whole request and then shuts down its sending
  side still gets its answer (uvicorn takes that end of input for a disconnect). A client that
  closed both ways looks the same on the wire until it is written to, so a request that waits
  longer than PROBE_AFTER_S sends an interim `100 Continue`: a closed client's system answers
  it with a reset, and the request is dropped as a disconnect;
- the counts are shared with the service, so /health reports degraded when the connections
  being served near the limit.

The body is read by the route under its own timeout (zoi.serve.http.read_body), *before* the
route takes a request slot: a client that stalls mid-body holds a connection, never a slot.
"""

from __future__ import annotations

import json
import logging
import socket
from collections import Counter

from zoi.serve.http import ApiError, read_body

log = logging.getLogger("zoi.serve")

# After answering 414 / 431 the rest of what the client sends is read and dropped for this
# long before the socket is closed: closing with unread input makes the system send a reset,
# which can destroy the answer before the client reads it.
LINGER_S = 2.0
# A half-closed client's request that is not answered within this long is probed (100 Continue)
# to tell a client that only stopped sending from one that is gone; the probe's result is read
# from the socket's TCP state every POLL_S.
PROBE_AFTER_S = 0.1
POLL_S = 0.05
_TCP_CLOSE = 7  # Linux tcp_info.tcpi_state after the peer's reset


class Admission:
    """admit / release / can_admit / read_request for a service with `ready`, `in_flight`,
    `config` (max_concurrent_requests, payload_limit, body_timeout), `metrics` (requests,
    in_flight) and `connections` (a ConnectionTracker once serving, else None). The routes take
    them through one wrapper (zoi.serve.handler.admitted)."""

    async def read_request(self, request) -> bytes:
        """The whole body (payload limit, body timeout), read before a slot is taken."""
        return await read_body(request, self.config.payload_limit, self.config.body_timeout)

    def queue_full(self) -> str:
        """Why the service's own queue takes no more ("" when it does): a hook."""
        return ""

    def can_admit(self) -> tuple[bool, str]:
        """(True, "") when a new request would be admitted, else (False, why)."""
        if not self.ready:
            return False, "shutting down"
        if self.in_flight >= self.config.max_concurrent_requests:
            return False, (
                f"{self.in_flight} requests in flight, the limit "
                f"(--max-concurrent-requests {self.config.max_concurrent_requests})"
            )
        why = self.queue_full()
        if why:
            return False, why
        conns = self.connections
        if conns is not None and conns.full():
            return False, (
                f"{conns.open} connections open ({conns.open - conns.sheddable()} being "
                "served), the limit (--max-connections)"
            )
        return True, ""

    def admit(self, route: str) -> None:
        """Count the request and take a slot; ApiError unavailable / overloaded when none."""
        self.metrics.requests.labels(route).inc()
        if not self.ready:
            raise ApiError("unavailable", "the server is shutting down")
        if self.in_flight >= self.config.max_concurrent_requests:
            raise ApiError(
                "overloaded",
                f"model is overloaded: {self.in_flight} requests in flight "
                f"(--max-concurrent-requests {self.config.max_concurrent_requests})",
            )
        self.in_flight += 1
        self.metrics.in_flight.set(self.in_flight)

    def release(self) -> None:
        self.in_flight -= 1
        self.metrics.in_flight.set(self.in_flight)


IDLE = "idle"  # no byte of a request since connecting or since the last answer
WAITING = "waiting"  # a request's headers or body are arriving
BUSY = "busy"  # a whole request is being served: never shed


class ConnectionTracker:
    """Open connections, in all and per client address, and which of them can be shed: the
    idle and the waiting ones, each kept in the order they entered that state (oldest first)."""

    def __init__(
        self,
        total: int,
        per_client: int,
        header_timeout: float,
        max_header_bytes: int = 65536,
        max_url_bytes: int = 8192,
    ):
        self.total_limit = int(total)
        self.per_client_limit = int(per_client)
        self.header_timeout = float(header_timeout)
        self.max_header_bytes = int(max_header_bytes)
        self.max_url_bytes = int(max_url_bytes)
        self.open = 0
        self.by_client: Counter = Counter()
        self._state: dict = {}  # connection -> (ip, IDLE | WAITING | BUSY)
        self._lists: dict = {IDLE: {}, WAITING: {}}  # state -> {connection: None}, oldest first
        self._ip_lists: dict = {}  # ip -> state -> {connection: None}

    def full(self) -> bool:
        """Connections being served near the total limit (within 10%): new clients may soon be
        refused. Idle and waiting connections do not count: a new one sheds them."""
        busy = self.open - self.sheddable()
        return busy >= self.total_limit - max(1, self.total_limit // 10)

    def sheddable(self) -> int:
        return len(self._lists[IDLE]) + len(self._lists[WAITING])

    def add(self, conn, ip: str) -> None:
        self.open += 1
        self.by_client[ip] += 1
        self._ip_lists.setdefault(ip, {IDLE: {}, WAITING: {}})
        self._state[conn] = (ip, BUSY)
        self.move(conn, IDLE)

    def remove(self, conn) -> None:
        ip, state = self._state.pop(conn)
        self._unlist(conn, ip, state)
        self.open -= 1
        self.by_client[ip] -= 1
        if self.by_client[ip] <= 0:
            del self.by_client[ip]
            del self._ip_lists[ip]

    def move(self, conn, state: str) -> None:
        """Record the connection's state; one entering IDLE or WAITING becomes the newest there."""
        ip, old = self._state[conn]
        if old == state:
            return
        self._unlist(conn, ip, old)
        self._state[conn] = (ip, state)
        if state != BUSY:
            self._lists[state][conn] = None
            self._ip_lists[ip][state][conn] = None

    def _unlist(self, conn, ip: str, state: str) -> None:
        if state != BUSY:
            del self._lists[state][conn]
            del self._ip_lists[ip][state][conn]

    def oldest_sheddable(self, ip: str | None = None):
        """The connection to shed for a new one (of `ip` when given): the oldest idle, else the
        oldest waiting; None when every connection is being served."""
        lists = self._lists if ip is None else self._ip_lists.get(ip)
        for state in (IDLE, WAITING):
            if lists and lists[state]:
                return next(iter(lists[state]))
        return None

    def state(self, conn) -> str:
        return self._state[conn][1]


def _response(status: bytes, msg: str, error_type: str = "Overloaded") -> bytes:
    body = json.dumps({"error": msg, "error_type": error_type}, separators=(",", ":")).encode()
    # a 503 says when to try again (1 s, as the routes' 429 / 503 do), so clients back off
    retry = b"retry-after: 1\r\n" if status[:3] == b"503" else b""
    return (
        b"HTTP/1.1 "
        + status
        + b"\r\ncontent-type: application/json\r\n"
        + retry
        + b"content-length: "
        + str(len(body)).encode()
        + b"\r\nconnection: close\r\n\r\n"
        + body
    )


def _tcp_state(transport) -> int | None:
    """The socket's TCP state (Linux tcp_info), None where it cannot be read."""
    sock = transport.get_extra_info("socket")
    if sock is None or not hasattr(socket, "TCP_INFO"):
        return None
    try:
        return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0]
    except OSError:
        return None


def make_protocol(tracker: ConnectionTracker):
    """uvicorn's httptools protocol class with the guard; None when httptools is missing."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:  # pragma: no cover - httptools is in the serve extra
        log.warning("httptools is not installed: no header limits, timeout nor connection limits")
        return None

    class GuardedProtocol(HttpToolsProtocol):
        _zoi_counted = False  # counted in the tracker (to uncount when the connection ends)
        _zoi_timer = None  # the header timeout
        _zoi_in_head = True  # the parser expects a request's line and headers
        _zoi_head_bytes = 0  # bytes of them seen so far
        _zoi_url_bytes = 0
        _zoi_url_over = False  # the URL is over the limit: the rest of the request is ignored
        _zoi_answered = False  # an answer was completed on this connection
        _zoi_closing = False  # answered by the guard: what arrives now is dropped
        _zoi_linger = None
        _zoi_eof = False  # the client has sent all it will (half-closed)
        _zoi_probe = None

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            ip = self.client[0] if self.client else ""
            limit = tracker.per_client_limit
            if limit > 0 and tracker.by_client[ip] >= limit:
                self._zoi_shed_one(
                    ip,
                    f"{ip} is at its limit of {limit} connections (--max-connections-per-client)",
                )
            if tracker.open >= tracker.total_limit:
                self._zoi_shed_one(
                    None,
                    f"the server is at its limit of {tracker.total_limit} connections "
                    "(--max-connections)",
                )
            over_client = limit > 0 and tracker.by_client[ip] >= limit
            if over_client or tracker.open >= tracker.total_limit:
                why = (
                    f"too many connections from {ip} being served (limit {limit}, "
                    "--max-connections-per-client); retry later or raise the limit"
                    if over_client
                    else f"too many connections being served (limit {tracker.total_limit}, "
                    "--max-connections); retry later or raise the limit"
                )
                transport.write(_response(b"503 Service Unavailable", why))
                transport.close()
                return
            tracker.add(self, ip)
            self._zoi_counted = True
            self._zoi_arm()

        @staticmethod
        def _zoi_shed_one(ip: str | None, why: str) -> None:
            victim = tracker.oldest_sheddable(ip)
            if victim is not None:
                victim._zoi_shed(why)

        def _zoi_shed(self, why: str) -> None:
            """Close this connection (idle or waiting) to make room for a new one. A client
            waiting for an answer is told why; an idle keep-alive one is closed silently, as
            its keep-alive timeout would (an answer now could be taken for the next one's)."""
            c = self.cycle
            told = not (tracker.state(self) == IDLE and self._zoi_answered)
            if self._zoi_closing or (
                not self._zoi_in_head and c is not None and c.response_started
            ):
                told = False  # already answered (the rest of its input was still arriving)
            self._zoi_uncount()
            self._zoi_disarm()
            if told and not self.transport.is_closing():
                self.transport.write(
                    _response(
                        b"503 Service Unavailable",
                        f"connection closed to make room for a new one: it had not sent a "
                        f"whole request and {why}; send each request's headers and body "
                        "without pausing",
                    )
                )
            self.transport.close()

        def _zoi_uncount(self) -> None:
            if self._zoi_counted:
                self._zoi_counted = False
                tracker.remove(self)

        def _zoi_refresh(self) -> None:
            """Move this connection to the tracker list of its state."""
            if not self._zoi_counted:
                return
            c = self.cycle
            if (
                c is not None
                and not c.response_complete
                and (c.response_started or not c.more_body)
            ):
                state = BUSY
            elif self._zoi_closing or (self._zoi_in_head and self._zoi_head_bytes == 0):
                state = IDLE  # lingering after a refusal counts as idle: shed first
            else:
                state = WAITING
            tracker.move(self, state)

        # ---- header timeout -------------------------------------------------------------
        def _zoi_arm(self) -> None:
            if self._zoi_timer is None and tracker.header_timeout > 0:
                self._zoi_timer = self.loop.call_later(
                    tracker.header_timeout, self._zoi_header_timeout
                )

        def _zoi_disarm(self) -> None:
            if self._zoi_timer is not None:
                self._zoi_timer.cancel()
                self._zoi_timer = None

        def _zoi_header_timeout(self) -> None:
            self._zoi_timer = None
            if self.transport.is_closing() or self._zoi_closing:
                return
            if self.cycle is not None and not self.cycle.response_complete:
                return  # a request is being served: its body has its own timeout
            self.transport.write(
                _response(
                    b"408 Request Timeout",
                    f"request headers not received within {tracker.header_timeout:g} s "
                    "(--header-timeout); send each request's headers without pausing, or raise "
                    "--header-timeout",
                )
            )
            self.transport.close()

        # ---- header size ----------------------------------------------------------------
        def data_received(self, data: bytes) -> None:
            if self._zoi_closing:
                return  # answered: drop the rest until the client closes or LINGER_S passes
            # bytes after a complete answer start the next request: its headers are timed
            if self.cycle is None or self.cycle.response_complete:
                self._zoi_arm()
            # Bytes that may belong to a request's line and headers go to the parser at most
            # up to the limit; the body is fed whole. Bytes of a pipelined request that follow
            # a body in the same read are not counted (at most one read, 256 KiB).
            while data:
                if not self._zoi_in_head:
                    super().data_received(data)
                    break
                room = tracker.max_header_bytes - self._zoi_head_bytes
                if room <= 0:
                    self._zoi_refuse(
                        b"431 Request Header Fields Too Large",
                        f"request headers are over {tracker.max_header_bytes} bytes "
                        "(--max-header-bytes); send large values (tokens, cookies, data) in "
                        "the body, or raise --max-header-bytes",
                    )
                    return
                part, data = data[:room], data[room:]
                self._zoi_head_bytes += len(part)
                super().data_received(part)
                if self._zoi_url_over:
                    self._zoi_refuse(
                        b"414 URI Too Long",
                        f"request URL is over {tracker.max_url_bytes} bytes (--max-url-bytes); "
                        "send the data in the request body, or raise --max-url-bytes",
                    )
                    return
                if self.transport.is_closing():
                    return  # uvicorn answered a malformed request
            self._zoi_refresh()

        def _zoi_refuse(self, status: bytes, msg: str) -> None:
            """Answer a request the guard refuses and close; while an earlier request of this
            connection is being answered, an answer now would be taken for that one's: close
            without one."""
            self._zoi_disarm()
            c = self.cycle
            if c is not None and not c.response_complete:
                self.transport.close()
                return
            self.transport.write(_response(status, msg, "Validation"))
            self._zoi_closing = True
            self._zoi_refresh()
            if self.transport.can_write_eof():
                self.transport.write_eof()
            self._zoi_linger = self.loop.call_later(LINGER_S, self.transport.close)

        def on_message_begin(self) -> None:
            self._zoi_url_bytes = 0
            self._zoi_url_over = False
            super().on_message_begin()

        def on_url(self, url: bytes) -> None:
            self._zoi_url_bytes += len(url)
            if self._zoi_url_bytes > tracker.max_url_bytes:
                self._zoi_url_over = True
            if not self._zoi_url_over:
                super().on_url(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            if not self._zoi_url_over:
                super().on_header(name, value)

        def on_headers_complete(self) -> None:
            self._zoi_disarm()
            if self._zoi_url_over:
                return  # refused once the parser returns: the app never sees it
            self._zoi_in_head = False
            super().on_headers_complete()

        def on_body(self, body: bytes) -> None:
            if not self._zoi_url_over:
                super().on_body(body)

        def on_message_complete(self) -> None:
            if self._zoi_url_over:
                return
            self._zoi_in_head = True
            self._zoi_head_bytes = 0
            super().on_message_complete()

        def on_response_complete(self) -> None:
            self._zoi_answered = True
            super().on_response_complete()
            self._zoi_refresh()

        # ---- half-closed clients --------------------------------------------------------
        def eof_received(self) -> bool | None:
            if self._zoi_eof:
                return True  # reading was resumed after the end: nothing changes
            c = self.cycle
            if self._zoi_closing or c is None or c.response_complete or c.more_body:
                return None  # nothing whole to answer: the transport closes
            # A whole request is being answered: keep the connection open to send it, and
            # close once it is sent (keep-alive is off: the client sends no more).
            self._zoi_eof = True
            c.keep_alive = False
            if not c.response_started and c.scope.get("http_version") == "1.1":
                if _tcp_state(self.transport) is not None:
                    self._zoi_probe = self.loop.call_later(PROBE_AFTER_S, self._zoi_check, c, True)
            return True

        def _zoi_check(self, c, first: bool) -> None:
            """Probe (first) or poll a half-closed client while its request waits for its
            answer; a client that closed both ways has reset the connection: drop it."""
            self._zoi_probe = None
            if self.transport.is_closing() or c is not self.cycle or c.response_started:
                return  # answered (a reset now shows in the answer's writes) or gone
            if first:
                # Any HTTP/1.1 client accepts 1xx answers before the final one (RFC 9110 15.2).
                self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            elif _tcp_state(self.transport) == _TCP_CLOSE:
                self.transport.abort()  # uvicorn tells the app: http.disconnect
                return
            self._zoi_probe = self.loop.call_later(POLL_S, self._zoi_check, c, False)

        def connection_lost(self, exc) -> None:
            self._zoi_disarm()
            for h in (self._zoi_linger, self._zoi_probe):
                if h is not None:
                    h.cancel()
            self._zoi_uncount()
            super().connection_lost(exc)

    return GuardedProtocol
