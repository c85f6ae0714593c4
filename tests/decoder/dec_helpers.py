"""Random-init decoder checkpoints of awkward sizes (zoi.decoder.synthetic; transformers reads
them too) and transformers' greedy output as the oracle."""

from __future__ import annotations

import pytest

LLAMA3 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}
MODELS = {
    # GQA 6/2, untied, llama3 RoPE scaling
    "llama_gqa": dict(
        arch="llama",
        heads=6,
        kv_heads=2,
        hidden=72,
        inter=136,
        layers=3,
        tie=False,
        rope_scaling=LLAMA3,
    ),
    # MHA, tied embeddings, linear RoPE scaling, o_proj bias (attention_bias)
    "llama_tied": dict(
        arch="llama",
        heads=3,
        kv_heads=3,
        hidden=60,
        inter=97,
        layers=2,
        tie=True,
        rope_scaling={"rope_type": "linear", "factor": 2.0},
        attention_bias=True,
        seed=3,
    ),
    # q/k/v biases, MQA, tied
    "qwen2": dict(
        arch="qwen2", heads=4, kv_heads=1, hidden=64, inter=100, layers=2, tie=True, seed=1
    ),
    # q/k norm, head_dim 20 != hidden / heads, untied
    "qwen3": dict(
        arch="qwen3", heads=4, kv_heads=2, hidden=48, head_dim=20, inter=90, layers=2, seed=2
    ),
}
PROMPTS = [
    "kazo mira te",
    "lu ne so pi da gro ven shi qua ber é ü ñ 日本 kazo zo mi ra te lu",
    "x",
    "shi qua, ber! 😀 ven",
]


_MADE: dict = {}


def decoder_checkpoint(tmp_path_factory, name: str):
    """The folder of MODELS[name], written once per session (tests/decoder's `ckpt` fixture and
    the serve tests share it, and so share hf_greedy's cache)."""
    if name not in _MADE:
        from zoi.decoder.synthetic import write_decoder

        _MADE[name] = write_decoder(tmp_path_factory.mktemp(name), **MODELS[name])
    return _MADE[name]


_GREEDY: dict = {}


def hf_greedy(folder, prompt_ids: list[int], n: int) -> list[int]:
    key = (str(folder), tuple(prompt_ids), n)
    if key not in _GREEDY:
        _GREEDY[key] = _hf_greedy(folder, prompt_ids, n)
    return _GREEDY[key]


def _hf_greedy(folder, prompt_ids: list[int], n: int) -> list[int]:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    m = _hf_model(str(folder), transformers, torch)
    ids = torch.tensor([prompt_ids])
    with torch.no_grad():
        out = m.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=n,
            min_new_tokens=n,
            do_sample=False,
        )
    return out[0, len(prompt_ids) :].tolist()


def hf_logits(folder, ids: list[int]):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    m = _hf_model(str(folder), transformers, torch)
    with torch.no_grad():
        return m(torch.tensor([ids])).logits[0].numpy()


_HF = {}


def _hf_model(folder, transformers, torch):
    if folder not in _HF:
        _HF[folder] = transformers.AutoModelForCausalLM.from_pretrained(
            folder, dtype=torch.float32, attn_implementation="eager"
        ).eval()
    return _HF[folder]
