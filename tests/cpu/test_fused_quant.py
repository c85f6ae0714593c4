"""An INT8 GEMM that quantises its own output rows for the next INT8 GEMM (FFN1 -> FFN2) once a
call has >= kI8FuseQuantMinM (256) tokens: the same integers, scales and zero points as the
separate quantise step, so a big batch is bitwise equal to its sequences run alone (< 256 tokens,
the unfused path), on every ISA and quantisation scheme."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import batch, make_model, small_spec, supported_isas

from zoi.backends.cpu import CpuBackend

ISAS = supported_isas()
LENGTHS = [80, 79, 80, 3, 80, 1]  # 323 tokens: fused; each sequence alone: not


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize(
    "default_scheme,schemes,tr",
    [
        ("dynamic", {}, {}),
        ("dynamic_asym", {}, {"l0.ffn2": "mul", "l1.ffn2": "shift+mul"}),
        ("dynamic", {"l0.ffn2": "static", "l1.ffn2": "dynamic_asym"}, {"l1.ffn2": "mul"}),
    ],
)
def test_fused_output_quantisation_is_the_quantise_step(isa, default_scheme, schemes, tr):
    from zoi.quant.forward import run_graph

    m = make_model(
        small_spec(intermediate=300),
        "int8",
        max_tokens=400,
        max_batch=8,
        schemes=schemes,
        default_scheme=default_scheme,
        act_transforms=tr,
    )
    be = CpuBackend(m, isa=isa, nthreads=2)
    ids, pos, cu = batch(LENGTHS, m.spec.vocab_size, 11)
    assert cu[-1] >= 256
    full = be.run(ids, pos, cu, False)
    assert np.isfinite(full).all()
    for b in range(len(LENGTHS)):
        a, e = cu[b], cu[b + 1]
        one = be.run(ids[a:e], pos[a:e], np.array([0, e - a], np.int32), False)
        np.testing.assert_array_equal(one[0], full[b])
    want = run_graph(m.graph, m.weights, ids, pos, cu, quant=m.quant, normalize=False)
    assert np.abs(full - want).max() <= 1e-3 * max(1.0, float(np.abs(want).max()))
