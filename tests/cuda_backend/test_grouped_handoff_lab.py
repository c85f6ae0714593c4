"""The lab's grouped int8 handoff ffn1 -> ffn2 (lab/gpu/grouped_handoff.py, a candidate
next step, measured on the GPU before it enters the product): its two kernels, symmetric and
asymmetric groups, against the float64 reference in the interpreter, outputs poisoned."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

LAB = Path(__file__).resolve().parents[2] / "lab" / "gpu"


@pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available(),
    reason="needs the Triton interpreter or a GPU",
)
def test_grouped_handoff_matches_the_reference(tmp_path):
    sys.path.insert(0, str(LAB))
    try:
        import grouped_handoff as gh
        from sweep_linear import Ctx, rel
    finally:
        sys.path.remove(str(LAB))
    ctx = Ctx(1234)
    c = gh.Case(ctx, 128, 384, 37)  # 3 groups of 128, M off every tile
    want = c.ref()
    cfg1 = dict(BLOCK_M=16, BLOCK_K=64, num_warps=4, num_stages=2)
    cfg2 = dict(BLOCK_M=16, BLOCK_N=64, num_warps=4, num_stages=2)
    errs = {}
    for asym in (False, True):
        c.poison()
        c.gq.fill_(99)
        c.gz.fill_(-7)
        c.grouped(cfg1, cfg2, asym)
        assert torch.isfinite(c.gs).all()  # every (row, group) scale written
        assert bool(torch.isfinite(c.y.float()).all())
        errs[asym] = rel(torch, c.y, want)
        if asym:  # zero points in range, codes of a row-group span [0, 255] - 128
            assert int(c.gz.min()) >= 0 and int(c.gz.max()) <= 255
    c.poison()
    c.baseline(None, None, None)
    base = rel(torch, c.y, want)
    assert errs[True] < 1e-2 and errs[False] < 2e-2 and base < 1e-2, (errs, base)
    assert errs[True] <= 1.5 * base  # finer groups, same 8 bits: no worse than per token
