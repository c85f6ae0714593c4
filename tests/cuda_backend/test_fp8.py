"""precision="fp8" on the CUDA backend: the FP8 kernels (quantize QMODE 5, the producers'
fp8 copies, the QUANT 8 linear) against zoi.numerics.fp8 on fresh random inputs of awkward
shapes with poisoned outputs, the plan, and a whole engine against the reference backend's
FP8 emulation. Interpreted on the CPU in CI (tests/triton_mode.py); compiled on an sm_89+
GPU by scripts/gpu_check.sh (stage fp8), where the real MiniLM runs too."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from tests import triton_mode  # noqa: E402
from tests.cuda_backend.cuda_helpers import (  # noqa: E402
    batch,
    linear_same_input_errors,
    min_cosine,
    rel,
)

from zoi.backends.reference import ReferenceBackend  # noqa: E402
from zoi.errors import BackendUnavailableError  # noqa: E402
from zoi.graph.compiled import CompiledModel  # noqa: E402
from zoi.graph.synthetic import random_weights, synthetic_spec  # noqa: E402
from zoi.numerics import fp8 as f8  # noqa: E402
from zoi.quant.fp8 import fp8_quant  # noqa: E402

COMPILED = not triton_mode.interpreted()
pytestmark = pytest.mark.skipif(
    COMPILED and not (torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9)),
    reason="compiled FP8 Triton needs an sm_89+ GPU",
)
DEV = "cuda" if COMPILED else "cpu"
# the fp32 sum of the GEMM: the interpreter adds in fp32 (order only); Hopper's fp8 wgmma
# keeps fewer bits inside each BLOCK_K chunk before the promotion to fp32
GEMM_TOL = 2e-3 if COMPILED else 2e-5
NAN8 = 0x7F  # the E4M3 NaN code: a poisoned fp8 output


def _poisoned_fp8(rows, cols):
    return torch.full((rows, cols), NAN8, dtype=torch.uint8, device=DEV).view(torch.float8_e4m3fn)


def _poisoned(shape, dtype=torch.float32):
    return torch.full(shape, float("nan"), dtype=dtype, device=DEV)


def _awkward_rows(rng, T, K):
    """fp16 rows with the cases that matter: an outlier channel, a zero row, a row whose
    scaled values reach E4M3's subnormals, exact ties after scaling, mixed magnitudes."""
    x = rng.standard_normal((T, K)).astype(np.float32) * rng.choice([0.01, 1.0, 30.0], (T, 1))
    x[:, 0] *= 40.0  # outlier channel
    if T > 2:
        x[1] = 0.0
        x[2, 1:] *= 1e-5  # mostly E4M3 subnormals after the 448 / amax scaling
    return x.astype(np.float16)


def test_require_fp8_names_the_fix():
    from zoi.backends.cuda.plan import require_fp8

    for cap in ((8, 9), (9, 0), (10, 0)):
        require_fp8(cap)
    for cap in ((8, 0), (8, 6), (7, 5)):
        with pytest.raises(BackendUnavailableError, match=r"8\.9.*'int8'.*'reference'"):
            require_fp8(cap, "an A100")


@pytest.mark.parametrize("T,K", [(1, 24), (7, 100), (33, 384)])
def test_quantize_kernel_fp8_is_exact(T, K):
    from zoi.backends.cuda.kernels.quantize import launch_quantize

    rng = np.random.default_rng(T * 1000 + K)
    x = _awkward_rows(rng, T, K)
    q, sc = _poisoned_fp8(T, K), _poisoned((T,))
    xt = torch.from_numpy(x).to(DEV)
    launch_quantize(xt, None, None, q, sc, None, T, K, mode="fp8")
    want_q, want_s = f8.quantize_act_fp8(x.astype(np.float32))
    got_q = q.float().cpu().numpy()
    assert np.isfinite(got_q).all() and np.isfinite(sc.cpu().numpy()).all()
    np.testing.assert_array_equal(got_q, want_q)
    np.testing.assert_array_equal(sc.cpu().numpy(), want_s)
    if T > 2:
        assert want_s[1] == 0 and (got_q[1] == 0).all()
        assert (np.abs(got_q[2, 1:]) < 2.0**-6).any()  # subnormals exercised


