"""What the embedding Service and the DecoderService share: zoi.serve.guard.Admission (one admission
logic) and the server's histogram buckets."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from zoi.serve.decoder_service import DecoderService
from zoi.serve.guard import Admission, ConnectionTracker
from zoi.serve.http import ApiError
from zoi.serve.metrics import Metrics
from zoi.serve.service import Service


class _Svc(Admission):
    def __init__(self, limit=2, waiting=""):
        self.ready = True
        self.in_flight = 0
        self.config = SimpleNamespace(max_concurrent_requests=limit)
        self.metrics = Metrics()
        self.connections = None
        self._waiting = waiting

    def queue_full(self) -> str:
        return self._waiting


def test_both_services_share_the_admission():
    for cls in (Service, DecoderService):
        assert issubclass(cls, Admission)
        for name in ("admit", "release", "can_admit"):
            assert getattr(cls, name) is getattr(Admission, name), (cls, name)
    assert DecoderService.queue_full is not Admission.queue_full  # the scheduler's queue


def test_admit_release_and_limits():
    s = _Svc(limit=2)
    assert s.can_admit() == (True, "")
    s.admit("r")
    s.admit("r")
    assert s.in_flight == 2 and s.metrics.in_flight._value.get() == 2
    ok, why = s.can_admit()
    assert not ok and "2 requests in flight" in why and "--max-concurrent-requests 2" in why
    with pytest.raises(ApiError) as e:
        s.admit("r")
    assert e.value.kind == "overloaded" and s.in_flight == 2
    s.release()
    assert s.in_flight == 1 and s.can_admit() == (True, "")
    assert s.metrics.requests.labels("r")._value.get() == 3  # refused requests are counted too


def test_queue_full_and_connections_and_shutdown():
    s = _Svc(waiting="7 requests waiting")
    assert s.can_admit() == (False, "7 requests waiting")
    s._waiting = ""
    s.connections = ConnectionTracker(total=10, per_client=0, header_timeout=1)
    s.connections.open = 9
    ok, why = s.can_admit()
    assert not ok and "9 connections open" in why
    s.connections.open = 0
    s.ready = False
    assert s.can_admit() == (False, "shutting down")
    with pytest.raises(ApiError) as e:
        s.admit("r")
    assert e.value.kind == "unavailable" and s.in_flight == 0


def test_decoder_histograms_use_the_servers_buckets():
    """DecoderMetrics has no buckets of its own: the DecoderService gives it the server's."""
    from tests.decoder.fakes import ByteTokenizer, FakeBackend

    from zoi.serve.metrics import _SECONDS, _SIZES

    svc = DecoderService(FakeBackend(), ByteTokenizer())
    try:
        les: dict = {}
        for fam in svc.metrics.registry.collect():
            for s in fam.samples:
                if s.name.endswith("_bucket") and s.labels["le"] != "+Inf":
                    les.setdefault(s.name[: -len("_bucket")], []).append(float(s.labels["le"]))
        for name in (
            "zoi_decoder_time_to_first_token_seconds",
            "zoi_decoder_step_duration_seconds",
        ):
            assert les[name] == list(_SECONDS), name
        assert les["zoi_decoder_step_batch_size"] == list(map(float, _SIZES))
        assert les["zoi_request_duration_seconds"] == list(_SECONDS)  # the server's own
    finally:
        svc.close()
