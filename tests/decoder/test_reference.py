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
