"""schemathesis against /openapi.json of a decoder server (the generate routes; the encoder server's
document is fuzzed by test_schemathesis.py). The decoder is the fake backend (tests/decoder/fakes.py)
behind the real app on a thread: every documented operation, valid and invalid generated requests,
each answer checked against the description (fuzz_helpers.CHECKS: status, content type, body
schema, no 5xx)."""

from __future__ import annotations

import pytest

pytest.importorskip("schemathesis")
pytest.importorskip("httpx")

from zoi.serve.openapi import decoder_operations  # noqa: E402

from .fuzz_helpers import fuzz_operation, live_document, operation_list  # noqa: E402
from .gen_helpers import LiveServer  # noqa: E402

OPERATIONS = operation_list(decoder_operations("m"))


@pytest.fixture(scope="module")
def api_server():
    srv = LiveServer()
    yield srv
    srv.stop()


def test_the_live_document_has_every_operation(api_server):
    assert operation_list(live_document(api_server.url)["paths"]) == OPERATIONS


@pytest.mark.parametrize(("method", "path"), OPERATIONS, ids=[f"{m} {p}" for m, p in OPERATIONS])
def test_route_conforms_to_its_openapi_description(api_server, method, path):
    fuzz_operation(api_server.url, method, path)
