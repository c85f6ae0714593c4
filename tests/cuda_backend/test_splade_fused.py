"""SPLADE on the CUDA backend without [T, V] logits: the MLM decoder linear and the max over
tokens are one kernel (kernels/sparse_pool.py GEMM), so the arena holds the fp32 [B, V] result
only. The fused kernel against zoi.numerics.reference (FP16) and against the decoder linear's
own fp32 output pooled by the reference (every INT8 / FP8 path of kernels/linear.py), on
awkward shapes (an empty sequence, 1 token, vocab and K not multiples of the tiles), outputs
poisoned, rows past T NaN (never read); and the plan / arena of a SPLADE model."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from tests import triton_mode  # noqa: E402
from tests.ops.helpers import DEV, f16, poison, t  # noqa: E402

from zoi.numerics import primitives as qp  # noqa: E402
from zoi.numerics import reference as ref  # noqa: E402

COMPILED = not triton_mode.interpreted()
pytestmark = pytest.mark.skipif(
    COMPILED and not torch.cuda.is_available(), reason="compiled Triton needs a CUDA GPU"
)


def _need_fp8(mode):
    if mode == "fp8" and COMPILED and torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("compiled FP8 Triton needs an sm_89+ GPU")


def _case(lens, V, K, seed):
    rng = np.random.default_rng(seed)
    T, B = sum(lens), len(lens)
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    hdr = np.array([0, B, T, 0], np.int32)
    a = np.full((T + 3, K), np.nan, np.float32)  # rows past T: NaN, so a read of one shows
    a[:T] = rng.standard_normal((T, K))
    w = (0.3 * rng.standard_normal((V, K))).astype(np.float32)
    b = (0.5 * rng.standard_normal(V) - 1.0).astype(np.float32)  # some columns never > 0
    return T, B, cu, hdr, a, w, b


def _pool(y, cu, B):
    want = np.zeros((B, y.shape[1]))
    for i in range(B):
        if cu[i + 1] > cu[i]:
            want[i] = ref.pool(y[cu[i] : cu[i + 1]], np.array([0, cu[i + 1] - cu[i]]), "splade")[0]
    return want


LENS = [[1], [3, 0, 17], [33, 1]]


@pytest.mark.parametrize("lens", LENS)
@pytest.mark.parametrize("V,K", [(37, 40), (100, 24)])
def test_fused_fp16_matches_the_reference(lens, V, K):
    from zoi.backends.cuda.kernels import sparse_pool as k_sp

    T, B, cu, hdr, a, w, b = _case(lens, V, K, seed=sum(lens) + V)
    p = poison((B + 2, V), torch.float32)
    k_sp.launch_splade_linear(
        t(a, torch.float16), None, t(w, torch.float16), None, t(b), t(cu), t(hdr), p, T + 3,
        B + 2, V, K, quant=0,
    )  # fmt: skip
    got = p.cpu().numpy()
    want = _pool(f16(a[:T]) @ f16(w).T + b, cu, B)  # float64 logits of the fp16 operands
    assert np.isfinite(got[:B]).all() and (got[:B] >= 0).all()
    np.testing.assert_allclose(got[:B], want, rtol=1e-5, atol=1e-6)
    assert np.isnan(got[B:]).all(), "rows past B must not be written"
    assert (got[np.flatnonzero(np.diff(cu) == 0)] == 0).all()  # an empty sequence: zeros


def _linear_logits(k_lin, a16, a_amax, w, ws, b, T, V, K, quant, **kw):
    """The decoder linear's own fp32 logits [T, V] (kernels/linear.py, same precision)."""
    y = poison((T, V), torch.float32)
    k_lin.launch_linear(a16, a_amax, w, ws, b, None, y, None, T, V, K, quant=quant,
                        **kw)  # fmt: skip
    return y.cpu().numpy()


