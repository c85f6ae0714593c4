"""A deterministic pure-Python DecoderBackend and a byte-level tokenizer, for testing the scheduler
and the serve routes without a model.

FakeBackend implements zoi.decoder.api exactly: a static pool of `num_blocks` blocks of `block_size`
tokens with a real free list (blocks_needed are reserved at add, returned on finish or cancel, a
double free is an assertion), at most `max_batch` sequences per step, the prefill of added sequences
in the next step(), one token per running sequence per step. The next token of a sequence is a pure
function of its prompt (and seed when sampling) and of how many tokens it has made, never of the
other sequences in the batch: a request's output is the same alone or batched.

Tokens cycle through CORPUS (UTF-8 bytes, multi-byte characters included) from a character
boundary hashed from the prompt; EOS follows the corpus' last byte. ByteTokenizer: ids 0..255 are bytes, 256 BOS,
257 EOS, so every multi-byte character spans several tokens.
"""

from __future__ import annotations

import hashlib
import threading
import time

import numpy as np

from zoi.decoder.api import (
    DecoderSpec,
    FinishReason,
    KVPoolFull,
    PoolInfo,
    SamplingParams,
    StepEvent,
)
from zoi.errors import InputError

BOS, EOS = 256, 257
VOCAB = 258
CORPUS = "The quick brown fox - naïve café, 日本語のテキスト, emoji 🎉🚀 and ü. ".encode()
TOKENS = [*CORPUS, EOS]
# a sequence starts at a character boundary of the corpus (or at its EOS): valid UTF-8 throughout
STARTS = [i for i, b in enumerate(TOKENS) if b == EOS or b & 0xC0 != 0x80]

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def fake_spec() -> DecoderSpec:
    return DecoderSpec(
        arch="llama",
        vocab_size=VOCAB,
        hidden_size=16,
        intermediate_size=32,
        num_layers=1,
        num_heads=2,
        num_kv_heads=1,
        head_dim=8,
        bos_token_id=BOS,
        eos_token_ids=(EOS,),
    )


class ByteTokenizer:
    """encode: [BOS] + UTF-8 bytes; decode: the bytes (special ids skipped), invalid UTF-8 as U+FFFD."""

    bos_token = "<s>"
    eos_token = "</s>"
    chat_template = CHAT_TEMPLATE
    eos_token_ids = (EOS,)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return ([BOS] if add_special_tokens else []) + list(text.encode())

    def decode(self, ids) -> str:
        return bytes(int(i) for i in ids if int(i) < 256).decode("utf-8", errors="replace")

    def apply_chat_template(self, messages, add_generation_prompt: bool = True) -> str:
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        t = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True).from_string(
            CHAT_TEMPLATE
        )
        return t.render(
            messages=messages, add_generation_prompt=add_generation_prompt, bos_token=self.bos_token
        )


def offset_of(prompt: np.ndarray, params: SamplingParams, salt: int) -> int:
    h = hashlib.blake2b(np.asarray(prompt, "<i4").tobytes(), digest_size=8)
    if params.temperature > 0:
        h.update(
            str(
                (
                    params.seed if params.seed is not None else salt,
                    params.temperature,
                    params.top_k,
                    params.top_p,
                )
            ).encode()
        )
    return STARTS[int.from_bytes(h.digest(), "little") % len(STARTS)]


def expected_tokens(prompt, params: SamplingParams, max_seq_len: int = 1 << 30) -> list[int]:
    """What the fake makes for this prompt alone (the oracle of the batching tests)."""
    prompt = np.asarray(prompt, np.int32)
    off, out = offset_of(prompt, params, 0), []
    n = 0
    while True:
        tok = TOKENS[(off + n) % len(TOKENS)]
        n += 1
        if tok == EOS and params.ignore_eos:
            continue
        out.append(tok)
        if (tok == EOS and not params.ignore_eos) or tok in params.stop_token_ids:
            return out
        if len(out) >= params.max_new_tokens or len(prompt) + len(out) >= max_seq_len:
            return out


class _Seq:
    def __init__(self, prompt, params, blocks, salt):
        self.prompt = prompt
        self.params = params
        self.blocks = blocks
        self.off = offset_of(prompt, params, salt)
        self.n = 0  # corpus positions consumed
        self.generated = 0
        self.prefilled = False


