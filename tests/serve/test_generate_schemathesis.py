"""schemathesis against /openapi.json of a decoder server (the generate routes; the encoder server's
document is fuzzed by test_schemathesis.py). The decoder is the fake backend (tests/decoder/fakes.py)
behind the real app on a thread: every documented operation, valid and invalid generated requests,
each answer checked against the description (status, content type, body schema), no 5xx."""

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

from zoi.serve.openapi import decoder_operations  # noqa: E402

from .gen_helpers import LiveServer  # noqa: E402

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]
OPERATIONS = sorted(
    (method.upper(), path)
    for path, item in decoder_operations("m").items()
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
def api_server():
    srv = LiveServer()
    yield srv
    srv.stop()


def test_the_live_document_has_every_operation(api_server):
    doc = httpx.get(api_server.url + "/openapi.json", timeout=30).json()
    live = sorted((m.upper(), p) for p, item in doc["paths"].items() for m in item)
    assert live == OPERATIONS


@pytest.mark.parametrize(("method", "path"), OPERATIONS, ids=[f"{m} {p}" for m, p in OPERATIONS])
def test_route_conforms_to_its_openapi_description(api_server, method, path):
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

        @settings(FUZZ, max_examples=150)
        @given(case=op.as_strategy(generation_mode=GenerationMode.POSITIVE))
        def run_valid(case):
            r = case.call_and_validate(base_url=api_server.url, checks=CHECKS, timeout=30)
            seen[r.status_code] += 1

        run_valid()
    assert seen[200] >= 1, dict(seen)
