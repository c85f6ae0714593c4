"""precision="fp8": the E4M3 numerics (zoi.numerics.fp8) against an independent definition
of the format, the emulated FP8 engine on the reference backend, save / load, `zoi eval
--precision fp8`, and the errors where FP8 cannot run (the CPU backend)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from tests.conftest import build_hf_model, real_sentences, save_checkpoint

from zoi.numerics import fp8 as f8


def _grid() -> np.ndarray:
    """Every finite non-negative E4M3 value, from the format's definition (not the code)."""
    sub = [k * 2.0**-9 for k in range(8)]
    normal = [(1 + m / 8) * 2.0**e for e in range(-6, 9) for m in range(8)]
    vals = np.array(sorted(set(sub + normal)), np.float64)
    return vals[vals <= 448.0]


def _nearest_even(v: np.ndarray) -> np.ndarray:
    """Round to the E4M3 grid by search: nearest value, ties to the even code."""
    g = _grid()
    a = np.minimum(np.abs(v.astype(np.float64)), 448.0)
    i = np.clip(np.searchsorted(g, a), 1, len(g) - 1)
    lo, hi = g[i - 1], g[i]
    d_lo, d_hi = a - lo, hi - a
    # the code of a grid value is its index in the grid; even code = even mantissa
    pick_hi = (d_hi < d_lo) | ((d_hi == d_lo) & (i % 2 == 0))
    return (np.sign(v) * np.where(pick_hi, hi, lo)).astype(np.float32)


def test_grid_has_the_e4m3_values():
    g = _grid()
    assert len(g) == 127 and g[-1] == 448.0 and g[1] == 2.0**-9  # 0x00 .. 0x7E
    codes = np.arange(127, dtype=np.uint8)
    np.testing.assert_array_equal(f8.e4m3_decode(codes), g.astype(np.float32))
    np.testing.assert_array_equal(f8.e4m3_encode(g.astype(np.float32)), codes)
    np.testing.assert_array_equal(f8.e4m3_encode(-g[1:].astype(np.float32)), codes[1:] | 0x80)
    assert np.isnan(f8.e4m3_decode(np.array([0x7F, 0xFF], np.uint8))).all()
    with pytest.raises(ValueError, match="not on the E4M3 grid"):
        f8.e4m3_encode(np.array([1.01], np.float32))


def test_round_is_nearest_even_with_saturation():
    g = _grid().astype(np.float32)
    mids = ((g[1:].astype(np.float64) + g[:-1]) / 2).astype(np.float32)  # exact ties
    rng = np.random.default_rng(0)
    rnd = np.concatenate(
        [rng.standard_normal(20000) * s for s in (1e-4, 3e-3, 0.1, 2.0, 60.0, 300.0)]
    ).astype(np.float32)
    near = np.concatenate([np.nextafter(mids, 0), np.nextafter(mids, 1e9)]).astype(np.float32)
    v = np.concatenate([g, mids, near, rnd, [0.0, 1e-30, 447.9, 448.0, 460.0, 464.0, 1e6]])
    v = np.concatenate([v, -v]).astype(np.float32)
    got = f8.e4m3_round(v)
    want = _nearest_even(v)
    np.testing.assert_array_equal(got, want)
    assert got.dtype == np.float32 and np.abs(got).max() == 448.0  # saturates, never NaN
    # ties go to the even code: the midpoint of 1.0 and 1.125 is 1.0; of 1.125, 1.25 -> 1.25
    np.testing.assert_array_equal(
        f8.e4m3_round(np.array([1.0625, 1.1875, 2.0**-9 * 1.5], np.float32)),
        np.array([1.0, 1.25, 2.0**-8], np.float32),
    )


def test_round_matches_torch_float8_e4m3fn():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(1)
    v = np.clip(rng.standard_normal(100000) * 50, -448, 448).astype(np.float32)
    t = torch.from_numpy(v).to(torch.float8_e4m3fn)
    np.testing.assert_array_equal(f8.e4m3_round(v), t.float().numpy())
    np.testing.assert_array_equal(f8.e4m3_encode(f8.e4m3_round(v)), t.view(torch.uint8).numpy())


def test_rows_scales_and_the_linear():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((7, 40)).astype(np.float32) * 3
    x[2] = 0.0  # a zero row: q 0, scale 0 (activations) / 1 (weights)
    x[3, 5] = 1e4  # an outlier: saturates at 448 exactly, the rest keep 3 mantissa bits
    q, s = f8.quantize_act_fp8(x)
    am = np.abs(x).max(axis=1)
    np.testing.assert_array_equal(s, np.where(am > 0, am / np.float32(448), 0).astype(np.float32))
    assert (q[2] == 0).all() and s[2] == 0 and q[3, 5] == 448.0
    assert np.abs(q).max(axis=1)[am > 0].tolist() == [448.0] * 6
    inv = np.where(am > 0, np.float32(448) / np.where(am > 0, am, 1), 0).astype(np.float32)
    np.testing.assert_array_equal(q, _nearest_even((x * inv[:, None]).astype(np.float32)))
    w = rng.standard_normal((24, 40)).astype(np.float32) * 0.05
    w[4] = 0.0
    wq, ws = f8.quantize_weight_fp8(w)
    assert ws[4] == 1.0 and (wq[4] == 0).all()
    b = rng.standard_normal(24).astype(np.float32)
    y = f8.linear_fp8_emulated(x, wq, ws, b)
    want = (q.astype(np.float64) @ wq.astype(np.float64).T).astype(np.float32)
    want = want * (s[:, None] * ws[None, :]) + b
    np.testing.assert_array_equal(y, want.astype(np.float32))
    # E4M3 keeps ~3 mantissa bits: relative error of a dot product well under 10%
    ref = x.astype(np.float64) @ w.T.astype(np.float64) + b
    err = np.abs(y - ref)[[0, 1, 4, 5, 6]].max() / np.abs(ref).max()
    assert 1e-4 < err < 0.1


