"""Variants zoi does not run are refused with a message naming the config field."""

from __future__ import annotations

import json

import numpy as np
import pytest

from zoi.errors import UnsupportedModelError
from zoi.frontend import load_checkpoint
from zoi.frontend.archs import relative_position_bucket


def _edit(folder, **kw):
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(kw)
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


@pytest.fixture(scope="module")
def folders(arch_ckpts):  # shared by the session: the tests edit copies
    return {a: arch_ckpts(a)[1] for a in ("mpnet", "modernbert", "albert", "electra")}


@pytest.mark.parametrize(
    "arch, field, value",
    [
        ("modernbert", "hidden_activation", "swiglu"),
        ("modernbert", "rope_scaling", {"rope_type": "linear", "factor": 2.0}),
        ("modernbert", "layer_types", ["sliding_attention"] * 4),
        ("mpnet", "relative_attention_num_buckets", 64),
        ("mpnet", "hidden_act", "silu"),
        ("albert", "inner_group_num", 2),
        ("electra", "position_embedding_type", "relative_key"),
    ],
)
def test_unsupported_variant_names_the_field(folders, tmp_path, arch, field, value):
    import shutil

    folder = tmp_path / arch
    shutil.copytree(folders[arch], folder)
    _edit(folder, **{field: value})
    with pytest.raises(UnsupportedModelError, match=field):
        load_checkpoint(folder)


def test_modernbert_rope_type_is_refused(folders, tmp_path):
    import shutil

    folder = tmp_path / "m"
    shutil.copytree(folders["modernbert"], folder)
    rp = {"full_attention": {"rope_type": "yarn", "rope_theta": 1e4}}
    _edit(folder, rope_parameters=rp)
    with pytest.raises(UnsupportedModelError, match="rope_parameters.full_attention.rope_type"):
        load_checkpoint(folder)


def test_deberta_v2_is_refused(tmp_path):
    import torch
    import transformers as tf

    torch.manual_seed(0)
    cfg = tf.DebertaV2Config(
        vocab_size=200, hidden_size=40, num_hidden_layers=1, num_attention_heads=5,
        intermediate_size=37,
    )  # fmt: skip
    from tests.conftest import save_checkpoint

    folder = save_checkpoint(tf.DebertaV2Model(cfg).eval(), tmp_path / "d")
    with pytest.raises(UnsupportedModelError, match="model_type 'deberta-v2'"):
        load_checkpoint(folder)


def test_buckets_match_transformers():
    import torch
    from transformers.models.mpnet.modeling_mpnet import MPNetEncoder

    rel = np.arange(-9000, 9001)
    want = MPNetEncoder.relative_position_bucket(torch.from_numpy(rel)).numpy()
    np.testing.assert_array_equal(relative_position_bucket(rel, 32, 128), want)


@pytest.mark.parametrize("arch", ["mpnet", "modernbert", "albert"])
def test_cuda_runs_the_archs_and_refuses_the_rest(folders, arch):
    """MPNet / ModernBERT / ALBERT run on the CUDA backend (tests/archs/test_cuda_archs.py);
    what it lacks is refused before any GPU work, naming the missing piece."""
    import dataclasses

    import zoi
    from zoi.backends import make_backend
    from zoi.backends.arch_support import check_cuda, cuda_missing
    from zoi.graph.ir import Graph

    eng = zoi.compile(folders[arch], device="reference", max_tokens=512)
    g = eng.model.graph
    assert cuda_missing(g) == []
    assert cuda_missing(zoi.compile(device="reference").model.graph) == []  # MiniLM
    # a graph with what no kernel does: a tanh on token rows, RoPE over an odd head_dim
    ops = list(g.ops)
    i = next(k for k, o in enumerate(ops) if o.kind == "attention")
    at = dict(ops[i].attrs, head_dim=7)
    rope = {"rope_cos": "rope.g.cos", "rope_sin": "rope.g.sin"}
    ops[i] = dataclasses.replace(ops[i], attrs=at, weights={**ops[i].weights, **rope})
    j = next(k for k, o in enumerate(ops) if o.kind == "linear")
    ops[j] = dataclasses.replace(ops[j], attrs={**ops[j].attrs, "act": "tanh"})
    bad = Graph(ops, g.buffers)
    missing = cuda_missing(bad)
    assert missing == ["RoPE with an odd head_dim", "the tanh activation in a linear kernel"]
    with pytest.raises(UnsupportedModelError, match="cuda backend does not run .*odd head_dim"):
        check_cuda(dataclasses.replace(eng.model, graph=bad))
    with pytest.raises(UnsupportedModelError, match="cuda backend does not run"):
        make_backend(dataclasses.replace(eng.model, graph=bad), "cuda")
