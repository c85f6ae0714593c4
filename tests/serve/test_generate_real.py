"""The generate routes end to end on a real (random-init) Llama folder: `zoi serve FOLDER` from the
command line, greedy through the server == transformers greedy, batched and alone; the scheduler
on the native CPU backend gives transformers' token ids."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("zoi._cpu")
pytest.importorskip("transformers")

from tests.decoder.dec_helpers import PROMPTS, decoder_checkpoint, hf_greedy  # noqa: E402

from zoi.bench.loadtest import ServerProcess  # noqa: E402
from zoi.decoder.api import SamplingParams  # noqa: E402
from zoi.decoder.scheduler import ListSink, Scheduler  # noqa: E402
from zoi.decoder.tokenizer import DecoderTokenizer  # noqa: E402

N = 64


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return decoder_checkpoint(tmp_path_factory, "llama_gqa")


@pytest.fixture(scope="module")
def server(folder, tmp_path_factory):
    srv = ServerProcess(
        str(folder),
        env={
            "ZOI_LOG_LEVEL": "warning",
            "ZOI_MAX_SEQ_LEN": "160",
            "ZOI_MAX_RUNNING_REQUESTS": "4",
            "ZOI_KV_BLOCKS": "48",
            "ZOI_KV_BLOCK_SIZE": "8",
        },
        log_path=tmp_path_factory.mktemp("srv") / "server.log",
    )
    yield srv
    assert srv.stop() == 0, srv.log()[-3000:]


def test_scheduler_on_the_cpu_backend_gives_transformers_greedy(folder):
    from zoi.decoder.compile import compile_decoder

    gen = compile_decoder(folder, max_seq_len=128, kv_blocks=40, block_size=8, max_batch=3)
    tok = gen.tokenizer
    s = Scheduler(gen.backend, tok.decode)
    try:
        sinks = []
        for p in PROMPTS:  # 4 requests, 3 slots: one waits and joins
            sinks.append(ListSink())
            ids = np.asarray(tok.encode(p), np.int32)
            s.submit(ids, SamplingParams(max_new_tokens=N), sinks[-1])
        gens = {}
        for p, k in zip(PROMPTS, sinks, strict=True):
            fin = k.wait(300)
            assert fin.reason == "length" and fin.completion_tokens == N
            ids = tok.encode(p)
            want = hf_greedy(folder, ids, N)
            gens[p] = k.text
            assert k.text == tok.decode(want)
    finally:
        s.close()
    assert gen.backend.pool().free_blocks == 40


def _complete(url, prompt, **kw):
    body = {"prompt": prompt, "max_tokens": N, "temperature": 0, **kw}
    r = httpx.post(url + "/v1/completions", json=body, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()


def test_zoi_serve_greedy_equals_transformers_alone_and_batched(server, folder):
    tok = DecoderTokenizer(folder)
    want = {p: tok.decode(hf_greedy(folder, tok.encode(p), N)) for p in PROMPTS}
    alone = {p: _complete(server.url, p) for p in PROMPTS[:2]}
    for p, b in alone.items():
        assert b["choices"][0]["text"] == want[p]
        assert b["usage"] == {
            "prompt_tokens": len(tok.encode(p)),
            "completion_tokens": N,
            "total_tokens": len(tok.encode(p)) + N,
        }

    async def together():
        async with httpx.AsyncClient(base_url=server.url, timeout=300) as c:
            rs = await asyncio.gather(
                *(
                    c.post(
                        "/v1/completions",
                        json={"prompt": p, "max_tokens": N, "temperature": 0, "stream": i % 2 == 0},
                    )
                    for i, p in enumerate(PROMPTS * 2)
                )
            )
        return rs

    from .gen_helpers import parse_sse

    for i, r in enumerate(asyncio.run(together())):
        assert r.status_code == 200, r.text
        p = (PROMPTS * 2)[i]
        if i % 2 == 0:
            text = "".join(c["choices"][0]["text"] for c in parse_sse(r.content))
        else:
            text = r.json()["choices"][0]["text"]
        assert text == want[p], (i, p)


def test_zoi_serve_chat_and_token_id_prompts(server, folder):
    tok = DecoderTokenizer(folder)
    msgs = [{"role": "user", "content": PROMPTS[0]}]
    ids = tok.encode(tok.apply_chat_template(msgs), add_special_tokens=False)
    r = httpx.post(
        server.url + "/v1/chat/completions",
        json={"messages": msgs, "max_tokens": 16, "temperature": 0},
        timeout=300,
    )
    assert r.status_code == 200, r.text
    b = r.json()
    assert b["choices"][0]["message"]["content"] == tok.decode(hf_greedy(folder, ids, 16))
    assert b["usage"]["prompt_tokens"] == len(ids)
    b2 = _complete(server.url, ids, max_tokens=16)
    assert b2["choices"][0]["text"] == b["choices"][0]["message"]["content"]
    # seeded sampling: same seed, same text
    s1 = _complete(server.url, PROMPTS[1], max_tokens=20, temperature=0.8, seed=7, top_k=20)
    s2 = _complete(server.url, PROMPTS[1], max_tokens=20, temperature=0.8, seed=7, top_k=20)
    assert s1["choices"][0]["text"] == s2["choices"][0]["text"]
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "x", "max_tokens": 500})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    doc = httpx.get(server.url + "/openapi.json").json()
    assert "/v1/chat/completions" in doc["paths"] and "/v1/embeddings" not in doc["paths"]
