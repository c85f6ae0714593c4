"""Prometheus metrics of one server (own registry, so several apps can live in one process)."""

from __future__ import annotations

from functools import partial

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

_SECONDS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)
_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
_TOKENS = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)


class Metrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        counter, gauge = partial(Counter, registry=r), partial(Gauge, registry=r)
        seconds = partial(Histogram, buckets=_SECONDS, registry=r)
        self.requests = counter("zoi_request", "HTTP inference requests received", ["route"])
        self.successes = counter(
            "zoi_request_success", "inference requests answered 200", ["route"]
        )
        self.failures = counter(
            "zoi_request_failure", "inference requests answered with an error", ["route", "status"]
        )
        self.inputs = counter("zoi_request_inputs", "inputs (sequences) received")
        self.request_tokens = counter("zoi_request_tokens", "tokens of the inputs received")
        self.in_flight = gauge(
            "zoi_requests_in_flight", "inference requests admitted, not yet answered"
        )
        self.queue_size = gauge("zoi_queue_size", "sequences waiting for the engine")
        self.queue_tokens = gauge("zoi_queue_tokens", "tokens waiting for the engine")
        self.dropped = counter(
            "zoi_dropped_requests", "queued requests dropped because the client left"
        )
        self.batch_size = Histogram(
            "zoi_batch_size", "sequences per engine call", buckets=_SIZES, registry=r
        )
        self.batch_tokens = Histogram(
            "zoi_batch_tokens", "tokens per engine call", buckets=_TOKENS, registry=r
        )
        self.tokenization_duration = seconds(
            "zoi_tokenization_duration_seconds", "time to tokenise one request"
        )
        self.queue_duration = seconds(
            "zoi_queue_duration_seconds", "time a request waited before its first engine call"
        )
        self.inference_duration = seconds(
            "zoi_inference_duration_seconds", "time of one engine call"
        )
        self.request_duration = seconds(
            "zoi_request_duration_seconds", "time from a request's arrival to its answer"
        )

    def engine_metrics(self) -> None:
        """Per-engine figures of a server with several engines (zoi.serve.replicas; labels
        engine = its index, device = e.g. cuda:1 or cpu:0); created once, on first use."""
        if hasattr(self, "engine_batches"):
            return
        r, lab = self.registry, ["engine", "device"]
        counter = partial(Counter, labelnames=lab, registry=r)
        self.engine_batches = counter("zoi_engine_batches", "engine calls")
        self.engine_sequences = counter("zoi_engine_sequences", "sequences computed")
        self.engine_tokens = counter("zoi_engine_tokens", "tokens computed")
        self.engine_failures = counter("zoi_engine_failures", "engine calls that failed")
        self.engine_busy = Gauge(
            "zoi_engine_busy", "1 while the engine runs a batch, else 0", lab, registry=r
        )
        self.engine_inference_duration = Histogram(
            "zoi_engine_inference_duration_seconds",
            "time of one engine call, per engine",
            lab,
            buckets=_SECONDS,
            registry=r,
        )

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
