"""The quantiser on each supported architecture (tiny random checkpoints through the frontend)."""

from __future__ import annotations

import numpy as np
import pytest
from tests.conftest import build_hf_model, real_sentences, save_checkpoint

from zoi.quant import quantize_model
from zoi.quant.calibrate import token_batches, tokenize
from zoi.quant.forward import run_graph


@pytest.mark.parametrize("arch", ["bert", "roberta", "distilbert"])
def test_quantised_tracks_fp32(arch, tmp_path):
    from zoi.frontend import Tokenizer, load_checkpoint
    from zoi.graph import build_graph

    folder = save_checkpoint(build_hf_model(arch, seed=4), tmp_path / arch)
    spec, w, tok_path = load_checkpoint(folder)
    tok = Tokenizer.from_file(tok_path, spec.max_positions, spec.position_offset)
    sents = real_sentences()
    rep: dict = {}
    wq, q = quantize_model(
        spec, w, tok, sents[:96], {"search_texts": 24, "sqnr_texts": 24}, report=rep
    )
    g = build_graph(spec)
    b = token_batches(tokenize(tok, sents[200:260]), spec.position_offset, 4096)[0]
    assert b[1].min() == spec.position_offset
    ref = run_graph(g, w, *b, normalize=True)
    out = run_graph(g, wq, *b, quant=q, normalize=True)
    assert np.sum(ref * out, axis=1).min() > 0.99
    assert rep["calibration"]["texts"] == 96 and set(rep["sqnr_db"]) == set(q)
