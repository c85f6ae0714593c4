"""The one wrapper of every route that takes a request slot (zoi.serve.guard.Admission).

`admitted(svc, route, answers)(work)` is the route handler; around `work(request, raw, t0)`
it does what every such route does, in this order:

1. `before(request)` when given (KServe: the model named in the path), before the body;
2. read the whole body (payload limit, --body-timeout) *before* taking a slot, so a client
   that stalls mid-body holds a connection, never a slot;
3. admit: count the request, take a slot (429 overloaded, 503 shutting down);
4. `work(request, raw, t0) -> Response`, the route's own parsing and inference;
5. count the outcome (unless `counted=False`): successes and request_duration when `work`
   returns (request_duration unless `timed=False`), failures{route, status} for an ApiError
   (answered in the API's error shape), a client that went away (499), an unexpected exception
   (500: the app answers it) and, with `cancelled_is_499`, a cancelled request. A request
   answered before admission (unknown model, body too large or late, client gone during the
   body) is counted in `requests` here, as admission counts the others, so that per route
   requests = successes + failures;
6. release the slot on every path once taken: an answer, an ApiError, a client gone, an
   unexpected exception (the app answers it 500), a cancellation; except when `work` returns
   an `OwnsSlot` response (a stream), which releases it and counts the outcome itself.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
from starlette.requests import Request
from starlette.responses import Response

from zoi.serve.http import ApiError, ClientGone, dumps, json_response


@dataclass(frozen=True)
class Answers:
    """How one API answers a failed request: `error(ApiError) -> Response` and the JSON body
    of its 499 (the client went away)."""

    error: Callable[[ApiError], Response]
    gone: dict

    def client_gone(self) -> Response:
        return json_response(self.gone, 499)


class OwnsSlot:
    """Mixed into a response that takes over its request's slot (a stream): it releases the
    slot and counts the request's outcome itself, when it ends."""


Work = Callable[[Request, bytes, float], Awaitable[Response]]


def admitted(
    svc,
    route: str,
    answers: Answers,
    *,
    counted: bool = True,
    timed: bool = True,
    cancelled_is_499: bool = False,
    before: Callable[[Request], None] | None = None,
) -> Callable[[Work], Callable[[Request], Awaitable[Response]]]:
    """The handler of a route that takes a slot of `svc` (an Admission), around `work`; see the
    module docstring. `route` labels the metrics; `timed=False`: a success is counted but not
    observed in request_duration (a route that runs no model, e.g. /tokenize)."""

    def wrap(work: Work) -> Callable[[Request], Awaitable[Response]]:
        @functools.wraps(work)
        async def handler(request: Request) -> Response:
            t0 = time.perf_counter()
            holds = False  # this handler holds a slot (to release)
            seen = False  # the request is counted in `requests` (admit counts it first thing)
            try:
                if before is not None:
                    before(request)
                raw = await svc.read_request(request)
                seen = True
                svc.admit(route)
                holds = True
                resp = await work(request, raw, t0)
                if isinstance(resp, OwnsSlot):
                    holds = False  # the stream releases it
                elif counted:
                    svc.metrics.successes.labels(route).inc()
                    if timed:
                        svc.metrics.request_duration.observe(time.perf_counter() - t0)
                return resp
            except ApiError as e:
                if counted:
                    _count_unseen(svc, route, seen)
                    svc.metrics.failures.labels(route, str(e.status)).inc()
                return answers.error(e)
            except ClientGone:
                if counted:
                    _count_unseen(svc, route, seen)
                    svc.metrics.failures.labels(route, "499").inc()
                return answers.client_gone()
            except asyncio.CancelledError:
                if counted and cancelled_is_499:
                    svc.metrics.failures.labels(route, "499").inc()
                raise
            except Exception:  # a bug: the app answers 500; counted, so an alert on 5xx sees it
                if counted:
                    _count_unseen(svc, route, seen)
                    svc.metrics.failures.labels(route, "500").inc()
                raise
            finally:
                if holds:
                    svc.release()

        return handler

    return wrap


def _count_unseen(svc, route: str, seen: bool) -> None:
    """Count a request answered before admission (which counts every request it sees)."""
    if not seen:
        svc.metrics.requests.labels(route).inc()


# ---- big answers, off the event loop ----------------------------------------------------------
INLINE_FLOATS = 65_536  # an answer of up to this many floats is serialised on the event loop
PIECE_FLOATS = 65_536  # floats serialised per call on the answer thread
_answer_pool: ThreadPoolExecutor | None = None


def dumps_pieces(obj: Any, out: list[bytes]) -> None:
    """`dumps(obj)` as pieces of at most about PIECE_FLOATS floats each, appended to `out`:
    b"".join(out) == dumps(obj). Arrays are split by rows, lists / tuples / dicts holding
    arrays or nested containers by element; anything else is one piece."""
    if isinstance(obj, np.ndarray) and obj.ndim > 0 and obj.size > PIECE_FLOATS:
        rows = max(1, PIECE_FLOATS // max(1, obj[0].size))
        out.append(b"[")
        for i in range(0, len(obj), rows):
            if i:
                out.append(b",")
            out.append(dumps(obj[i : i + rows])[1:-1])  # the rows without their brackets
        out.append(b"]")
    elif isinstance(obj, (list, tuple)) and any(_nested(x) for x in obj):
        out.append(b"[")
        for i, x in enumerate(obj):
            if i:
                out.append(b",")
            dumps_pieces(x, out)
        out.append(b"]")
    elif isinstance(obj, dict) and _nested(obj):
        out.append(b"{")
        for i, (k, v) in enumerate(obj.items()):
            out.append((b"," if i else b"") + dumps(k) + b":")
            dumps_pieces(v, out)
        out.append(b"}")
    else:
        out.append(dumps(obj))


def _nested(x: Any) -> bool:
    """Worth serialising by parts: an array or list, or a dict holding one (a dict of scalars,
    e.g. {"index", "value"}, is one small piece)."""
    if isinstance(x, (np.ndarray, list, tuple)):
        return True
    return isinstance(x, dict) and any(
        isinstance(v, (np.ndarray, list, tuple, dict)) for v in x.values()
    )


def _dumps_in_pieces(obj: Any) -> bytes:
    out: list[bytes] = []
    dumps_pieces(obj, out)
    return b"".join(out)


async def json_answer(
    obj: Any, floats: int, status: int = 200, headers: dict | None = None
) -> Response:
    """The JSON answer `obj`, which holds about `floats` numbers. A big one is serialised on a
    thread of its own, in pieces: one serialiser call holds the GIL throughout, so a single
    call over megabytes would stall the event loop (every other request, /health) for as
    long; between pieces the event loop gets its turn."""
    if floats <= INLINE_FLOATS:
        return json_response(obj, status, headers)
    global _answer_pool
    if _answer_pool is None:
        _answer_pool = ThreadPoolExecutor(2, thread_name_prefix="zoi-answer")
    body = await asyncio.get_running_loop().run_in_executor(_answer_pool, _dumps_in_pieces, obj)
    return Response(body, status_code=status, headers=headers, media_type="application/json")