@pytest.mark.parametrize("T,H", [(5, 48), (19, 100)])
def test_add_layernorm_writes_the_fp8_copy(T, H):
    from zoi.backends.cuda.kernels.layernorm import launch_add_layernorm

    rng = np.random.default_rng(T + H)
    x = torch.from_numpy(_awkward_rows(rng, T, H)).to(DEV)
    r = torch.from_numpy(rng.standard_normal((T, H)).astype(np.float16)).to(DEV)
    lw = torch.from_numpy(1 + 0.3 * rng.standard_normal(H).astype(np.float32)).to(DEV)
    lb = torch.from_numpy(0.1 * rng.standard_normal(H).astype(np.float32)).to(DEV)
    y = _poisoned((T, H), torch.float16)
    q, sc = _poisoned_fp8(T, H), _poisoned((T,))
    launch_add_layernorm(x, r, lw, lb, y, None, T, H, 1e-12, yq=q, yq_scale=sc, q_mode="fp8")
    yy = y.float().cpu().numpy()
    assert np.isfinite(yy).all()
    want_q, want_s = f8.quantize_act_fp8(yy)  # the copy is of the stored (fp16) output
    np.testing.assert_array_equal(q.float().cpu().numpy(), want_q)
    np.testing.assert_array_equal(sc.cpu().numpy(), want_s)


@pytest.mark.parametrize("res", [False, True])
@pytest.mark.parametrize("M,N,K", [(1, 24, 40), (9, 100, 96), (37, 48, 272)])
def test_linear_fp8_matches_the_emulation(M, N, K, res):
    """gelu (ffn1), or no activation + the residual (o / ffn2), fp32 / fp16 output."""
    from zoi.backends.cuda.kernels.linear import launch_linear

    rng = np.random.default_rng(M * 7 + N + K)
    x = _awkward_rows(rng, M, K).astype(np.float32)
    w = (rng.standard_normal((N, K)) * 0.1).astype(np.float32)
    w[min(3, N - 1)] = 0.0  # a zero weight row (scale 1)
    b = rng.standard_normal(N).astype(np.float32)
    r = rng.standard_normal((M, N)).astype(np.float16)
    qa, a_s = f8.quantize_act_fp8(x)
    qw, ws = f8.quantize_weight_fp8(w)
    t8 = lambda a: torch.from_numpy(f8.e4m3_encode(a)).to(DEV).view(torch.float8_e4m3fn)  # noqa: E731
    tf = lambda a: torch.from_numpy(np.ascontiguousarray(a)).to(DEV)  # noqa: E731
    y = _poisoned((M, N), torch.float16 if res else torch.float32)
    launch_linear(
        t8(qa), tf(a_s), t8(qw), tf(ws), tf(b), tf(r) if res else None, y, None, M, N, K,
        quant=8, act="none" if res else "gelu",
    )  # fmt: skip
    got = y.float().cpu().numpy()
    assert np.isfinite(got).all()
    lin = f8.linear_fp8_emulated(x, qw, ws, b).astype(np.float64)
    if res:
        want = lin + r.astype(np.float64)
        assert rel(got, want) < max(GEMM_TOL, 2e-3)  # fp16 output
    else:
        from zoi.numerics.reference import activation

        want = activation(lin, "gelu")
        assert rel(got, want) < GEMM_TOL, rel(got, want)


def _tiny_fp8(max_tokens=64, **shape):
    spec = synthetic_spec(
        **{**dict(hidden=48, heads=3, layers=2, inter=80, act="gelu", pooling="mean"), **shape},
        type_vocab=2,
    )
    w = random_weights(spec, 0)
    return (
        CompiledModel.build(spec, w, "fp8", max_tokens, None, fp8_quant(spec)),
        CompiledModel.build(spec, w, "fp32", max_tokens, None),
    )


def _backend(model, **opts):
    from zoi.backends.cuda.backend import CudaBackend
    from zoi.backends.cuda.options import CudaOptions

    return CudaBackend(
        model,
        interpret=None if COMPILED else True,
        options=CudaOptions(**opts),
        buckets=[16, 64],
    )


def test_plan_every_linear_reads_an_fp8_copy_from_its_producer_or_a_quantize():
    m, _ = _tiny_fp8()
    be = _backend(m)
    ls = be.plan["launches"]
    lin = [la for la in ls if la.kind == "linear"]
    assert {la.quant for la in lin} == {8} and all(la.prequant for la in lin)
    assert all(la.extra["qname"].endswith("@fp8#q") for la in lin)
    writers = {la.extra["q"]: la.kind for la in ls if la.extra.get("q")}
    got = {la.extra["prefix"]: writers[la.extra["qname"]] for la in lin}
    want = {}
    for i in range(m.spec.layers):
        want.update({f"l{i}.qkv": "add_layernorm" if i else "embed", f"l{i}.o": "quantize",
                     f"l{i}.ffn1": "add_layernorm", f"l{i}.ffn2": "quantize"})  # fmt: skip
    assert got == want
    assert len(ls) == 1 + 9 * m.spec.layers + 1  # + a quantize before o and ffn2
    assert be.memory()["weights_bytes"] < 0.5 * sum(
        a.nbytes for n, a in m.weights.items() if n.endswith(".w")
    )


