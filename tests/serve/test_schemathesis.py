"""schemathesis against /openapi.json of a live `zoi serve`: every route, valid and
invalid generated inputs, bounded in time (a few hundred requests, well under a minute).

The server runs a tiny random BERT (small_bert) on a free 127.0.0.1 port. schemathesis reads the
server's own description and, for each operation, generates requests that follow it (positive)
and requests that break it (negative: wrong types, missing fields, bad path parameters); the
checks are fuzz_helpers.CHECKS.

The operations are parametrised from zoi.serve.openapi (no server needed to collect them), and
a test checks that the live document has exactly those, so a new route is fuzzed too.
"""

from __future__ import annotations

import pytest

pytest.importorskip("schemathesis")
pytest.importorskip("httpx")

from zoi.bench.loadtest import ServerProcess  # noqa: E402
from zoi.serve.openapi import operations  # noqa: E402

from .fuzz_helpers import fuzz_operation, live_document, operation_list  # noqa: E402

OPERATIONS = operation_list(operations("m", 8))


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
    assert operation_list(live_document(api_server.url)["paths"]) == OPERATIONS


@pytest.mark.parametrize(("method", "path"), OPERATIONS, ids=[f"{m} {p}" for m, p in OPERATIONS])
def test_route_conforms_to_its_openapi_description(api_server, method, path):
    fuzz_operation(api_server.url, method, path)
