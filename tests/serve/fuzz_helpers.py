"""The schemathesis runner of the server fuzz tests (test_schemathesis.py: the encoder server,
test_generate_schemathesis.py: the decoder server). Import it after pytest.importorskip of
schemathesis and httpx.

Every answer must be no 5xx, a status code and a content type the description lists for that
operation, and a body that conforms to the documented schema of that status code.
(schemathesis.pytest.from_fixture is not used: 4.32.5 sets Node._nodeid, gone in pytest 9.2.)
"""

from __future__ import annotations

from collections import Counter

import httpx
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]
FUZZ = settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)


def operation_list(paths: dict) -> list[tuple[str, str]]:
    """[(METHOD, path)], sorted, of an OpenAPI `paths` object."""
    return sorted(
        (method.upper(), path)
        for path, item in paths.items()
        for method in item
        if method != "parameters"
    )


def live_document(url: str) -> dict:
    return httpx.get(url + "/openapi.json", timeout=30).json()


def fuzz_operation(url: str, method: str, path: str) -> Counter:
    """Valid and invalid generated requests to one operation of the live server at `url`, each
    answer checked (CHECKS); the count of answers by status code, with at least one 200."""
    # a schema per route: schemathesis leaves the document's own URL out of the one it loads from
    op = schemathesis.openapi.from_dict(live_document(url))[path][method]
    cases = st.one_of(
        op.as_strategy(generation_mode=GenerationMode.POSITIVE),
        op.as_strategy(generation_mode=GenerationMode.NEGATIVE),
    )
    seen: Counter = Counter()

    @FUZZ
    @given(case=cases)
    def run(case):
        r = case.call_and_validate(base_url=url, checks=CHECKS, timeout=30)
        seen[r.status_code] += 1

    run()
    if seen[200] == 0:
        # the mixed run drew few valid cases (KServe infer: shape and data must agree, which
        # random generation rarely hits): a longer run of valid cases only, same checks
        @settings(FUZZ, max_examples=150)
        @given(case=op.as_strategy(generation_mode=GenerationMode.POSITIVE))
        def run_valid(case):
            r = case.call_and_validate(base_url=url, checks=CHECKS, timeout=30)
            seen[r.status_code] += 1

        run_valid()
    # the valid cases reach the engine: a description that rejected every real request (or a
    # server that refused them) would otherwise pass on 4xx alone
    assert seen[200] >= 1, dict(seen)
    return seen
