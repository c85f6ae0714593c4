"""The decoder side of `zoi serve`: a DecoderService owns the backend through a Scheduler
(continuous batching on its own thread), the tokenizer and chat template, admission limits and
metrics; zoi.serve.routes_generate answers OpenAI /v1/completions and /v1/chat/completions with it.

`zoi serve DECODER_FOLDER` builds one when zoi.compile gives a decoder Generator (a Llama / Qwen2 /
Qwen3 folder); an encoder folder keeps the embedding Service.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor

from zoi.decoder.scheduler import DecoderMetrics, Scheduler
from zoi.serve.config import ServeConfig
from zoi.serve.guard import Admission
from zoi.serve.http import ApiError
from zoi.serve.metrics import _SECONDS, _SIZES, Metrics

log = logging.getLogger("zoi.serve")

INLINE_TOKENIZE_CHARS = 2048  # prompts up to this many characters are tokenised on the event loop
DEFAULT_MAX_TOKENS = 256  # max_tokens when a request does not say (clamped to the context left)


class DecoderService(Admission):
    """What the generate routes share: the scheduler, the tokenizer, the limits, the metrics.

    tokenizer: encode(text, add_special_tokens=True) -> ids, decode(ids) -> text (special ids
    skipped), apply_chat_template(messages, add_generation_prompt=True) -> text (raises InputError
    without a template), and `chat_template` (None when the folder has none), as
    zoi.decoder.tokenizer.DecoderTokenizer.
    """

    is_decoder = True

    def __init__(
        self,
        backend,
        tokenizer,
        config: ServeConfig | None = None,
        model_name=None,
        device: str = "cpu",
        precision: str = "fp32",
    ):
        config = config or ServeConfig()
        config.validate()
        self.config = config
        self.backend = backend
        self.tokenizer = tokenizer
        self.spec = backend.spec
        self.model_name = model_name or config.served_model_name or "decoder"
        self.max_seq_len = int(backend.max_seq_len)
        self.vocab_size = int(backend.spec.vocab_size)
        self.max_input_chars = int(config.max_input_chars or 32 * self.max_seq_len)
        self.device = device
        # zoi's precision words: "int8" W8A8, "w8" weight-only INT8 (shown as they are)
        self.dtype = {"fp32": "float32", "fp16": "float16"}.get(precision, precision)
        self.metrics = Metrics()
        self.decoder_metrics = DecoderMetrics(self.metrics.registry, _SECONDS, _SIZES)
        self.in_flight = 0
        self.connections = None  # a zoi.serve.guard.ConnectionTracker once serving
        self.ready = False
        self._tok_pool = ThreadPoolExecutor(1, thread_name_prefix="zoi-tokenizer")
        self.scheduler = Scheduler(
            backend,
            tokenizer.decode,
            max_waiting=config.max_waiting_requests,
            metrics=self.decoder_metrics,
        )
        self.ready = True

    @classmethod
    def from_generator(cls, gen, config: ServeConfig | None = None, model_name: str | None = None):
        """From zoi.compile(decoder_folder) (a zoi.decoder.generator.Generator)."""
        return cls(
            gen.backend,
            gen.tokenizer,
            config,
            model_name or (config.served_model_name if config else None) or gen.name,
            device=str(getattr(gen, "device", "cpu")),
            precision=str(getattr(gen, "precision", "fp32")),
        )

    @property
    def has_chat_template(self) -> bool:
        return getattr(self.tokenizer, "chat_template", None) is not None

    def close(self) -> None:
        """Finish what is left (error "unavailable") and stop the scheduler thread."""
        self.ready = False
        self.scheduler.close()
        self._tok_pool.shutdown(wait=True)

    # ---- admission: zoi.serve.guard.Admission, plus the scheduler's waiting queue ----
    def queue_full(self) -> str:
        if self.scheduler.waiting >= self.scheduler.max_waiting:
            return (
                f"{self.scheduler.waiting} requests waiting, the limit "
                f"(--max-waiting-requests {self.scheduler.max_waiting})"
            )
        return ""

    # ---- text ----
    async def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if len(text) > self.max_input_chars:
            raise ApiError(
                "too_large",
                f"the prompt has {len(text)} characters, over the cap of {self.max_input_chars} "
                "(--max-input-chars)",
                "prompt",
            )
        if len(text) <= INLINE_TOKENIZE_CHARS:
            return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens))
        loop = asyncio.get_running_loop()
        ids = await loop.run_in_executor(
            self._tok_pool,
            lambda: self.tokenizer.encode(text, add_special_tokens=add_special_tokens),
        )
        return list(ids)

    def render_chat(self, messages: list[dict]) -> str:
        """The chat template's prompt for `messages` (with the assistant's generation prompt)."""
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt=True)


def is_decoder_engine(engine) -> bool:
    """What zoi.compile gave for a decoder folder (a Generator: a backend and a tokenizer)."""
    try:
        from zoi.decoder.generator import Generator
    except ImportError:  # pragma: no cover
        return False
    return isinstance(engine, Generator)
