"""Server options: one table gives each option its flag, environment variable, type and default.

Precedence: command-line flag > environment variable > default. `ServeConfig.from_env()` reads
only the environment (used by tests and embedders); `zoi serve` builds its argparse options
from the same table, so a flag and its variable can never drift apart.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field


def _bool(s: str) -> bool:
    v = s.strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"expected a boolean (1/0, true/false), got {s!r}")


@dataclass
class ServeConfig:
    host: str = "127.0.0.1"
    port: int = 8080
    device: str = "cpu"
    precision: str = "fp32"
    served_model_name: str | None = None  # default: the name kept in the model / artifact
    max_batch_tokens: int | None = None  # tokens per engine call; default: the engine's max_tokens
    max_batch_requests: int = 256  # sequences per engine call (clamped to the engine's max batch)
    max_queue_delay_us: int = 0  # how long an idle worker waits for more work before running
    batch_balance: str = "auto"  # halve uneven batches (zoi.serve.batcher); auto: CPU, 1 engine
    max_concurrent_requests: int = 512  # requests admitted at once; beyond that -> 429
    max_client_batch_size: int = 512  # inputs per request; beyond that -> 413
    payload_limit: int = 2_000_000  # bytes of request body; beyond that -> 413
    auto_truncate: bool = True  # default of `truncate` when a request does not say
    compile_cache: bool = True  # an INT8 / FP8 compile is kept in the artifact cache (zoi.cache)
    calibration: str | None = None  # the INT8 compile budget (zoi.quant.config); None: default
    max_input_chars: int | None = (
        None  # per input, checked before tokenising; default 32 x positions
    )
    max_output_floats: int = 4_194_304  # floats in one answer of token vectors; more -> 413
    graceful_timeout: float = 60.0  # seconds to finish in-flight requests after SIGTERM
    gc_freeze: bool = True  # start-up objects leave the cycle collector's scans once ready
    header_timeout: float = 10.0  # seconds for a request's headers to arrive; else 408, closed
    body_timeout: float = 30.0  # seconds for a request's whole body to arrive; else 408
    max_connections: int = 4096  # open connections in all (capped by the open-file limit)
    max_connections_per_client: int = 512  # open connections from one IP address (0: no limit)
    max_header_bytes: int = 65536  # a request's line and headers; beyond that -> 431, closed
    max_url_bytes: int = 8192  # a request's URL; beyond that -> 414, closed
    log_level: str = "info"
    # decoders: the waiting queue and the compiled pool
    max_waiting_requests: int = 256  # requests waiting for KV blocks; beyond that -> 503
    max_seq_len: int | None = None  # prompt + generated tokens of one sequence
    max_running_requests: int | None = None  # sequences one decode step carries
    kv_blocks: int | None = None  # blocks in the paged KV pool
    kv_block_size: int | None = None  # tokens per KV block
    # several engines (zoi.serve.replicas): one per GPU, or N CPU engines
    gpus: str | None = None  # "all" or ids "0,1": one engine per GPU (with --device cuda)
    replicas: int | None = None  # CPU engines of one thread each (--device cpu)
    fail_on_token: int | None = field(default=None, repr=False)  # fault injection for tests only

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None, **overrides) -> ServeConfig:
        env = os.environ if env is None else env
        kw = {}
        for opt in OPTIONS:
            if opt.env in env:
                kw[opt.dest] = opt.parse(env[opt.env])
        kw.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**kw)

    def replace(self, **kw) -> ServeConfig:
        return dataclasses.replace(self, **kw)

    def validate(self) -> None:
        for name in (
            "max_batch_tokens max_batch_requests max_concurrent_requests max_client_batch_size "
            "payload_limit max_connections max_header_bytes max_url_bytes max_waiting_requests "
            "max_seq_len max_running_requests kv_blocks kv_block_size replicas max_input_chars"
        ).split():
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_queue_delay_us < 0:
            raise ValueError(f"max_queue_delay_us must be >= 0, got {self.max_queue_delay_us}")
        if self.batch_balance not in ("auto", "on", "off"):
            raise ValueError(f"batch_balance must be auto, on or off, got {self.batch_balance!r}")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in 0..65535, got {self.port}")
        if self.graceful_timeout <= 0:
            raise ValueError(f"graceful_timeout must be > 0 seconds, got {self.graceful_timeout}")
        for name in ("header_timeout", "body_timeout"):
            v = getattr(self, name)
            if not v > 0:  # also refuses NaN
                raise ValueError(f"{name} must be > 0 seconds, got {v}")
        if self.max_connections_per_client < 0:
            raise ValueError(
                f"max_connections_per_client must be >= 0 (0: no limit), got "
                f"{self.max_connections_per_client}"
            )
        if self.max_output_floats < 1:
            raise ValueError(f"max_output_floats must be >= 1, got {self.max_output_floats}")


@dataclass(frozen=True)
class Option:
    dest: str
    flag: str
    env: str
    type: type
    help: str
    choices: tuple | None = None

    def parse(self, s: str):
        try:
            v = _bool(s) if self.type is bool else self.type(s)
        except ValueError as e:
            raise ValueError(f"{self.env}={s!r}: {e}") from e
        if self.choices and v not in self.choices:
            raise ValueError(f"{self.env}={s!r}: expected one of {', '.join(self.choices)}")
        return v


def _opt(dest: str, type: type, help: str, choices: tuple | None = None, env: str = "") -> Option:
    """The option `dest` as the flag --dest-with-dashes and the variable ZOI_DEST (or env)."""
    flag = "--" + dest.replace("_", "-")
    return Option(dest, flag, env or "ZOI_" + dest.upper(), type, help, choices)


OPTIONS: tuple[Option, ...] = (
    _opt("host", str, "address to listen on"),
    _opt("port", int, "port to listen on (0: any free port, printed when ready)"),
    _opt("device", str, "where the engine runs", ("cpu", "cuda", "auto", "reference")),
    _opt(
        "precision",
        str,
        "fp32, int8 (W8A8: INT8 weights and activations), fp16 (GPU) or w8 (weight-only INT8: "
        "a decoder on the GPU), when compiling",
        ("fp32", "int8", "fp16", "w8"),
    ),
    _opt(
        "served_model_name",
        str,
        "model name clients use on every route (default: the name kept in the model or "
        "artifact, e.g. all-MiniLM-L6-v2 for the bundled model)",
    ),
    _opt(
        "max_batch_tokens",
        int,
        "most tokens packed into one engine call (default: the engine's max tokens, 4096 on "
        "the CPU, 32768 on a GPU; also sizes the engine's arena when compiling)",
    ),
    _opt("max_batch_requests", int, "most sequences packed into one engine call"),
    _opt(
        "max_queue_delay_us",
        int,
        "microseconds an idle worker waits for a fuller batch (0: run what is queued)",
    ),
    _opt(
        "batch_balance",
        str,
        "a batch of several requests takes at most half of the sequences queued or just run, so "
        "concurrent clients settle into even batches instead of alternating long and short "
        "ones: on, off, or auto (on for one CPU engine without --max-queue-delay-us; off on a "
        "GPU, where bigger batches are cheaper per sequence, and with --gpus / --replicas)",
        ("auto", "on", "off"),
    ),
    _opt("max_concurrent_requests", int, "requests in flight at once; more are answered 429"),
    _opt("max_client_batch_size", int, "inputs in one request; more are answered 413"),
    _opt("payload_limit", int, "bytes of request body; more are answered 413"),
    _opt(
        "calibration",
        str,
        "INT8 compile budget of the models it compiles: fast, default or thorough "
        "(docs/QUANT.md, 'Calibration budgets')",
        choices=("fast", "default", "thorough"),
    ),
    _opt(
        "compile_cache",
        bool,
        "keep an INT8 / FP8 compile of a model folder in the artifact cache (ZOI_CACHE_DIR, "
        "else ~/.cache/zoi) and load it from there at the next start (true/false)",
    ),
    _opt(
        "auto_truncate",
        bool,
        "truncate over-long inputs unless a request says otherwise (true/false)",
    ),
    _opt(
        "max_input_chars",
        int,
        "characters per input, checked before tokenising (default 32 x max positions)",
    ),
    _opt(
        "max_output_floats",
        int,
        "floats in one answer of per-token or per-vocabulary vectors (/embed_all: tokens x "
        "hidden size; KServe TOKEN_LOGITS, SPARSE), checked before the model runs; more are "
        "answered 413",
    ),
    _opt(
        "graceful_timeout",
        float,
        "seconds given to in-flight requests after SIGINT/SIGTERM before they are cut",
    ),
    _opt(
        "gc_freeze",
        bool,
        "once ready, move every object alive after start-up (model, tokenizer, web stack) out of "
        "Python's cycle collector's scans (gc.freeze), so a full collection while serving scans "
        "only what requests allocate instead of pausing every request for tens of ms "
        "(true/false)",
    ),
    _opt(
        "header_timeout",
        float,
        "seconds a connection has to send a request's headers; slower ones get 408 and are closed",
    ),
    _opt(
        "body_timeout",
        float,
        "seconds a request has to send its whole body; slower ones get 408 (no slot is held "
        "while a body is read)",
    ),
    _opt(
        "max_connections",
        int,
        "open connections in all (capped by the open-file limit); a new one over it first "
        "closes the oldest idle or stalled one, else it is answered 503 and closed",
    ),
    _opt(
        "max_connections_per_client",
        int,
        "open connections from one IP address (0: no limit); a new one over it first closes "
        "the oldest idle or stalled one of that address, else it is answered 503 and closed",
    ),
    _opt(
        "max_header_bytes",
        int,
        "bytes of a request's line and headers, counted as they arrive; more are answered 431 "
        "and the connection closed",
    ),
    _opt(
        "max_url_bytes",
        int,
        "bytes of a request's URL; more are answered 414 and the connection closed",
    ),
    _opt("log_level", str, "log level", ("critical", "error", "warning", "info", "debug", "trace")),
    _opt(
        "max_waiting_requests",
        int,
        "decoders: requests waiting for KV cache blocks or a batch slot; more are answered 503 "
        "with Retry-After",
    ),
    _opt(
        "max_seq_len",
        int,
        "decoders: prompt + generated tokens of one sequence (default min(2048, the model's))",
    ),
    _opt(
        "max_running_requests",
        int,
        "decoders: sequences one decode step carries (the in-flight batch; default 8)",
    ),
    _opt(
        "kv_blocks",
        int,
        "decoders: blocks of the static paged KV pool (default: room for the running batch at "
        "half the context each)",
    ),
    _opt("kv_block_size", int, "decoders: tokens per KV cache block (default 16)"),
    _opt(
        "gpus",
        str,
        "with --device cuda: 'all' or GPU ids like 0,1; one engine (weights, CUDA graphs) per "
        "GPU, batches spread over them",
    ),
    _opt(
        "replicas",
        int,
        "with --device cpu: this many CPU engines of one thread each, batches spread over them",
    ),
    _opt(
        "fail_on_token",
        int,
        "testing only: the engine call fails for any sequence holding this token id",
        env="ZOI_SERVE_FAIL_ON_TOKEN",
    ),
)
