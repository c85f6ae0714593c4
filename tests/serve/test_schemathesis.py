"""schemathesis against /openapi.json of a live `zoi serve` (issue 17): every route, valid and
invalid generated inputs, bounded in time (a few hundred requests, well under a minute).

The server runs a tiny random BERT (small_bert) on a free 127.0.0.1 port. schemathesis reads the
server's own description and, for each operation, generates requests that follow it (positive)
and requests that break it (negative: wrong types, missing fields, bad path parameters). Every
answer must be no 5xx, a status code and a content type the description lists for that
operation, and a body that conforms to the documented schema of that status code.

The operations are parametrised from zoi.serve.openapi (no server needed to collect them), and
a test checks that the live document has exactly those, so a new route is fuzzed too.
(schemathesis.pytest.from_fixture is not used: 4.32.5 sets Node._nodeid, gone in pytest 9.2.)
"""

from __future__ import annotations

from collections import Counter

import pytest

schemathesis = pytest.importorskip("schemathesis")
httpx = pytest.importorskip("httpx")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from schemathesis import GenerationMode  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402
from schemathesis.specs.openapi.checks import (  # noqa: E402
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from zoi.bench.loadtest import ServerProcess  # noqa: E402
from zoi.serve.openapi import operations  # noqa: E402

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]
OPERATIONS = sorted(
    (method.upper(), path)
    for path, item in operations("m", 8).items()
    for method in item
    if method != "parameters"
)
FUZZ = settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)


@pytest.fixture(scope="module")
def api_server(small_bert, device, tmp_path_factory):
    import zoi

    art = zoi.compile(small_bert, device="reference", max_tokens=64).save(
        tmp_path_factory.mktemp("schemathesis") / "art"
    )
    srv = ServerProcess(
        str(art),
        env={"ZOI_DEVICE": device, "ZOI_LOG_LEVEL": "warning"},
        log_path=art.parent / "server.log",
    )
    yield srv
    assert srv.stop() == 0, srv.log()[-3000:]


def test_the_live_document_has_every_operation(api_server):
    doc = httpx.get(api_server.url + "/openapi.json", timeout=30).json()
    live = sorted((m.upper(), p) for p, item in doc["paths"].items() for m in item)
    assert live == OPERATIONS


@pytest.mark.parametrize(("method", "path"), OPERATIONS, ids=[f"{m} {p}" for m, p in OPERATIONS])
def test_route_conforms_to_its_openapi_description(api_server, method, path):
    # a schema per route: schemathesis leaves the document's own URL out of the one it loads from
    doc = httpx.get(api_server.url + "/openapi.json", timeout=30).json()
    op = schemathesis.openapi.from_dict(doc)[path][method]
    cases = st.one_of(
        op.as_strategy(generation_mode=GenerationMode.POSITIVE),
        op.as_strategy(generation_mode=GenerationMode.NEGATIVE),
    )

    seen: Counter = Counter()

    @FUZZ
    @given(case=cases)
    def run(case):
        r = case.call_and_validate(base_url=api_server.url, checks=CHECKS, timeout=30)
        seen[r.status_code] += 1

    run()
    if seen[200] == 0:
        # the mixed run drew few valid cases (KServe infer: shape and data must agree, which
        # random generation rarely hits): a longer run of valid cases only, same checks
        @settings(FUZZ, max_examples=150)
        @given(case=op.as_strategy(generation_mode=GenerationMode.POSITIVE))
        def run_valid(case):
            r = case.call_and_validate(base_url=api_server.url, checks=CHECKS, timeout=30)
            seen[r.status_code] += 1

        run_valid()
    # the valid cases reach the engine: a description that rejected every real request (or a
    # server that refused them) would otherwise pass on 4xx alone
    assert seen[200] >= 1, dict(seen)
