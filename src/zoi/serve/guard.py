"""Admission and connection guard: the request limits every service shares (Admission), the
header read timeout and the per-client and total connection limits (ConnectionTracker).

Admission is the one place for "can this request start": the embedding Service and the
DecoderService both take it, so their limits, /health reasons and error messages agree; a
service with a queue of its own adds that queue's reason (Admission.queue_full).

Connection guard:

uvicorn calls the ASGI app only once a request's headers are complete, but it neither times
out a connection that never completes them nor limits connections per client. The guard is
uvicorn's httptools protocol with three additions:

- a connection must complete each request's headers within `header_timeout` seconds of its
  first byte (or of connecting): else it is answered 408 and closed;
- at most `per_client` connections from one IP address (0: no limit) and `total` in all; a
  connection over either limit is answered 503 and closed at once;
- the counts are shared with the service, so /health reports degraded when it is full.

The body is read by the route under its own timeout (zoi.serve.http.read_body), *before* the
route takes a request slot: a client that stalls mid-body holds a connection, never a slot.
"""

from __future__ import annotations

import logging
from collections import Counter

from zoi.serve.http import ApiError, read_body

log = logging.getLogger("zoi.serve")


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
            return False, f"{conns.open} connections open, the limit (--max-connections)"
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


class ConnectionTracker:
    """Open connections, in all and per client address."""

    def __init__(self, total: int, per_client: int, header_timeout: float):
        self.total_limit = int(total)
        self.per_client_limit = int(per_client)
        self.header_timeout = float(header_timeout)
        self.open = 0
        self.by_client: Counter = Counter()
        self.refused = 0  # connections refused for a limit
        self.header_timeouts = 0  # connections closed for slow headers

    def full(self) -> bool:
        """Near the total limit (within 10%): new clients may soon be refused."""
        return self.open >= self.total_limit - max(1, self.total_limit // 10)


def _response(status: bytes, msg: str) -> bytes:
    body = ('{"error":"' + msg + '","error_type":"Overloaded"}').encode()
    return (
        b"HTTP/1.1 " + status + b"\r\ncontent-type: application/json\r\n"
        b"content-length: " + str(len(body)).encode() + b"\r\nconnection: close\r\n\r\n" + body
    )


def make_protocol(tracker: ConnectionTracker):
    """uvicorn's httptools protocol class with the guard; None when httptools is missing."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:  # pragma: no cover - httptools is in the serve extra
        log.warning("httptools is not installed: no header timeout nor connection limits")
        return None

    class GuardedProtocol(HttpToolsProtocol):
        _zoi_counted = False
        _zoi_timer = None

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            ip = self.client[0] if self.client else ""
            self._zoi_ip = ip
            over_total = tracker.open >= tracker.total_limit
            over_client = (
                tracker.per_client_limit > 0 and tracker.by_client[ip] >= tracker.per_client_limit
            )
            if over_total or over_client:
                tracker.refused += 1
                why = (
                    f"too many connections from {ip} (limit {tracker.per_client_limit}, "
                    "--max-connections-per-client)"
                    if over_client
                    else f"too many open connections (limit {tracker.total_limit}, "
                    "--max-connections)"
                )
                transport.write(_response(b"503 Service Unavailable", why))
                transport.close()
                return
            tracker.open += 1
            tracker.by_client[ip] += 1
            self._zoi_counted = True
            self._zoi_arm()

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
            if self.transport.is_closing():
                return
            if self.cycle is not None and not self.cycle.response_complete:
                return  # a request is being served: its body has its own timeout
            tracker.header_timeouts += 1
            self.transport.write(
                _response(
                    b"408 Request Timeout",
                    f"request headers not received within {tracker.header_timeout:g} s "
                    "(--header-timeout)",
                )
            )
            self.transport.close()

        def data_received(self, data: bytes) -> None:
            # bytes after a complete answer start the next request: its headers are timed
            if self.cycle is None or self.cycle.response_complete:
                self._zoi_arm()
            super().data_received(data)

        def on_headers_complete(self) -> None:
            self._zoi_disarm()
            super().on_headers_complete()

        def connection_lost(self, exc) -> None:
            self._zoi_disarm()
            if self._zoi_counted:
                self._zoi_counted = False
                tracker.open -= 1
                tracker.by_client[self._zoi_ip] -= 1
                if tracker.by_client[self._zoi_ip] <= 0:
                    del tracker.by_client[self._zoi_ip]
            super().connection_lost(exc)

    return GuardedProtocol