def test_reference_backend_fp8_engine_save_load_and_cpu_error(tmp_path):
    import zoi

    folder = save_checkpoint(build_hf_model("bert", seed=4), tmp_path / "tiny")
    texts = real_sentences(12)
    f = zoi.compile(folder, device="reference", precision="fp32", max_tokens=512)
    q = zoi.compile(folder, device="reference", precision="fp8", max_tokens=512)
    assert q.precision == "fp8"
    assert {str(lq.scheme) for lq in q.model.quant.values()} == {"fp8"}
    assert len(q.model.quant) == 4 * q.spec.layers
    e_f = f.encode(texts, normalize_embeddings=True)
    e_q = q.encode(texts, normalize_embeddings=True)
    cos = (e_f * e_q).sum(axis=1)
    assert np.isfinite(e_q).all() and 0.99 < cos.min() and cos.max() < 1 - 1e-7  # quantised
    art = q.save(tmp_path / "art")
    meta = json.loads((art / "zoi.json").read_text())
    assert meta["precision"] == "fp8"
    back = zoi.load(art, device="reference")
    np.testing.assert_array_equal(back.encode(texts, normalize_embeddings=True), e_q)
    for run in (
        lambda: zoi.compile(folder, device="cpu", precision="fp8"),
        lambda: zoi.load(art, device="cpu"),
    ):
        with pytest.raises(ValueError, match=r"precision='fp8'.*device='cuda'.*'reference'"):
            run()


def test_fp8_artifact_with_int8_precision_is_refused(tmp_path):
    import zoi
    from zoi.errors import CheckpointError

    folder = save_checkpoint(build_hf_model("bert", seed=5), tmp_path / "tiny")
    art = zoi.compile(folder, device="reference", precision="fp8", max_tokens=512).save(
        tmp_path / "art"
    )
    meta = json.loads((art / "zoi.json").read_text())
    meta["precision"] = "int8"
    (art / "zoi.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="fp8"):
        zoi.load(art, device="reference")


def test_zoi_eval_precision_fp8(tmp_path):
    from zoi.tools.cli import main

    folder = save_checkpoint(build_hf_model("bert", seed=1), tmp_path / "tiny")
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(real_sentences(30)), encoding="utf-8")
    out = tmp_path / "r.json"
    args = ["eval", str(folder), "--texts", str(texts), "--json", str(out), "-q"]
    assert main(args + ["--precision", "fp8", "--device", "emulated"]) == 0
    rep = json.loads(out.read_text())
    assert rep["precision"] == "fp8" and rep["texts"] == 30
    assert {r["scheme"] for r in rep["layers"]} == {"fp8"}
    assert {r["weights"] for r in rep["layers"]} == {"fp8"}
    assert all(r["sqnr_eval_db"] > 15 for r in rep["layers"])
    assert 0.99 < rep["embedding"]["cos_mean"] < 1.0
    import zoi

    w = zoi.compile(folder, device="reference", precision="fp32", max_tokens=512).model.weights
    lin = [a.shape for n, a in w.items() if n.endswith(".w") and a.ndim == 2 and n[0] == "l"]
    saved = rep["fp32_weights_bytes"] - rep["weights_bytes"]  # the linears at 1 byte a value
    assert len(lin) == len(rep["layers"]) and saved == sum(3 * n * k - 4 * n for n, k in lin)
    assert rep["backend_vs_emulation_cos_min"] > 1 - 1e-6  # reference == emulation
    with pytest.raises(ValueError, match="nothing to calibrate"):
        main(args + ["--precision", "fp8", "--calibrate", str(texts)])


def test_fp32_activations_opt_in_gives_weight_only_linears():
    """QuantConfig(extra={"fp32_activations": [...]}): those linears keep INT8 weights with
    FP32 activations (the weight-only path) whatever their SQNR; the others are unchanged;
    an unknown name is refused naming the linears."""
    from tests.quant.helpers import WordTokenizer, texts, tiny_spec, tiny_weights

    from zoi.quant import QuantConfig, quantize_model

    spec = tiny_spec()
    w, tok, tx = tiny_weights(spec, seed=3), WordTokenizer(spec.vocab_size), texts(48, seed=1)
    base = dict(gptq=False, smooth_alpha=0.5, search_texts=16, sqnr_texts=48)
    rep0: dict = {}
    w0, q0 = quantize_model(spec, w, tok, tx, QuantConfig(**base), report=rep0)
    rep: dict = {}
    cfg = QuantConfig(**base, extra={"fp32_activations": ["l1.ffn2"]})
    w1, q1 = quantize_model(spec, w, tok, tx, cfg, report=rep)
    assert rep0["fallback_weight_only"] == [] and rep["fallback_weight_only"] == ["l1.ffn2"]
    q = q1["l1.ffn2"]
    assert q.scheme == "fp32" and q.info["weights"] == "int8" and "extra" in q.info["fallback"]
    assert "l1.ffn2.w_q" in w1 and "l1.ffn2.act_mul" not in w1 and "l1.ffn2.w" not in w1
    for p in q0:
        if p != "l1.ffn2":
            assert q1[p].scheme == q0[p].scheme
            np.testing.assert_array_equal(w1[p + ".w_q"], w0[p + ".w_q"])
    with pytest.raises(ValueError, match=r"names no linear.*l0\.qkv"):
        quantize_model(spec, w, tok, tx, QuantConfig(**base, extra={"fp32_activations": ["l9"]}))
