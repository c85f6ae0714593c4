"""The generator API: `zoi.compile(decoder_folder)` -> Generator with generate / stream / chat.

generate() runs its prompts together on the backend's paged pool: prompts the pool cannot admit
yet wait in a queue and join when running ones finish (one that could never fit raises
KVPoolFull). stream() yields text deltas that never split a UTF-8 character; stop strings are
matched across deltas and never emitted.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import replace

import numpy as np

from zoi.decoder.api import DecoderBackend, FinishReason, KVPoolFull, SamplingParams
from zoi.decoder.tokenizer import DecoderTokenizer, TextStream
from zoi.errors import InputError


class Completion(str):
    """The generated text (a str) with `token_ids`, `prompt_ids` and `finish_reason`.

    token_ids: every token the model generated, the one that ended it (an EOS or stop token id)
    included, as vLLM's token_ids and the server's usage.completion_tokens count them; the text
    leaves that token (and a stop string) out.
    """

    token_ids: list[int]
    prompt_ids: list[int]
    finish_reason: str

    def __new__(cls, text: str, token_ids, prompt_ids, finish_reason: str):
        s = super().__new__(cls, text)
        s.token_ids, s.prompt_ids, s.finish_reason = (
            list(token_ids),
            list(prompt_ids),
            finish_reason,
        )
        return s


class _Req:
    def __init__(
        self, gen: Generator, ids: list[int], params: SamplingParams, stops: Sequence[str]
    ):
        self.ids, self.params = ids, params
        self.tokens: list[int] = []
        ends = params.stop_token_ids + (() if params.ignore_eos else tuple(gen.spec.eos_token_ids))
        self.stream = TextStream(gen.tokenizer.decode, ids, stops, ends)
        self.text: list[str] = []
        self.finish: str | None = None

    def push(self, tok: int, finish: FinishReason | None) -> str:
        self.tokens.append(tok)  # the EOS / stop token too (vLLM's count); not in the text
        out = self.stream.push(tok, finish)
        if self.stream.stopped:
            self.finish = "stop"
        elif finish is not None:
            self.finish = finish.value
        self.text.append(out)
        return out


class Generator:
    """A compiled decoder: `generate(prompts, ...)`, `stream(prompt, ...)`, `chat(messages, ...)`.
    `precision` is the word compile_decoder resolved: "fp32", "fp16", "int8" (W8A8; asked for as
    "int8" or "w8a8") or "w8" (weight-only INT8)."""

    def __init__(
        self,
        backend: DecoderBackend,
        tokenizer: DecoderTokenizer,
        name: str = "decoder",
        precision: str = "fp32",
        device: str = "cpu",
    ):
        self.backend, self.tokenizer, self.name = backend, tokenizer, name
        self.spec = backend.spec
        self.precision, self.device = precision, device
        self._ids = itertools.count()

    def __repr__(self) -> str:
        p = self.backend.pool()
        return (
            f"Generator({self.name!r}, {self.spec.arch}, {self.precision}, device={self.device!r}, "
            f"max_seq_len={self.backend.max_seq_len}, kv_blocks={p.num_blocks}x{p.block_size})"
        )

    # ---- inputs ----
    def _encode(self, prompt) -> list[int]:
        if isinstance(prompt, str):
            ids = self.tokenizer.encode(prompt)
        elif isinstance(prompt, (list, tuple, np.ndarray)) and all(
            isinstance(t, (int, np.integer)) for t in prompt
        ):
            ids = [int(t) for t in prompt]
        else:
            raise InputError("a prompt must be a string or a list of token ids")
        if not ids:
            raise InputError("the prompt is empty (no tokens): give some text")
        limit = self.backend.max_seq_len
        if len(ids) >= limit:
            raise InputError(
                f"prompt of {len(ids)} tokens is over the context limit: max_seq_len={limit} tokens "
                "(prompt + at least one new token); shorten it or compile with a larger max_seq_len"
            )
        return ids

    def _clamp(self, ids: list[int], p: SamplingParams) -> SamplingParams:
        room = self.backend.max_seq_len - len(ids)
        if p.max_new_tokens > room:
            p = replace(p, max_new_tokens=room)
        return p

    def _requests(
        self,
        prompts: list,
        max_new_tokens,
        temperature,
        top_k,
        top_p,
        stop,
        seed,
        stop_token_ids,
        ignore_eos,
    ) -> list[_Req]:
        """The checked requests of generate() and stream(): the sampling options first, then
        each prompt (encoded, its max_new_tokens clamped to the context). With a seed, prompt i
        draws with seed + i."""
        if isinstance(stop, str):
            stop = (stop,)
        stop = tuple(stop or ())
        if not all(isinstance(s, str) for s in stop):
            raise InputError("stop must be a string or a list of strings")
        if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise InputError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")
        if not (
            isinstance(temperature, (int, float)) and temperature >= 0 and np.isfinite(temperature)
        ):
            raise InputError(f"temperature must be a number >= 0, got {temperature!r}")
        if not isinstance(top_k, int) or top_k < 0:
            raise InputError(f"top_k must be an integer >= 0 (0: off), got {top_k!r}")
        if not (isinstance(top_p, (int, float)) and 0 < top_p <= 1):
            raise InputError(f"top_p must lie in (0, 1], got {top_p!r}")
        if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
            raise InputError(f"seed must be an integer, got {seed!r}")
        base = SamplingParams(
            max_new_tokens=max_new_tokens,
            temperature=float(temperature),
            top_k=top_k,
            top_p=float(top_p),
            seed=seed,
            stop=stop,
            stop_token_ids=tuple(stop_token_ids),
            ignore_eos=ignore_eos,
        )
        reqs = []
        for j, pr in enumerate(prompts):
            ids = self._encode(pr)
            p = self._clamp(ids, base if seed is None else replace(base, seed=seed + j))
            reqs.append(_Req(self, ids, p, stop))
        return reqs

    # ---- the loop ----
    def _run(self, reqs: list[_Req], on_delta=None) -> None:
        be = self.backend
        queue = deque(range(len(reqs)))
        running: dict[int, int] = {}  # seq id -> request index
        try:
            while queue or running:
                while queue:
                    i = queue[0]
                    sid = next(self._ids)
                    try:
                        be.add(sid, np.asarray(reqs[i].ids, np.int32), reqs[i].params)
                    except KVPoolFull:
                        if not running:
                            raise
                        break
                    queue.popleft()
                    running[sid] = i
                for ev in be.step():
                    i = running.get(ev.seq_id)
                    if i is None:
                        continue
                    r = reqs[i]
                    delta = r.push(ev.token_id, ev.finish)
                    if on_delta is not None and delta:
                        on_delta(i, delta)
                    if r.finish is not None:
                        if ev.finish is None:
                            be.cancel(ev.seq_id)  # a stop string: free its blocks now
                        del running[ev.seq_id]
        finally:
            for sid in list(running):
                be.cancel(sid)

    def generate(
        self,
        prompts,
        max_new_tokens: int = 64,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        stop=None,
        seed: int | None = None,
        stop_token_ids=(),
        ignore_eos: bool = False,
    ) -> list[Completion]:
        """Completions of `prompts` (a string, or a list of strings / token-id lists), in order.
        With a seed, prompt i draws with seed + i."""
        single = isinstance(prompts, str)
        plist = [prompts] if single else list(prompts)
        if not plist:
            return []
        reqs = self._requests(
            plist, max_new_tokens, temperature, top_k, top_p, stop, seed, stop_token_ids, ignore_eos
        )
        self._run(reqs)
        return [Completion("".join(r.text), r.tokens, r.ids, r.finish or "length") for r in reqs]

    def stream(
        self,
        prompt,
        max_new_tokens: int = 64,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        stop=None,
        seed: int | None = None,
        stop_token_ids=(),
        ignore_eos: bool = False,
    ) -> Iterator[str]:
        """Text deltas of one prompt as they are generated (closing the iterator cancels it)."""
        plist = [prompt]
        (r,) = self._requests(
            plist, max_new_tokens, temperature, top_k, top_p, stop, seed, stop_token_ids, ignore_eos
        )
        be = self.backend
        sid = next(self._ids)
        be.add(sid, np.asarray(r.ids, np.int32), r.params)
        done = False
        try:
            while not done:
                for ev in be.step():
                    if ev.seq_id != sid:
                        continue
                    delta = r.push(ev.token_id, ev.finish)
                    if r.finish is not None:
                        done = True
                        if ev.finish is None:
                            be.cancel(sid)
                    if delta:
                        yield delta
        finally:
            if not done:
                be.cancel(sid)

    def chat(self, messages: list[dict], stream: bool = False, **kw):
        """generate() (or stream()) of the chat template's rendering of `messages`."""
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        if stream:
            return self.stream(ids, **kw)
        return self.generate([ids], **kw)[0]
