"""GeGLU writes the int8 copy the plan asks for (zoi.graph.fusion: glu sees whole rows, so it is
the writer of its INT8 consumer's copy): kernels/glu.py's Q_OUT against a quantize launch on
the y it stored (the same numerics, bit for bit) and zoi.numerics.primitives, over several
column chunks, every scheme, with and without the consumer's transform; and the CUDA plan of a
ModernBERT INT8 model realising the IR's decision (no quantize launch, no fallback)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from tests import triton_mode  # noqa: E402
from tests.ops.helpers import DEV, _assert_quant, f16, poison, rel, t  # noqa: E402

from zoi.numerics import reference as ref  # noqa: E402

COMPILED = not triton_mode.interpreted()
pytestmark = pytest.mark.skipif(
    COMPILED and not torch.cuda.is_available(), reason="compiled Triton needs a CUDA GPU"
)


def _need_fp8(mode):
    if mode == "fp8" and COMPILED and torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("compiled FP8 Triton needs an sm_89+ GPU")


def _bufs(T, n, mode):
    if mode == "fp8":
        q = torch.full((T, n), 0x7F, dtype=torch.uint8, device=DEV).view(torch.float8_e4m3fn)
    else:
        q = torch.full((T, n), 99, dtype=torch.int8, device=DEV)
    return q, poison((T,), torch.float32), torch.full((T,), -7, dtype=torch.int32, device=DEV)


@pytest.mark.parametrize("mode", ["dynamic", "static", "dynamic_asym", "fp8"])
@pytest.mark.parametrize("tr", ["none", "shift+mul"])
@pytest.mark.parametrize("T,n,bc", [(1, 5, 16), (7, 37, 16), (3, 70, 64)])
def test_glu_writes_the_int8_copy(mode, tr, T, n, bc):
    _need_fp8(mode)
    from zoi.backends.cuda.kernels import glu as k_glu
    from zoi.backends.cuda.kernels import quantize as k_q

    rng = np.random.default_rng(T * 7 + n)
    tb = T + 2
    x = np.zeros((tb, 2 * n), np.float32)
    x[:T] = rng.standard_normal((T, 2 * n)) * 2
    if T > 2:
        x[1] = 0.0  # a zero row: scale 0
    shift = (0.3 * rng.standard_normal(n)).astype(np.float32) if "shift" in tr else None
    mul = (0.5 + rng.random(n)).astype(np.float32) if "mul" in tr else None
    ts = None if shift is None else t(shift)
    tm = None if mul is None else t(mul)
    y = poison((tb, n), torch.float16)
    q, qs, qz = _bufs(tb, n, mode)
    cfg = dict(BLOCK_R=4, BLOCK_C=bc, num_warps=4)
    k_glu.launch_glu(
        t(x, torch.float16), y, None, T, n, "gelu", cfg=cfg, yq=q, yq_scale=qs, yq_zp=qz,
        q_mode=mode, q_shift=ts, q_mul=tm, q_static_amax=2.5,
    )  # fmt: skip
    got = y.float().cpu().numpy()
    assert rel(got[:T], ref.glu(f16(x[:T]), "gelu")) < 2e-3
    assert np.isnan(got[T:]).all() and np.isnan(qs.cpu().numpy()[T:]).all()  # rows past T
    # the copy a quantize launch makes of the stored y, bit for bit
    q2, qs2, qz2 = _bufs(T, n, mode)
    k_q.launch_quantize(y[:T], ts, tm, q2, qs2, qz2, T, n, mode=mode, static_amax=2.5)
    u8 = (lambda a: a.view(torch.uint8)) if mode == "fp8" else (lambda a: a)
    np.testing.assert_array_equal(u8(q[:T]).cpu().numpy(), u8(q2).cpu().numpy())
    np.testing.assert_array_equal(qs[:T].cpu().numpy(), qs2.cpu().numpy())
    if mode == "dynamic_asym":
        np.testing.assert_array_equal(qz[:T].cpu().numpy(), qz2.cpu().numpy())
    else:
        assert (qz.cpu().numpy() == -7).all()  # no zero point written
    if mode != "fp8":  # and zoi.numerics.primitives' (fp8: tests/cuda_backend/test_fp8.py)
        _assert_quant(got[:T], mode, shift, mul, 2.5, q[:T], qs[:T], qz[:T])


def test_glu_amax_is_stored_per_row():
    """The glu program owns whole rows: its amax is a plain store (no zeroed row needed)."""
    from zoi.backends.cuda.kernels import glu as k_glu

    T, n = 5, 37
    x = np.random.default_rng(1).standard_normal((T, 2 * n)).astype(np.float16)
    y = poison((T, n), torch.float16)
    amax = poison((T,), torch.float32)  # not zeroed
    k_glu.launch_glu(t(x), y, amax, T, n, "gelu", cfg=dict(BLOCK_R=2, BLOCK_C=16, num_warps=4))
    want = np.abs(y.float().cpu().numpy()).max(axis=1)
    np.testing.assert_array_equal(amax.cpu().numpy(), want.astype(np.float32))


def test_modernbert_int8_plan_has_glu_write_ffn2s_copy(tmp_path):
    pytest.importorskip("transformers")
    pytest.importorskip("zoi._cpu")
    from tests.archs.helpers import checkpoint

    import zoi
    from zoi.backends.cuda.plan import describe, plan_launches
    from zoi.graph import fusion

    _, folder = checkpoint("modernbert", tmp_path / "mb", seed=11)
    model = zoi.compile(folder, device="cpu", precision="int8", max_tokens=512).model
    plan = plan_launches(model)
    glus = [la for la in plan["launches"] if la.kind == "glu"]
    assert glus and all(la.extra.get("q") for la in glus)
    who = {p: w for p, _, w in describe(plan)}
    ffn2 = [p for p in who if p.endswith(".ffn2")]
    assert ffn2 and all(who[p] == "glu" for p in ffn2), who
    assert all(fusion.copy_made_by(model.graph, o, 64) == "glu" for o in model.graph.ops
               if o.kind == "linear" and o.weights["w"].endswith("ffn2.w"))  # fmt: skip
    assert not any("glu" in r for r in plan["fallbacks"].values()), plan["fallbacks"]
    read = {la.extra.get("qname") for la in plan["launches"] if la.kind == "linear"}
    assert all(la.extra["q"] in read for la in glus)
    assert not any(la.kind == "quantize" and la.ins[0].endswith(".glu")
                   for la in plan["launches"])  # fmt: skip
