"""The numpy oracle and the generator on it against transformers FP32 (token-identical greedy)."""

from __future__ import annotations

import numpy as np
import pytest

from zoi.decoder.compile import compile_decoder
from zoi.decoder.loader import load_decoder
from zoi.decoder.reference import PagedKV, ReferenceModel

from .dec_helpers import MODELS, PROMPTS, hf_greedy, hf_logits


@pytest.mark.parametrize("name", list(MODELS))
def test_reference_logits_match_transformers(ckpt, name):
    spec, w, _ = load_decoder(ckpt(name))
    ids = list(range(3, 40, 2))
    ref = hf_logits(ckpt(name), ids)
    m = ReferenceModel(spec, w)
    # scattered blocks, prompt fed in two chunks (prefill then a continuation)
    kv = PagedKV(spec, 12, 4)
    table = np.array([7, 2, 9, 0, 11, 5], np.int32)
    a = m.forward(kv, [table], [0], [11], np.array(ids[:11], np.int32), all_logits=True)
    b = m.forward(kv, [table], [11], [len(ids) - 11], np.array(ids[11:], np.int32), all_logits=True)
    got = np.concatenate([a, b])
    assert np.abs(got - ref).max() < 1e-4 * max(1.0, np.abs(ref).max())


@pytest.mark.parametrize("name", list(MODELS))
def test_reference_greedy_token_identical(ckpt, name):
    g = compile_decoder(ckpt(name), device="reference", max_seq_len=256, kv_blocks=40, block_size=8)
    outs = g.generate(PROMPTS, max_new_tokens=64)
    for o in outs:
        assert len(o.token_ids) == 64 and o.finish_reason == "length"
        assert o.token_ids == hf_greedy(ckpt(name), o.prompt_ids, 64)
    alone = g.generate(PROMPTS[1], max_new_tokens=64)[0]
    assert alone.token_ids == outs[1].token_ids and str(alone) == str(outs[1])


def test_one_executor_runs_the_generation_graph(ckpt):
    """The oracle is the IR's own numpy executor on build_generate's graph: the same graph the CPU
    engine and the GPU runtime build from; without its KV cache the paged attention is refused,
    without a sampler the graph stops at the logits."""
    from zoi.decoder.ir import generate_model
    from zoi.numerics.reference import execute

    spec, w, _ = load_decoder(ckpt("qwen3"))
    m = generate_model(spec, w, 32, "fp32", max_tokens=32, max_batch=1)
    ids, pos, cu = np.array([5, 9, 4], np.int32), np.arange(3), np.array([0, 3])
    with pytest.raises(ValueError, match="KV cache"):
        execute(m.graph, m.weights, ids, pos, cu)
    kv = PagedKV(spec, 2, 16)
    kv.tables = [np.array([1, 0], np.int32)]
    env = execute(m.graph, m.weights, ids, pos, cu, paged=kv)
    assert "tokens" not in env and env["logits"].shape == (1, spec.vocab_size)
    ref = ReferenceModel(spec, w, max_seq_len=32)
    got = ref.forward(PagedKV(spec, 2, 16), [np.array([1, 0], np.int32)], [0], [3], ids)
    np.testing.assert_array_equal(got, env["logits"])
    kv.tables = [np.array([1, 0], np.int32)]
    tok = execute(m.graph, m.weights, ids, pos, cu, paged=kv, sample=lambda x: x.argmax(1))
    assert tok["tokens"].tolist() == [int(env["logits"].argmax())]