def test_fp8_plan_realises_the_ir_decisions():
    """zoi.graph.fusion decides the FP8 copies as INT8's ("@fp8#q", never in the loop); the
    CUDA plan realises them (or records why not)."""
    from zoi.backends.cuda.plan import describe
    from zoi.graph import fusion
    from zoi.graph.quantmode import QuantMode

    m, _ = _tiny_fp8()
    be = _backend(m)
    lin = [o for o in m.graph.ops if o.kind == "linear"]
    assert {o.attrs["quant"] for o in lin} == {QuantMode.FP8}
    assert all(o.attrs["quant_in"].endswith("@fp8#q") and not o.attrs["quant_in_loop"] for o in lin)
    for tb in be.buckets:
        ir, cu = fusion.decisions(m.graph, tb), describe(be.plan_for(tb))
        assert [c for _, c, _ in cu] == [c for _, c, _ in ir] and len(ir) == len(lin)
        plan = be.plan_for(tb)
        for (p, c, want), (_, _, got) in zip(ir, cu, strict=True):
            assert got != "loop"
            if want in ("embed", "add_layernorm"):
                assert got == want
            elif got != want:
                assert c in plan["fallbacks"], (p, c, want, got)


def test_engine_fp8_matches_the_reference_backend_fp8():
    m, m32 = _tiny_fp8()
    be = _backend(m)
    ref, ref32 = ReferenceBackend(m), ReferenceBackend(m32)
    rng = np.random.default_rng(5)
    for lens in ([1], [5, 1, 9], [40, 3, 17]):
        ids, pos, cu = batch(lens, seed=rng)
        got = be.run(ids, pos, cu, True)
        want = ref.run(ids, pos, cu, True)
        f32 = ref32.run(ids, pos, cu, True)
        assert np.isfinite(got).all() and got.shape == want.shape
        # fp16 activations move single E4M3 roundings (3 mantissa bits): close, not exact
        assert rel(got, want) < 5e-2 and min_cosine(got, want) > 0.999, (lens, rel(got, want))
        # and the GPU's FP8 is as far from FP32 as the emulation is
        assert 1 - min_cosine(got, f32) < 2 * (1 - min_cosine(want, f32)) + 1e-4
    # every linear on the very input it read: fp16 output rounding only
    errs = linear_same_input_errors(be, m, [30, 5, 20])
    assert len(errs) == 4 * m.spec.layers and max(errs.values()) < 2e-3, errs


@pytest.mark.skipif(not COMPILED, reason="the real MiniLM: compiled on the GPU only")
def test_real_minilm_fp8_on_gpu():
    from tests.conftest import minilm_path

    import zoi
    from zoi.data import eval_texts

    folder = minilm_path()  # ZOI_MINILM_DIR (the FP16 copy on the GPU machine) or the package
    texts = eval_texts()[:200]
    q = zoi.compile(folder, device="cuda", precision="fp8")
    emu = zoi.compile(folder, device="reference", precision="fp8")
    f = zoi.compile(folder, device="reference", precision="fp32")
    e_q = q.encode(texts, normalize_embeddings=True)
    e_e = emu.encode(texts, normalize_embeddings=True)
    e_f = f.encode(texts, normalize_embeddings=True)
    assert np.isfinite(e_q).all()
    c_qf = (e_q * e_f).sum(axis=1)
    c_ef = (e_e * e_f).sum(axis=1)
    c_qe = (e_q * e_e).sum(axis=1)
    print(
        {
            "gpu_vs_fp32": [float(c_qf.mean()), float(c_qf.min())],
            "emulation_vs_fp32": [float(c_ef.mean()), float(c_ef.min())],
            "gpu_vs_emulation": [float(c_qe.mean()), float(c_qe.min())],
        }
    )
    # GPU FP8 vs FP32 within a little of the emulation's FP8 vs FP32 (fp16 activations move
    # single E4M3 roundings, 3 mantissa bits: the two FP8 results are not each other's
    # reference, both are measured against FP32 (as in the tiny-model test above)
    assert c_qf.mean() > c_ef.mean() - 3e-4, (c_qf.mean(), c_ef.mean())
    assert 1 - c_qf.min() < 2 * (1 - c_ef.min()) + 1e-4, (c_qf.min(), c_ef.min())