@pytest.mark.parametrize("path", ["int8", "int8_asym", "in_loop", "static", "fp8"])
def test_fused_quantised_paths_match_the_linear(path):
    """Each precision of the decoder: the fused pool equals the reference pooling of what
    kernels/linear.py computes for the same inputs (exact integer sums; fp32 epilogue)."""
    _need_fp8(path)
    from zoi.backends.cuda.kernels import linear as k_lin
    from zoi.backends.cuda.kernels import quantize as k_q
    from zoi.backends.cuda.kernels import sparse_pool as k_sp

    lens, V, K = [3, 0, 17, 1], 37, 40
    T, B, cu, hdr, a, w, b = _case(lens, V, K, seed=5)
    a16 = t(a[:T], torch.float16)
    a_amax, a_zp, colsum, kw = None, None, None, {}
    if path == "fp8":
        from zoi.numerics import fp8 as f8

        wq, ws = f8.quantize_weight_fp8(w)
        w_t = t(f8.e4m3_encode(wq)).view(torch.float8_e4m3fn)
        A = torch.empty((T, K), dtype=torch.uint8, device=DEV).view(torch.float8_e4m3fn)
    else:
        wq, ws = qp.quantize_weight(w)
        w_t = t(wq)
        A = torch.empty((T, K), dtype=torch.int8, device=DEV)
    quant = {"int8": 4, "int8_asym": 4, "in_loop": 1, "static": 2, "fp8": 8}[path]
    if quant in (4, 8):  # the int8 / fp8 copy, as the producer or a quantize launch writes it
        mode = {"int8": "dynamic", "int8_asym": "dynamic_asym", "fp8": "fp8"}[path]
        a_amax = poison((T,), torch.float32)
        a_zp = torch.zeros(T, dtype=torch.int32, device=DEV) if path == "int8_asym" else None
        k_q.launch_quantize(a16, None, None, A, a_amax, a_zp, T, K, mode=mode)
        x = A
        if a_zp is not None:
            colsum = t(qp.weight_colsum(wq).astype(np.int32))
            kw = dict(a_zp=a_zp, colsum=colsum)
    else:
        x = a16
        a_amax = t(np.abs(f16(a[:T])).max(axis=1).astype(np.float32))
        kw = dict(static_amax=2.5) if quant == 2 else {}
    y = _linear_logits(k_lin, x, a_amax, w_t, t(ws), t(b), T, V, K, quant, **kw)
    p = poison((B + 1, V), torch.float32)
    k_sp.launch_splade_linear(
        x, a_amax, w_t, t(ws), t(b), t(cu), t(hdr), p, T, B + 1, V, K, quant=quant, **kw
    )
    got = p.cpu().numpy()
    np.testing.assert_allclose(got[:B], _pool(y.astype(np.float64), cu, B), rtol=1e-6, atol=1e-7)
    assert np.isnan(got[B:]).all()


def test_fused_keeps_nan():
    from zoi.backends.cuda.kernels import sparse_pool as k_sp

    T, B, cu, hdr, a, w, b = _case([4, 5], 37, 24, seed=9)
    a[2, 7] = np.nan  # token 2 of sequence 0: every logit of the row is NaN
    p = poison((B, 37), torch.float32)
    k_sp.launch_splade_linear(
        t(a, torch.float16), None, t(w, torch.float16), None, t(b), t(cu), t(hdr), p, T, B, 37,
        24, quant=0,
    )  # fmt: skip
    got = p.cpu().numpy()
    assert np.isnan(got[0]).all() and np.isfinite(got[1]).all()


def test_splade_plan_holds_no_logits(tmp_path):
    """The plan fuses the decoder with the pool; the arena has no [T, V] buffer, SPLADE's
    output is fp32 [max_batch, V]."""
    pytest.importorskip("transformers")
    from tests.heads.builders import head_checkpoint

    import zoi
    from zoi.backends.cuda.arena import place
    from zoi.backends.cuda.plan import plan_launches

    folder, _ = head_checkpoint(tmp_path / "mlm", "bert", "mlm")
    model = zoi.compile(folder, device="reference", max_tokens=64).model
    V, T = model.spec.vocab_size, 64
    Bmax = min(model.plan.max_batch, T)
    plan = plan_launches(model)
    last = plan["launches"][-1]
    assert last.kind == "linear" and last.extra["splade"] and last.out == "sparse"
    assert last.n == V and last.extra["out_bytes"] == Bmax * V * 4
    offs, cols, total = place(plan["launches"], T)
    assert "mlm_logits" not in cols
    assert not any(c >= V and n != "sparse" for n, c in cols.items())
    assert total - Bmax * V * 4 < T * V * 2  # the rest: less than the fp16 logits alone
    assert not plan["fallbacks"].get("mlm_logits")
