"""The GGUF export (the llama.cpp peer of the decode benchmark) computes the same model."""

from __future__ import annotations

import numpy as np
import pytest

from zoi.decoder.gguf_export import write_gguf
from zoi.decoder.loader import load_decoder
from zoi.decoder.reference import PagedKV, ReferenceModel


@pytest.mark.parametrize("name", ["qwen2", "qwen3"])
def test_gguf_logits_match_reference(ckpt, tmp_path, name):
    llama_cpp = pytest.importorskip("llama_cpp")
    pytest.importorskip("gguf")
    f = write_gguf(ckpt(name), tmp_path / "m.gguf", "F32")
    llm = llama_cpp.Llama(model_path=str(f), n_ctx=64, n_threads=1, verbose=False, logits_all=True)
    ids = list(range(5, 30))
    llm.reset()
    llm.eval(ids)
    got = np.array(llm.scores[: len(ids)])
    spec, w, _ = load_decoder(ckpt(name))
    ref = ReferenceModel(spec, w).forward(
        PagedKV(spec, 4, 16),
        [np.arange(4, dtype=np.int32)],
        [0],
        [len(ids)],
        np.array(ids, np.int32),
        all_logits=True,
    )
    assert (got.argmax(1) == ref.argmax(1)).all()
    assert np.abs(got - ref).max() < 2e-3 * np.abs(ref).max()  # llama.cpp keeps K/V in F16


def test_gguf_refuses_rope_scaling(ckpt, tmp_path):
    pytest.importorskip("gguf")
    with pytest.raises(NotImplementedError, match="rope_scaling"):
        write_gguf(ckpt("llama_gqa"), tmp_path / "m.gguf")
