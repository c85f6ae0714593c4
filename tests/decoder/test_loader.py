"""The decoder loader: RoPE tables as transformers' ROPE_INIT_FUNCTIONS, refusals naming the field."""

from __future__ import annotations

import json

import numpy as np
import pytest

from zoi.decoder.loader import is_decoder_folder, load_decoder, spec_from_config
from zoi.decoder.rope import rope_inv_freq
from zoi.decoder.synthetic import write_decoder
from zoi.errors import CheckpointError, UnsupportedModelError

BASE = {
    "model_type": "llama",
    "vocab_size": 100,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 1,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 4096,
    "rope_theta": 50000.0,
}
SCALINGS = [
    None,
    {"rope_type": "linear", "factor": 4.0},
    {"type": "dynamic", "factor": 2.0},
    {
        "rope_type": "llama3",
        "factor": 32.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 512,
    },
]


@pytest.mark.parametrize("scaling", SCALINGS)
def test_rope_inv_freq_as_transformers(tmp_path, scaling):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    cfg = dict(BASE, rope_scaling=scaling)
    spec = spec_from_config(cfg, tmp_path / "config.json")
    hf = transformers.LlamaConfig(**{k: v for k, v in cfg.items() if k != "model_type"})
    rtype = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    if rtype == "default":
        inv = 1.0 / (50000.0 ** (torch.arange(0, 16, 2, dtype=torch.int64).float() / 16))
    else:
        inv, _ = ROPE_INIT_FUNCTIONS[rtype](hf, "cpu")
    np.testing.assert_allclose(rope_inv_freq(spec), inv.numpy(), rtol=2e-7, atol=0)


def _refused(tmp_path, exc, match, **change):
    cfg = dict(BASE)
    cfg.update(change)
    with pytest.raises(exc, match=match):
        spec_from_config(cfg, tmp_path / "config.json")


def test_unsupported_configs_name_the_field(tmp_path):
    _refused(tmp_path, UnsupportedModelError, "model_type 'mistral'", model_type="mistral")
    _refused(
        tmp_path,
        UnsupportedModelError,
        "rope_type 'yarn'",
        rope_scaling={"rope_type": "yarn", "factor": 2},
    )
    _refused(tmp_path, UnsupportedModelError, "hidden_act 'gelu'", hidden_act="gelu")
    _refused(tmp_path, UnsupportedModelError, "use_sliding_window", use_sliding_window=True)
    _refused(tmp_path, UnsupportedModelError, "partial_rotary_factor", partial_rotary_factor=0.5)
    _refused(tmp_path, UnsupportedModelError, "mlp_bias", mlp_bias=True)
    _refused(tmp_path, CheckpointError, "num_key_value_heads", num_key_value_heads=3)
    _refused(tmp_path, CheckpointError, "hidden_size", hidden_size="big")
    _refused(tmp_path, CheckpointError, "rope_scaling.factor", rope_scaling={"rope_type": "linear"})
    _refused(tmp_path, CheckpointError, "missing field 'vocab_size'", vocab_size=None)


def test_folder_problems(tmp_path):
    d = write_decoder(tmp_path / "m", layers=1, hidden=32, heads=2, kv_heads=1, inter=40)
    assert is_decoder_folder(d) and not is_decoder_folder(tmp_path)
    spec, w, _ = load_decoder(d)
    assert w["lm_head.weight"].shape == (spec.vocab_size, 32)
    cfg = json.loads((d / "config.json").read_text())
    cfg["tie_word_embeddings"] = True
    (d / "config.json").write_text(json.dumps(cfg))
    _, w2, _ = load_decoder(d)
    assert w2["lm_head.weight"] is w2["model.embed_tokens.weight"]
    cfg["num_hidden_layers"] = 2
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="model.layers.1.input_layernorm.weight"):
        load_decoder(d)
    (d / "model.safetensors").unlink()
    (d / "pytorch_model.bin").write_bytes(b"x")
    with pytest.raises(CheckpointError, match="pickle"):
        load_decoder(d)


def test_transformers5_rope_parameters(tmp_path):
    cfg = {k: v for k, v in BASE.items() if k != "rope_theta"}
    s = spec_from_config(
        dict(cfg, rope_parameters={"rope_type": "default", "rope_theta": 123.0}), tmp_path / "c"
    )
    assert s.rope_theta == 123.0 and s.rope_scaling is None
    s = spec_from_config(
        dict(cfg, rope_parameters={"rope_type": "linear", "rope_theta": 7.0, "factor": 2.0}),
        tmp_path / "c",
    )
    assert s.rope_theta == 7.0 and s.rope_scaling == {"rope_type": "linear", "factor": 2.0}