class FakeBackend:
    """See the module docstring. `step_delay`: seconds each step() sleeps (to interleave streams);
    `fail_steps`: step() raises on these step numbers (1-based) to test backend failures."""

    def __init__(
        self,
        num_blocks: int = 64,
        block_size: int = 4,
        max_batch: int = 8,
        max_seq_len: int = 256,
        step_delay: float = 0.0,
        fail_steps: tuple[int, ...] = (),
    ):
        self.spec = fake_spec()
        self.max_seq_len = max_seq_len
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.max_batch = max_batch
        self.step_delay = step_delay
        self.fail_steps = set(fail_steps)
        self.free = list(range(num_blocks))
        self.seqs: dict[int, _Seq] = {}
        self.steps = 0
        self.calls = 0  # every method call (an idle scheduler makes none)
        self.history: list[tuple[int, ...]] = []  # seq ids of each step, in order
        self.cancelled: list[int] = []
        self._thread = None
        self._lock = threading.Lock()

    def _enter(self):
        """The contract: one thread calls the backend. Any second thread is a test failure."""
        self.calls += 1
        me = threading.get_ident()
        if self._thread is None:
            self._thread = me
        assert self._thread == me, "DecoderBackend called from two threads"
        assert self._lock.acquire(blocking=False), "DecoderBackend called re-entrantly"
        self._lock.release()

    def pool(self) -> PoolInfo:
        self._enter()
        return PoolInfo(
            self.block_size, self.num_blocks, len(self.free), len(self.seqs), self.max_batch
        )

    def blocks_needed(self, prompt_len: int, max_new_tokens: int) -> int:
        self._enter()
        total = min(prompt_len + max_new_tokens, self.max_seq_len)
        return -(-total // self.block_size)

    def add(self, seq_id: int, prompt_ids: np.ndarray, params: SamplingParams) -> None:
        self._enter()
        prompt = np.asarray(prompt_ids)
        assert prompt.dtype == np.int32, prompt.dtype
        if seq_id in self.seqs:
            raise ValueError(f"sequence {seq_id} is already running")
        if prompt.size == 0:
            raise InputError("the prompt is empty")
        if prompt.min() < 0 or prompt.max() >= VOCAB:
            raise InputError("token ids outside the vocabulary")
        if len(prompt) + params.max_new_tokens > self.max_seq_len:
            raise InputError("prompt + max_new_tokens over max_seq_len")
        need = self.blocks_needed(len(prompt), params.max_new_tokens)
        self.calls -= 1
        if len(self.seqs) >= self.max_batch or need > len(self.free):
            raise KVPoolFull(f"{need} blocks needed, {len(self.free)} free")
        blocks = [self.free.pop() for _ in range(need)]
        self.seqs[seq_id] = _Seq(prompt.copy(), params, blocks, seq_id)

    def _release(self, seq_id: int) -> None:
        s = self.seqs.pop(seq_id)
        for b in s.blocks:
            assert b not in self.free, f"block {b} freed twice"
            self.free.append(b)

    def cancel(self, seq_id: int) -> None:
        self._enter()
        if seq_id in self.seqs:
            self.cancelled.append(seq_id)
            self._release(seq_id)

    def step(self) -> list[StepEvent]:
        self._enter()
        self.steps += 1
        if self.step_delay:
            time.sleep(self.step_delay)
        if self.steps in self.fail_steps:
            raise RuntimeError(f"injected failure at step {self.steps}")
        self.history.append(tuple(sorted(self.seqs)))
        events = []
        for sid in list(self.seqs):
            s = self.seqs[sid]
            p = s.params
            while True:
                tok = TOKENS[(s.off + s.n) % len(TOKENS)]
                s.n += 1
                if not (tok == EOS and p.ignore_eos):
                    break
            s.generated += 1
            finish = None
            if (tok in self.spec.eos_token_ids and not p.ignore_eos) or tok in p.stop_token_ids:
                finish = FinishReason.STOP
            elif s.generated >= p.max_new_tokens or len(s.prompt) + s.generated >= self.max_seq_len:
                finish = FinishReason.LENGTH
            events.append(StepEvent(sid, int(tok), finish))
            if finish is not None:
                self._release(sid)
        return events
