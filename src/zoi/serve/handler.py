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
   (500: the app answers it) and, with `cancelled_is_499`, a cancelled request;
6. release the slot on every path once taken: an answer, an ApiError, a client gone, an
   unexpected exception (the app answers it 500), a cancellation; except when `work` returns
   an `OwnsSlot` response (a stream), which releases it and counts the outcome itself.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import Response

from zoi.serve.http import ApiError, ClientGone, json_response


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
            try:
                if before is not None:
                    before(request)
                raw = await svc.read_request(request)
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
                    svc.metrics.failures.labels(route, str(e.status)).inc()
                return answers.error(e)
            except ClientGone:
                if counted:
                    svc.metrics.failures.labels(route, "499").inc()
                return answers.client_gone()
            except asyncio.CancelledError:
                if counted and cancelled_is_499:
                    svc.metrics.failures.labels(route, "499").inc()
                raise
            except Exception:  # a bug: the app answers 500; counted, so an alert on 5xx sees it
                if counted:
                    svc.metrics.failures.labels(route, "500").inc()
                raise
            finally:
                if holds:
                    svc.release()

        return handler

    return wrap
