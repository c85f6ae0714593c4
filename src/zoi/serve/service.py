"""The inference path every route shares: admit, validate, tokenise, batch, await, time.

Small requests are tokenised on the event loop; bigger ones on one dedicated thread (the HF
tokenizer releases the GIL; its truncation setting is per instance, so each thread has its
own instance). The engine runs on the batcher's worker thread. The event loop never waits
on inference.
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
from starlette.requests import Request

from zoi.errors import InputError
from zoi.frontend.tokenizer import pack
from zoi.serve.batcher import Batcher, BatcherClosed
from zoi.serve.config import ServeConfig
from zoi.serve.guard import Admission
from zoi.serve.http import ApiError, ClientGone, dumps
from zoi.serve.metrics import Metrics
from zoi.serve.tasks import batch_tasks

log = logging.getLogger("zoi.serve")


INLINE_TOKENIZE_CHARS = 1024  # requests with at most this many characters are tokenised inline


class InjectedFault(RuntimeError):
    pass


@dataclass
class Timings:
    tokenize_s: float = 0.0
    queue_s: float = 0.0
    infer_s: float = 0.0
    total_s: float = 0.0


@dataclass
class Result:
    embeddings: np.ndarray  # float32 [n, H]
    tokens: int  # total tokens fed to the model (special tokens included)
    timings: Timings


class Service(Admission):
    def __init__(self, engine, config: ServeConfig, model_name: str | None = None, engines=None):
        """engines: several engines of the same model (one per GPU, or CPU replicas; `engine`
        is engines[0]): the batcher spreads batches over them (zoi.serve.replicas)."""
        config.validate()
        # ---- several engines ------------------------------------------------------
        if engines is not None:
            engines = list(engines)
            if not engines:
                raise ValueError("Service: engines is an empty list")
            engine = engines[0] if engine is None else engine
            if engines[0] is not engine:
                raise ValueError("Service: engine must be engines[0]")
            _check_same_model(engines)
        self.engines = engines if engines is not None else [engine]
        self.replicated = engines is not None
        # ---- end several engines ---------------------------------------------------------------
        self.engine = engine
        self.config = config
        spec = engine.spec
        self.spec = spec
        self.model_name = model_name or config.served_model_name or spec.name
        self.hidden = int(spec.hidden)
        # the longest sequence the engine runs: the model's positions, or its max_tokens when
        # smaller (an engine loaded with --max-batch-tokens below the positions)
        engine_tokens = min(int(e.max_tokens) for e in self.engines)  # every engine's
        self.max_positions = int(min(spec.max_positions, engine_tokens))
        if self.max_positions < spec.max_positions:
            log.warning(
                "the engine takes %d tokens per call, below the model's %d positions: texts are "
                "truncated to %d tokens",
                self.max_positions,
                spec.max_positions,
                self.max_positions,
            )
        self.vocab_size = int(spec.vocab_size)
        self.max_input_chars = int(config.max_input_chars or 32 * self.max_positions)
        want = int(config.max_batch_tokens or engine_tokens)
        self.max_batch_tokens = max(min(want, engine_tokens), self.max_positions)
        if want < self.max_positions:
            log.warning(
                "max_batch_tokens=%d is below the model's %d positions; using %d",
                want,
                self.max_positions,
                self.max_positions,
            )
        self.max_batch_requests = min(
            config.max_batch_requests, min(int(e.max_batch) for e in self.engines)
        )
        self.metrics = Metrics()
        self.in_flight = 0
        self.connections = None  # a zoi.serve.guard.ConnectionTracker once serving
        self.ready = False
        self._tok_pool = ThreadPoolExecutor(1, thread_name_prefix="zoi-tokenizer")
        # Small requests are tokenised right on the event loop (~50 us, against ~200 us for a
        # round trip through the tokenizer thread), by a second instance: a tokenizer's
        # truncation setting is per instance, so each thread keeps its own.
        try:
            from zoi.frontend.tokenizer import Tokenizer

            t = engine.tokenizer
            self._loop_tok = Tokenizer(
                t.json, t.max_positions, t.position_offset, tokenizer=t.choice
            )
        except Exception as e:  # pragma: no cover - an engine without the usual tokenizer
            log.warning("inline tokenisation off (%s)", e)
            self._loop_tok = None
        fail_on = config.fail_on_token
        offset = int(spec.position_offset)

        def runner(eng):
            def run(seqs: list[np.ndarray]) -> np.ndarray:
                if fail_on is not None and any(bool(np.any(s == fail_on)) for s in seqs):
                    raise InjectedFault(
                        f"injected engine failure (a sequence holds token {fail_on})"
                    )
                ids, pos, cu = pack(seqs, offset)
                # each sequence's task adapter, when its request chose one (zoi.serve.tasks)
                return eng.run_packed(ids, pos, cu, False, **batch_tasks(seqs))

            return run

        # ---- several engines: one lane per engine -------------------------------
        if self.replicated:
            from zoi.serve.replicas import ReplicaBatcher, engine_names

            self.engine_names = engine_names(self.engines)
            self.batcher = ReplicaBatcher(
                [runner(e) for e in self.engines],
                self.hidden,
                self.max_batch_tokens,
                self.max_batch_requests,
                config.max_queue_delay_us,
                self.metrics,
                names=self.engine_names,
            )
        else:
            self.engine_names = [str(engine.device)]
            self.batcher = Batcher(
                runner(engine),
                self.hidden,
                self.max_batch_tokens,
                self.max_batch_requests,
                config.max_queue_delay_us,
                self.metrics,
            )
        # ---- end several engines ---------------------------------------------------------------
        self.heads = None  # the task heads' batcher (zoi.serve.heads)
        if getattr(engine, "head", "") in ("seq_cls", "splade"):
            from zoi.serve.heads import HeadJobs

            self.heads = HeadJobs(self)
        self.ready = True

    # ---- facts for /info, /v2 ---------------------------------------------------------------
    @property
    def dtype(self) -> str:
        return {"fp32": "float32", "int8": "int8", "fp16": "float16"}.get(
            self.engine.precision, str(self.engine.precision)
        )

    @property
    def device(self) -> str:
        """cpu, cuda; with several engines their names, e.g. cuda:0,cuda:1."""
        if self.replicated:
            return ",".join(self.engine_names)
        return str(self.engine.device)

    def engines_info(self) -> list[dict]:
        """Per-engine figures for /info (several engines: zoi.serve.replicas), else []."""
        info = getattr(self.batcher, "engines_info", None)
        return info() if info is not None else []

    def close(self) -> None:
        """Answer everything queued, then stop the worker threads."""
        self.ready = False
        self.batcher.close()
        if self.heads is not None:
            self.heads.close()
        self._tok_pool.shutdown(wait=True)

    # ---- the shared inference path ------------------------------------------------------------
    def check_count(self, n: int, param: str = "input", what: str = "inputs") -> None:
        """`n` inputs (texts, token id arrays, or pairs: each is one sequence for the model)
        against --max-client-batch-size."""
        if n == 0:
            raise ApiError("empty", "input is empty; send at least one input", param)
        if n > self.config.max_client_batch_size:
            raise ApiError(
                "too_large",
                f"{n} {what} in one request is over the limit of "
                f"{self.config.max_client_batch_size} (--max-client-batch-size); split the "
                "request",
                param,
            )

    def check_texts(self, texts: list, param: str = "input", count: bool = True) -> list[str]:
        """Each text a non-empty string within --max-input-chars; count=False: the caller
        counted the inputs itself (pairs: two texts make one input)."""
        if count:
            self.check_count(len(texts), param)
        for i, t in enumerate(texts):
            if not isinstance(t, str):
                raise ApiError(
                    "validation", f"{param}[{i}] is {_jtype(t)}, expected a string", param
                )
            if not t:
                raise ApiError("empty", f"{param}[{i}] is an empty string", param)
            if len(t) > self.max_input_chars:
                raise ApiError(
                    "too_large",
                    f"{param}[{i}] has {len(t)} characters, over the cap of "
                    f"{self.max_input_chars} (--max-input-chars)",
                    param,
                )
        return texts

    def check_ids(
        self,
        seqs: list,
        truncate: bool,
        param: str = "input",
        flat: bool = False,
        hint: str = "",
    ) -> list[np.ndarray]:
        """Token id arrays: each a non-empty array of integers in [0, vocab). flat: the client
        sent one array (`seqs` is [it]), so errors name its elements as param[j]. hint: a
        sentence the route adds to the message of an id outside the vocabulary."""
        self.check_count(len(seqs), param)
        out = []
        for i, s in enumerate(seqs):
            name = param if flat else f"{param}[{i}]"
            if not isinstance(s, list):
                raise ApiError(
                    "validation",
                    f"{name} is {_jtype(s)}, expected an array of token ids (integers)",
                    param,
                )
            if not s:
                raise ApiError("empty", f"{name} is an empty array of token ids", param)
            a = None
            if all(type(x) is int for x in s):
                try:
                    a = np.asarray(s, dtype=np.int64)
                except OverflowError:  # an id past 64 bits: out of any vocabulary
                    a = None
            if a is None or a.min() < 0 or a.max() >= self.vocab_size:
                raise ApiError("validation", self._bad_id(s, name, hint), param)
            if len(a) > self.max_positions:
                if not truncate:
                    raise ApiError(
                        "too_large",
                        f"{name} has {len(a)} tokens, over the model's limit of "
                        f"{self.max_positions}; shorten it or allow truncation",
                        param,
                    )
                a = a[: self.max_positions]
            out.append(a.astype(np.int32))
        return out

    def _bad_id(self, s: list, name: str, hint: str = "") -> str:
        """The message for the first element of `s` that is not a token id of this model."""
        v = self.vocab_size
        for j, x in enumerate(s):
            if type(x) is not int:
                return (
                    f"{name}[{j}] is {_jtype(x)} ({as_json(x)}), expected a token id: an "
                    f"integer in [0, {v})"
                )
            if not 0 <= x < v:
                return (
                    f"{name}[{j}] is token id {x}, outside the vocabulary [0, {v}); send the "
                    "ids this model's tokenizer gives" + (f" ({hint})" if hint else "")
                )
        return f"{name} holds token ids outside [0, {v})"  # pragma: no cover - found above

    def check_output(self, floats: int, what: str, param: str | None = None) -> None:
        """413 before the model runs when an answer would hold more than --max-output-floats
        floats (`what` says how they add up), so one request cannot make the server build an
        answer of gigabytes."""
        limit = self.config.max_output_floats
        if floats > limit:
            raise ApiError(
                "too_large",
                f"the answer would hold {floats:,} floats ({what}), over the limit of "
                f"{limit:,} per request (--max-output-floats / ZOI_MAX_OUTPUT_FLOATS); send "
                "fewer or shorter inputs, or raise the limit",
                param,
            )

    async def tokenize(self, texts: list[str], truncate: bool) -> tuple[list[np.ndarray], float]:
        t0 = time.perf_counter()
        try:
            if self._loop_tok is not None and sum(len(t) for t in texts) <= INLINE_TOKENIZE_CHARS:
                seqs = self._loop_tok.encode_ids(texts, truncate, self.max_positions)
            else:
                loop = asyncio.get_running_loop()
                seqs = await loop.run_in_executor(
                    self._tok_pool,
                    self.engine.tokenizer.encode_ids,
                    texts,
                    truncate,
                    self.max_positions,
                )
        except InputError as e:
            raise ApiError("too_large", str(e).replace("truncate=True", "truncate: true")) from None
        dt = time.perf_counter() - t0
        self.metrics.tokenization_duration.observe(dt)
        return seqs, dt

    def check_model(self, model) -> None:
        """A request's `model` field: absent, empty or this server's name; else 404 (422 for
        a non-string)."""
        if model is not None and not isinstance(model, str):
            raise ApiError("validation", "model should be a string", "model")
        if model and model != self.model_name:
            raise ApiError(
                "not_found",
                f"the model {model!r} does not exist; this server serves {self.model_name!r}",
                "model",
            )

    def check_dims(self, dims, param: str):
        """A request's Matryoshka dimension (`dimensions`, `output_dimension`): None or 1..H."""
        if dims is not None and (type(dims) is not int or not 1 <= dims <= self.hidden):
            raise ApiError(
                "invalid",
                f"{param}={dims!r} is not supported: this model gives up to {self.hidden} "
                f"dimensions (Matryoshka: the first `{param}`, re-normalised)",
                param,
            )
        return dims

    def matryoshka(self, emb: np.ndarray, dims: int | None) -> np.ndarray:
        """The first `dims` dimensions of each row, re-normalised (None: the rows as they are)."""
        if dims is None or dims >= self.hidden:
            return emb
        emb = emb[:, :dims]
        n = np.sqrt((emb.astype(np.float64) ** 2).sum(axis=1, keepdims=True))
        return (emb / np.maximum(n, 1e-12)).astype(np.float32)

    def prompts(self) -> dict[str, str]:
        """The model's named prompts (config_sentence_transformers.json), {} if none."""
        meta = getattr(getattr(self.engine, "model", None), "meta", None) or {}
        prompts = meta.get("prompts") or {}
        return {k: v for k, v in prompts.items() if isinstance(k, str) and isinstance(v, str)}

    def prompted(self, texts: list[str], prompt_name, param: str = "prompt_name") -> list[str]:
        """`texts` behind the prompt `prompt_name` names, or behind the model's
        default_prompt_name when none is named, as sentence-transformers' encode does."""
        prompts = self.prompts()
        if prompt_name is None:
            meta = getattr(getattr(self.engine, "model", None), "meta", None) or {}
            prompt = prompts.get(meta.get("default_prompt_name") or "")
        elif not isinstance(prompt_name, str):
            raise ApiError("validation", f"{param} should be a string", param)
        elif prompt_name not in prompts:
            have = sorted(prompts) or "none"
            raise ApiError(
                "invalid",
                f"{param} {prompt_name!r} is not one of this model's prompts ({have}; from its "
                "config_sentence_transformers.json)",
                param,
            )
        else:
            prompt = prompts[prompt_name]
        return [prompt + t for t in texts] if prompt else texts

    def hf_tokenizer(self):
        """A separate HF tokenizer (offsets for /tokenize); only the tokenizer thread uses it."""
        tok = getattr(self, "_hf", None)
        if tok is None:
            from tokenizers import Tokenizer as HFTokenizer

            tok = self._hf = HFTokenizer.from_str(self.engine.tokenizer.json)
            tok.no_padding()
            tok.enable_truncation(self.max_positions)
        return tok

    async def run_in_tokenizer_thread(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self._tok_pool, fn, *args)

    async def embed(
        self,
        request: Request | None,
        seqs: list[np.ndarray],
        normalize: bool,
        tokenize_s: float = 0.0,
        t_start: float | None = None,
        batcher: Batcher | None = None,
    ) -> Result:
        """Batch `seqs` with everyone else's; the rows come back in order. batcher: the
        task heads' (zoi.serve.heads), else the embeddings'."""
        if batcher is None and getattr(self.engine, "head", ""):
            from zoi.serve.heads import need

            need(self, "this route", "")
        mv = getattr(self.engine, "multivector", None) if batcher is None else None
        if mv is not None and mv.kind == "colbert":
            raise ApiError(
                "invalid",
                f"{self.model_name} is a ColBERT model: one vector per token, no sentence "
                "embedding (its routes: /embed_multivector, /embed_all)",
            )
        batcher = batcher or self.batcher
        t_start = time.perf_counter() if t_start is None else t_start
        ntok = int(sum(len(s) for s in seqs))
        self.metrics.inputs.inc(len(seqs))
        self.metrics.request_tokens.inc(ntok)
        try:
            job = batcher.submit(seqs, normalize)
        except BatcherClosed:
            raise ApiError("unavailable", "the server is shutting down") from None
        watcher = asyncio.ensure_future(_wait_disconnect(request)) if request is not None else None
        try:
            if watcher is None:
                await asyncio.shield(job.future)
            else:
                await asyncio.wait({job.future, watcher}, return_when=asyncio.FIRST_COMPLETED)
                if not job.future.done():
                    job.cancel()
                    raise ClientGone()
        except asyncio.CancelledError:
            job.cancel()
            raise
        finally:
            if watcher is not None:
                watcher.cancel()
        exc = job.future.exception()
        if exc is not None:
            log.error("engine failure on a request of %d sequences: %s", len(seqs), exc)
            raise ApiError("backend", f"the engine failed on this request: {exc}")
        t = Timings(tokenize_s, job.queue_s, job.infer_s, time.perf_counter() - t_start)
        return Result(job.future.result(), ntok, t)


