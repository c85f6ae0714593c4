"""Prometheus metrics of one server (own registry, so several apps can live in one process)."""

from __future__ import annotations

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
        self.requests = Counter(
            "zoi_request", "HTTP inference requests received", ["route"], registry=r
        )
        self.successes = Counter(
            "zoi_request_success", "inference requests answered 200", ["route"], registry=r
        )
        self.failures = Counter(
            "zoi_request_failure",
            "inference requests answered with an error",
            ["route", "status"],
            registry=r,
        )
        self.inputs = Counter("zoi_request_inputs", "inputs (sequences) received", registry=r)
        self.request_tokens = Counter(
            "zoi_request_tokens", "tokens of the inputs received", registry=r
        )
        self.in_flight = Gauge(
            "zoi_requests_in_flight", "inference requests admitted, not yet answered", registry=r
        )
        self.queue_size = Gauge("zoi_queue_size", "sequences waiting for the engine", registry=r)
        self.queue_tokens = Gauge("zoi_queue_tokens", "tokens waiting for the engine", registry=r)
        self.dropped = Counter(
            "zoi_dropped_requests", "queued requests dropped because the client left", registry=r
        )
        self.batch_size = Histogram(
            "zoi_batch_size", "sequences per engine call", buckets=_SIZES, registry=r
        )
        self.batch_tokens = Histogram(
            "zoi_batch_tokens", "tokens per engine call", buckets=_TOKENS, registry=r
        )
        self.tokenization_duration = Histogram(
            "zoi_tokenization_duration_seconds",
            "time to tokenise one request",
            buckets=_SECONDS,
            registry=r,
        )
        self.queue_duration = Histogram(
            "zoi_queue_duration_seconds",
            "time a request waited before its first engine call",
            buckets=_SECONDS,
            registry=r,
        )
        self.inference_duration = Histogram(
            "zoi_inference_duration_seconds",
            "time of one engine call",
            buckets=_SECONDS,
            registry=r,
        )
        self.request_duration = Histogram(
            "zoi_request_duration_seconds",
            "time from a request's arrival to its answer",
            buckets=_SECONDS,
            registry=r,
        )

    def engine_metrics(self) -> None:
        """Per-engine figures of a server with several engines (zoi.serve.replicas; labels
        engine = its index, device = e.g. cuda:1 or cpu:0); created once, on first use."""
        if hasattr(self, "engine_batches"):
            return
        r, lab = self.registry, ["engine", "device"]
        self.engine_batches = Counter("zoi_engine_batches", "engine calls", lab, registry=r)
        self.engine_sequences = Counter(
            "zoi_engine_sequences", "sequences computed", lab, registry=r
        )
        self.engine_tokens = Counter("zoi_engine_tokens", "tokens computed", lab, registry=r)
        self.engine_failures = Counter(
            "zoi_engine_failures", "engine calls that failed", lab, registry=r
        )
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
