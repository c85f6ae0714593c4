"""`zoi serve MODEL|ARTIFACT`: load or compile the engine, then serve it over HTTP (uvicorn).

Every option is also an environment variable (see zoi.serve.config.OPTIONS); a flag wins over
its variable. The server logs `zoi serve: ready on http://HOST:PORT ...` once it accepts
connections (with --port 0 the port is the one the system picked). SIGINT / SIGTERM stop
accepting, answer everything in flight and queued, then exit.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import logging
import signal
import socket
import sys
import time

from zoi.serve.config import OPTIONS, ServeConfig

log = logging.getLogger("zoi.serve")


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def register(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "serve",
        help="HTTP server with dynamic batching (OpenAI, TEI, KServe v2 routes)",
        description="Serve a model over HTTP: OpenAI /v1/embeddings, TEI /embed /tokenize /health /info, "
        "KServe v2 /v2/models/{m}/infer (with Triton's binary tensors), /metrics. A decoder folder "
        "(Llama / Qwen2 / Qwen3) is served with OpenAI /v1/completions and /v1/chat/completions "
        "instead (in-flight batching, docs/DECODER_SERVING.md). Every option "
        "can also be set by the environment variable shown.",
    )
    p.add_argument(
        "model",
        nargs="*",
        default=None,
        help="Hugging Face model folder or zoi artifact (default: bundled all-MiniLM-L6-v2; "
        "env ZOI_MODEL). Several models (NAME=PATH to name one) are served on one port, each "
        'with its own batcher, routed by the request\'s "model" (docs/SERVE.md)',
    )
    add_options(p)
    p.set_defaults(func=cmd_serve)
    return p


# options of the server process itself, not of each engine's Service: zoi deploy ray has its
# own --gpus / --replicas (one Ray replica per GPU); --gc-freeze it takes for every replica
PROCESS_OPTIONS = ("gpus", "replicas")


def add_options(p: argparse.ArgumentParser, skip: tuple[str, ...] = ()) -> None:
    defaults = ServeConfig()
    for opt in OPTIONS:
        if opt.dest in skip:
            continue
        if opt.dest == "fail_on_token":
            p.add_argument(opt.flag, dest=opt.dest, type=int, default=None, help=argparse.SUPPRESS)
            continue
        shown = getattr(defaults, opt.dest)
        text = f"{opt.help} [env {opt.env}" + ("]" if shown is None else f"; default {shown}]")
        if opt.type is bool:
            p.add_argument(
                opt.flag,
                dest=opt.dest,
                action=argparse.BooleanOptionalAction,
                default=None,
                help=text,
            )
        else:
            p.add_argument(
                opt.flag, dest=opt.dest, type=opt.type, default=None, choices=opt.choices, help=text
            )


def config_from_args(args, env=None, skip: tuple[str, ...] = ()) -> ServeConfig:
    overrides = {opt.dest: getattr(args, opt.dest, None) for opt in OPTIONS if opt.dest not in skip}
    cfg = ServeConfig.from_env(env, **overrides)
    return cfg.replace(**{k: None for k in skip}) if skip else cfg


def open_engine(model: str | None, config: ServeConfig):
    """A zoi artifact is loaded; a Hugging Face folder (or None: the bundled model) is compiled."""
    import zoi
    from zoi.engine import is_artifact

    max_tokens = config.max_batch_tokens  # None: the engine's default for the device
    if model is not None and _is_decoder(model):  # a Generator, served by routes_generate
        return zoi.compile(
            model,
            device=config.device,
            precision=config.precision,
            max_seq_len=config.max_seq_len,
            max_batch=config.max_running_requests,
            kv_blocks=config.kv_blocks,
            block_size=config.kv_block_size,
        )
    if model is not None and is_artifact(model):
        return zoi.load(model, device=config.device, max_tokens=max_tokens)
    if config.compile_cache and config.precision in ("int8", "fp8"):
        # a calibrated compile takes seconds to minutes: once per model, options and zoi
        from zoi.cache import cached_compile

        eng, how, entry = cached_compile(
            model,
            device=config.device,
            precision=config.precision,
            max_tokens=max_tokens,
            calibration=config.calibration,
        )
        _say(
            f"zoi serve: {'loaded the cached' if how == 'cached' else 'compiled and cached the'} "
            f"{config.precision} artifact {entry} (--no-compile-cache: compile at every start)"
        )
        return eng
    return zoi.compile(
        model,
        device=config.device,
        precision=config.precision,
        max_tokens=max_tokens,
        **({"calibration": config.calibration} if config.precision == "int8" else {}),
    )


def _is_decoder(model: str) -> bool:
    """A folder zoi.compile routes to zoi.decoder (the same test it makes)."""
    try:
        from zoi.decoder.compile import decoder_folder
    except ImportError:  # pragma: no cover
        return False
    return decoder_folder(model) is not None


def served_name(model: str | None, config: ServeConfig, engine) -> str:
    """The name clients use on every route: --served-model-name, else the model's own name,
    kept in the artifact (all-MiniLM-L6-v2 for the bundled model however it is reached,
    NAME for a Hugging Face id ORG/NAME, else the model folder's name at compile time)."""
    return config.served_model_name or engine.spec.name


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise OSError(f"cannot listen on {host}:{port}: {e.strerror or e}") from e
    sock.set_inheritable(True)
    return sock


def _connection_cap(want: int) -> int:
    """`want` connections, within the open-file limit (raised to its hard limit first)."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard == resource.RLIM_INFINITY or hard > soft:
            new = hard if hard != resource.RLIM_INFINITY else max(soft, 65536)
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
                soft = new
            except (ValueError, OSError):
                pass
    except ImportError:  # pragma: no cover - not on POSIX
        return want
    if soft == resource.RLIM_INFINITY:
        return want
    cap = max(16, int(soft) - 128)  # room for the model's files, logs, the engine's threads
    if want > cap:
        log.warning("max_connections=%d is over the open-file limit %d; using %d", want, soft, cap)
    return min(want, cap)


def freeze_heap() -> int:
    """Collect, then move every object alive out of the cycle collector's scans (gc.freeze);
    returns how many objects are frozen. What is alive once the server is ready (the model's
    Python objects, the tokenizer's vocabularies, numpy, the web stack: ~43 000 objects for
    MiniLM) stays alive for the process's life, yet every full (oldest-generation) collection
    walks it all: 18 ms on an idle 2-core host, 22-81 ms while serving, about once every
    2000-3000 requests, with the GIL held, so every request in flight waits that long (p99
    outliers at 8 concurrent clients). Frozen, a full collection walks only what was allocated
    since (~0 ms)."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


class Tally:
    """ASGI middleware: how many requests were answered, answered 5xx, or cut off unanswered
    (so the shutdown log says what really happened)."""

    def __init__(self, app):
        self.app = app
        self.answered = 0
        self.server_errors = 0
        self.cut = 0

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        status = []

        async def send_(msg):
            if msg["type"] == "http.response.start":
                status.append(int(msg["status"]))
            await send(msg)

        try:
            await self.app(scope, receive, send_)
        finally:
            if not status:
                self.cut += 1  # uvicorn answers it a bare 500 (or nothing)
            else:
                self.answered += 1
                self.server_errors += status[0] >= 500

    def summary(self, graceful_timeout: float) -> str:
        s = f"{self.answered} requests answered"
        if self.server_errors:
            s += f" ({self.server_errors} with a 5xx error)"
        if self.cut:
            s += (
                f"; {self.cut} cut off unanswered (graceful timeout {graceful_timeout:g} s "
                "exceeded, or the application failed)"
            )
        else:
            s += "; none cut off"
        return s


def serve(
    app,
    config: ServeConfig,
    banner: str = "",
    sock: socket.socket | None = None,
    service=None,
) -> None:
    """Run uvicorn on `app` until SIGINT/SIGTERM; log the ready line once it accepts connections."""
    import uvicorn

    from zoi.serve.guard import ConnectionTracker, make_protocol

    tracker = ConnectionTracker(
        _connection_cap(config.max_connections),
        config.max_connections_per_client,
        config.header_timeout,
        config.max_header_bytes,
        config.max_url_bytes,
    )
    for svc in [service] if service is not None else getattr(app, "services", []):
        svc.connections = tracker
    protocol = make_protocol(tracker)
    tally = app = Tally(app)
    sock = sock or _bind(config.host, config.port)
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host

    class _Server(uvicorn.Server):
        async def startup(self, sockets=None):
            await super().startup(sockets)
            if self.started:
                if config.gc_freeze:  # everything of start-up is loaded by now
                    frozen = freeze_heap()
                    log.debug("zoi serve: %d start-up objects out of the collector's scans", frozen)
                _say(f"zoi serve: ready on http://{shown}:{port} {banner}".rstrip())

        @contextlib.contextmanager
        def capture_signals(self):
            # uvicorn re-raises SIGINT/SIGTERM after its graceful shutdown; a server that has
            # answered everything exits 0 instead.
            with super().capture_signals():
                try:
                    yield
                finally:
                    stopped_by.extend(self._captured_signals)
                    self._captured_signals.clear()

    stopped_by: list = []

    ucfg = uvicorn.Config(
        app,
        log_level=config.log_level,
        access_log=config.log_level in ("debug", "trace"),
        lifespan="on",
        backlog=2048,
        timeout_keep_alive=30,
        server_header=False,
        timeout_graceful_shutdown=config.graceful_timeout,
        **({"http": protocol} if protocol is not None else {}),
    )
    server = _Server(ucfg)
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
    why = ", ".join(signal.Signals(s).name for s in stopped_by) or "exit"
    _say(f"zoi serve: stopped ({why}); " + tally.summary(config.graceful_timeout))


def cmd_serve(args) -> int:
    import os

    config = config_from_args(args)
    config.validate()
    logging.getLogger("zoi").setLevel(
        config.log_level.upper() if config.log_level != "trace" else "DEBUG"
    )
    if not logging.getLogger().handlers:
        logging.basicConfig(format="%(message)s")
    from zoi.serve.app import create_app
    from zoi.serve.service import Service

    models = list(args.model or [])
    if len(models) > 1:
        return _serve_many(models, config)
    model = (models[0] if models else None) or os.environ.get("ZOI_MODEL") or None
    from zoi.serve.replicas import open_engines, plan_engines

    plan = plan_engines(config)  # --gpus / --replicas; None: one engine
    if plan is not None and model is not None and _is_decoder(model):
        raise ValueError("--gpus / --replicas serve encoders; a decoder runs on one engine")
    sock = _bind(config.host, config.port)  # fail fast, before a long compile
    t0 = time.perf_counter()
    engines = open_engines(model, config, plan, open_engine) if plan is not None else None
    engine = engines[0] if engines else open_engine(model, config)
    from zoi.serve.decoder_service import is_decoder_engine

    if is_decoder_engine(engine):
        return _serve_decoder(engine, config, sock, t0)
    name = served_name(model, config, engine)
    service = Service(engine, config, name, engines=engines)
    app = create_app(service)
    _say(
        f"zoi serve: {engine!r}"
        + (f" x {len(engines)} engines ({service.device})" if engines else "")
        + f" as {name!r} in {time.perf_counter() - t0:.1f} s; batches of at most "
        f"{service.max_batch_tokens} tokens / {service.max_batch_requests} sequences, "
        f"queue delay {config.max_queue_delay_us} us, balanced batches "
        f"{'on' if service.batcher.balance else 'off'} (--batch-balance {config.batch_balance})"
    )
    _say(
        f"zoi serve: model name {name!r} ("
        + (
            "--served-model-name"
            if config.served_model_name
            else "kept in the model; --served-model-name changes it"
        )
        + f'): clients send "model": "{name}" to /v1/embeddings and use '
        f"/v2/models/{name}/infer; routes described at /openapi.json and /docs"
    )
    serve(
        app,
        config,
        banner=f"(model {name}, device {service.device}, {service.dtype})",
        sock=sock,
        service=service,
    )
    return 0


def _serve_decoder(gen, config: ServeConfig, sock, t0: float) -> int:
    """`zoi serve DECODER_FOLDER`: OpenAI completions and chat completions."""
    from zoi.serve.app import create_app
    from zoi.serve.decoder_service import DecoderService

    service = DecoderService.from_generator(gen, config)
    name = service.model_name
    pool = gen.backend.pool()
    _say(
        f"zoi serve: {gen!r} as {name!r} in {time.perf_counter() - t0:.1f} s; in-flight batching "
        f"of at most {pool.max_batch} sequences, KV pool {pool.num_blocks} x {pool.block_size} "
        f"tokens, context {service.max_seq_len}, at most {config.max_waiting_requests} waiting"
    )
    _say(
        f'zoi serve: model name {name!r}: clients send "model": "{name}" to /v1/completions and '
        "/v1/chat/completions; routes described at /openapi.json and /docs"
    )
    serve(
        create_app(service),
        config,
        banner=f"(model {name}, device {service.device}, {service.dtype}, decoder)",
        sock=sock,
        service=service,
    )
    return 0


def _serve_many(items: list[str], config: ServeConfig) -> int:
    """`zoi serve A B C`: every model on one port (zoi.serve.multi)."""
    from zoi.serve.app import create_app
    from zoi.serve.decoder_service import DecoderService, is_decoder_engine
    from zoi.serve.multi import MultiModelApp, check_memory, parse_models
    from zoi.serve.service import Service

    if config.served_model_name:
        raise ValueError(
            "--served-model-name names one model; with several, name each as NAME=PATH "
            "(e.g. zoi serve small=./a large=./b)"
        )
    if config.gpus is not None or (config.replicas or 1) > 1:
        raise ValueError("--gpus / --replicas serve one model; serve several models without them")
    models = parse_models(items)
    given = [n for n, _ in models if n]
    dup = sorted({n for n in given if given.count(n) > 1})
    if dup:
        raise ValueError(f"two models are named {dup[0]!r}; give each NAME=PATH a different name")
    check_memory(models, config.precision)  # before the first compile
    sock = _bind(config.host, config.port)
    entries = []
    t0 = time.perf_counter()
    for name, path in models:
        t1 = time.perf_counter()
        engine = open_engine(path, config)
        if is_decoder_engine(engine):
            svc = DecoderService.from_generator(engine, config, name)
        else:
            svc = Service(engine, config, name or served_name(path, config, engine))
        entries.append((svc.model_name, svc, create_app(svc)))
        _say(f"zoi serve: {engine!r} as {svc.model_name!r} in {time.perf_counter() - t1:.1f} s")
    app = MultiModelApp(entries, config)
    _say(
        f"zoi serve: {len(entries)} models in {time.perf_counter() - t0:.1f} s; requests pick "
        f'one by "model" (default {app.default!r}) or /v2/models/NAME/infer; served: '
        + ", ".join(app.names)
    )
    serve(app, config, banner=f"(models {', '.join(app.names)})", sock=sock)
    return 0
