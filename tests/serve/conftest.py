"""Fixtures of the server tests: the real MiniLM engine in-process, and `zoi serve` as a subprocess."""

from __future__ import annotations

import pytest

pytest.importorskip("uvicorn")
pytest.importorskip("starlette")
pytest.importorskip("prometheus_client")

from zoi.bench.loadtest import ServerProcess  # noqa: E402

from .serve_helpers import FAIL_TOKEN, serve_device  # noqa: E402


@pytest.fixture(scope="session")
def device() -> str:
    return serve_device()


@pytest.fixture(scope="session")
def engine(device):
    import zoi

    return zoi.compile(device=device)


@pytest.fixture(scope="session")
def server(device, tmp_path_factory):
    """The real server with the bundled MiniLM, default limits, and an injected fault on token 1.

    A 5 ms queue delay makes batches form under concurrent load however fast the engine is
    (with no delay, a worker faster than the HTTP front runs each request as it arrives).
    """
    log = tmp_path_factory.mktemp("serve") / "server.log"
    srv = ServerProcess(
        env={
            "ZOI_DEVICE": device,
            "ZOI_SERVE_FAIL_ON_TOKEN": str(FAIL_TOKEN),
            "ZOI_MAX_QUEUE_DELAY_US": "5000",
            "ZOI_LOG_LEVEL": "warning",
        },
        log_path=log,
    )
    yield srv
    rc = srv.stop()
    assert rc == 0, f"server exited with {rc}:\n{srv.log()[-3000:]}"