def _check_same_model(engines: list) -> None:
    """Several engines behind one server must compute the same thing."""
    a = engines[0]
    for i, e in enumerate(engines[1:], 1):
        same = (
            e.spec.name == a.spec.name
            and e.spec.hidden == a.spec.hidden
            and e.spec.vocab_size == a.spec.vocab_size
            and e.spec.max_positions == a.spec.max_positions
            and e.precision == a.precision
            and getattr(e, "head", "") == getattr(a, "head", "")
        )
        if not same:
            raise ValueError(
                f"Service: engine {i} ({e!r}) is not the same model as engine 0 ({a!r})"
            )


async def _wait_disconnect(request: Request) -> None:
    # The body has been read: the next ASGI message is http.disconnect when the client leaves.
    while True:
        msg = await request.receive()
        if msg["type"] == "http.disconnect":
            return


def as_json(v) -> str:
    """A request value as the client wrote it (JSON), for error messages."""
    return dumps(v).decode(errors="replace")


def flat_ids(items: list) -> bool:
    """A flat array of numbers (booleans too) is one sequence of token ids; check_ids then
    names any element that is not an id of the vocabulary (a float, a boolean, a negative or
    too large integer) instead of the array passing for a list of texts."""
    return bool(items) and all(isinstance(x, (int, float)) for x in items)


def _jtype(v) -> str:
    return {
        str: "a string",
        int: "an integer",
        float: "a number",
        bool: "a boolean",
        list: "an array",
        dict: "an object",
        type(None): "null",
    }.get(type(v), type(v).__name__)
