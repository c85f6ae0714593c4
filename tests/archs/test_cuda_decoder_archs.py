"""The decoder architectures run as encoders (Qwen3, Gemma3, Llama, Qwen2, Mistral) on the CUDA
backend, FP16 and INT8, against the reference engine and transformers (Triton interpreter on the
CPU, compiled on a GPU: scripts/gpu_check.sh), and the kernels' decoder modes alone against
zoi.numerics.reference on awkward shapes, outputs poisoned: causal / sliding-window / grouped-KV /
q-k-norm attention, RMSNorm and the post-norm residual (add_layernorm), embeddings without a
norm, last-token pooling, the rows of the Dense modules, SiLU."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from tests.archs.decoder_helpers import DECODER_ARCHS, add_dense, decoder_checkpoint
from tests.archs.helpers import TEXTS, cosine, hf_hidden

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from tests import triton_mode  # noqa: E402
from tests.conftest import compile_int8_for_kernels, int8_features  # noqa: E402
from tests.ops.helpers import (  # noqa: E402
    DEV,
    _assert_quant,
    _qargs,
    _qbufs,
    _rand,
    _transform,
    f16,
    poison,
    rel,
    t,
)

import zoi  # noqa: E402
from zoi.backends.reference import ReferenceBackend  # noqa: E402
from zoi.frontend.archs import rope_tables  # noqa: E402
from zoi.frontend.tokenizer import pack  # noqa: E402
from zoi.graph.compiled import CompiledModel, LinearQuant  # noqa: E402
from zoi.numerics import reference as ref  # noqa: E402

pytestmark = pytest.mark.skipif(
    not triton_mode.interpreted() and not torch.cuda.is_available(),
    reason="compiled Triton needs a CUDA GPU",
)


# ---- kernels --------------------------------------------------------------------------------
def _tiles(k_attn, hdr, cu, n_seq, cfg):
    tcum = torch.full((n_seq,), -1, dtype=torch.int32, device=DEV)
    k_attn.launch_tiles(t(hdr), t(cu), tcum, n_seq, cfg)
    return tcum


# (name, heads, kv_heads, head_dim, causal, q/k norm, RoPE, window): the layers of the five
# architectures, with grouped KV 6 / 2 and 3 / 1, head_dim 12 and 16, an odd one without RoPE
ATTN_CASES = [
    ("qwen3", 6, 2, 12, True, True, True, 0),
    ("gemma3-sliding", 3, 1, 16, False, True, True, 3),
    ("mistral", 4, 2, 10, True, False, True, 3),
    ("mqa-odd-causal", 5, 1, 7, True, False, False, 0),
    ("qk-norm-no-rope", 6, 2, 12, False, True, False, 0),
    ("gqa-window", 6, 3, 16, False, False, False, 4),
]
LENS = [[1], [3, 1, 17], [2, 13, 1, 1]]  # 17: two query tiles of 16 rows, windows of 3 inside


@pytest.mark.parametrize("name,heads,kv,d,causal,qk,rope,window", ATTN_CASES)
@pytest.mark.parametrize("lens", LENS)
def test_decoder_attention_kernel(name, heads, kv, d, causal, qk, rope, window, lens):
    from zoi.backends.cuda.kernels import attention as k_attn

    rng = np.random.default_rng(sum(lens) * 7 + heads * d + kv)
    T, B = sum(lens), len(lens)
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    hdr = np.array([0, B, T, 0], np.int32)
    tb = T + 3  # rows past T belong to no sequence
    W = (heads + 2 * kv) * d
    qkv = np.zeros((tb, W), np.float32)
    qkv[:T] = rng.standard_normal((T, W)) * 1.5
    kw, args = dict(kv_heads=kv, causal=causal, window=window), {}
    if rope:
        cos, sin = rope_tables(float(rng.choice([1e4, 37.0])), d, max(lens) + 2)
        kw["rope_cs"] = (cos, sin)
        args.update(cos=t(cos), sin=t(sin))
    if qk:
        qn, kn = 1 + _rand(rng, d, scale=0.3), 1 + _rand(rng, d, scale=0.3)
        kw["qk_norm"] = (qn.astype(np.float64), kn.astype(np.float64), 1e-6)
        args.update(q_norm=t(qn), k_norm=t(kn), qk_eps=1e-6)
    n_seq = B + 2
    cfg = k_attn.pick_config(tb, d)
    tcum = _tiles(k_attn, hdr, cu, n_seq, cfg)
    o = poison((tb, heads * d), torch.float16)
    amax = torch.zeros(tb, dtype=torch.float32, device=DEV)
    k_attn.launch_attention(
        t(qkv, torch.float16), t(hdr), t(cu), tcum, o, amax, tb, n_seq, heads, d, d**-0.5,
        cfg=cfg, window=window, kv_heads=kv, causal=causal, **args,
    )  # fmt: skip
    want = ref.attention(f16(qkv[:T]), cu, heads, d, d**-0.5, **kw)
    got = o.float().cpu().numpy()
    assert rel(got[:T], want) < 3e-3, name
    assert np.isnan(got[T:]).all(), "rows past T must not be written"
    np.testing.assert_array_equal(
        amax.cpu().numpy()[:T], np.abs(got[:T]).max(axis=1).astype(np.float32)
    )


def test_decoder_attention_modes_matter():
    """Grouped KV heads read KV head h // (heads / kv_heads) (== the plain kernel on K / V
    repeated per head); causal, the q/k norm and a window shorter than the sequence each move
    the output far beyond rounding (none is silently ignored)."""
    from zoi.backends.cuda.kernels import attention as k_attn

    rng = np.random.default_rng(5)
    heads, kv, d, L = 6, 2, 16, 23
    cu, hdr = np.array([0, L], np.int32), np.array([0, 1, L, 0], np.int32)
    qkv = rng.standard_normal((L, (heads + 2 * kv) * d)).astype(np.float32)
    cfg = k_attn.pick_config(L, d)
    tcum = _tiles(k_attn, hdr, cu, 1, cfg)

    def run(x, n_kv, **kw):
        o = poison((L, heads * d), torch.float16)
        k_attn.launch_attention(
            t(x, torch.float16), t(hdr), t(cu), tcum, o, None, L, 1, heads, d, 0.3,
            cfg=cfg, kv_heads=n_kv, **kw,
        )  # fmt: skip
        return o.float().cpu().numpy()

    q, k, v = np.split(qkv, [heads * d, (heads + kv) * d], axis=1)
    rep = lambda a: np.repeat(a.reshape(L, kv, d), heads // kv, axis=1).reshape(L, -1)  # noqa: E731
    base = run(qkv, kv)
    np.testing.assert_allclose(base, run(np.hstack([q, rep(k), rep(v)]), heads), atol=2e-3)
    w1 = t(1 + _rand(rng, d, scale=0.5))
    w2 = t(1 + _rand(rng, d, scale=0.5))
    for kw in (dict(causal=True), dict(window=3), dict(q_norm=w1, k_norm=w2)):
        assert rel(run(qkv, kv, **kw), base) > 0.05, kw.keys()
    assert rel(run(qkv, kv, window=L), base) < 2e-3  # a window past the sequence: no change


# add_layernorm modes: RMSNorm alone, with the residual before it (pre), after it (post), and
# LayerNorm with the residual after it
NORM_MODES = ["rms", "rms_pre_res", "rms_post_res", "ln_post_res"]


@pytest.mark.parametrize("mode", NORM_MODES)
@pytest.mark.parametrize("T,H", [(1, 7), (13, 42), (5, 129)])
def test_decoder_norm_kernel(mode, T, H):
    from zoi.backends.cuda.kernels import layernorm as k_ln

    rng = np.random.default_rng(T * H + len(mode))
    x, r = _rand(rng, T, H, scale=3.0), _rand(rng, T, H)
    w, b = 1 + _rand(rng, H, scale=0.3), _rand(rng, H, scale=0.1)
    rms, post = mode.startswith("rms"), mode.endswith("post_res")
    res = None if mode == "rms" else r
    y = poison((T + 2, H), torch.float16)
    amax = poison((T,), torch.float32)
    k_ln.launch_add_layernorm(
        t(x, torch.float16), None if res is None else t(res, torch.float16), t(w), t(b),
        y, amax, T, H, 1e-6, rms=rms, post=post,
    )  # fmt: skip
    want = ref.add_layernorm(
        f16(x), None if res is None else f16(res), w.astype(np.float64), b.astype(np.float64),
        1e-6, rms=rms, post=post,
    )  # fmt: skip
    got = y.float().cpu().numpy()
    assert rel(got[:T], want) < 2e-3
    assert np.isnan(got[T:]).all()
    np.testing.assert_array_equal(
        amax.cpu().numpy(), np.abs(got[:T]).max(axis=1).astype(np.float32)
    )


@pytest.mark.parametrize("qmode,tr", [("dynamic_asym", "shift+mul"), ("dynamic", "none")])
def test_rmsnorm_writes_the_int8_copy(qmode, tr):
    """The INT8 copy the next linear reads, written from the RMSNorm's own stored output."""
    from zoi.backends.cuda.kernels import layernorm as k_ln

    rng = np.random.default_rng(len(tr))
    T, H = 11, 40
    x, r = _rand(rng, T, H, scale=3.0), _rand(rng, T, H)
    w, b = 1 + _rand(rng, H, scale=0.3), np.zeros(H, np.float32)
    shift, mul = _transform(rng, H, tr)
    yq, ys, yz = _qbufs(T, H)
    y = poison((T, H), torch.float16)
    k_ln.launch_add_layernorm(
        t(x, torch.float16), t(r, torch.float16), t(w), t(b), y, None, T, H, 1e-6,
        rms=True, post=True, **_qargs(qmode, shift, mul, 0.0, yq, ys, yz, "y"),
    )  # fmt: skip
    got = y.float().cpu().numpy()
    want = ref.add_layernorm(f16(x), f16(r), w, b, 1e-6, rms=True, post=True)
    assert rel(got, want) < 2e-3
    _assert_quant(got, qmode, shift, mul, 0.0, yq, ys, yz)


@pytest.mark.parametrize("word_q", [False, True])
def test_embed_without_norm(word_q):
    """Decoder embeddings: x = word[ids], no position table, no norm (Gemma3's sqrt(H) scale is
    in the table); the per-row amax for the first RMSNorm's consumers too."""
    from zoi.backends.cuda.kernels import embed as k_embed
    from zoi.numerics import primitives as qp

    rng = np.random.default_rng(int(word_q))
    V, H, T = 50, 42, 7
    word = _rand(rng, V, H, scale=3.0)
    ids = rng.integers(0, V, T).astype(np.int32)
    if word_q:
        wq, ws = qp.quantize_embedding(word)
        want = qp.dequantize_weight(wq, ws)[ids].astype(np.float16)
        word_arg, ws_arg = t(wq), t(ws)
    else:
        want = word.astype(np.float16)[ids]
        word_arg, ws_arg = t(word, torch.float16), None
    x = poison((T + 2, H), torch.float16)
    amax = poison((T,), torch.float32)
    k_embed.launch_embed(
        t(ids), t(np.zeros(T, np.int32)), word_arg, ws_arg, None, None, None, None, x, amax,
        None, T, H, 0, T, 1e-6,
    )  # fmt: skip
    got = x.cpu().numpy()
    np.testing.assert_array_equal(got[:T], want)
    assert np.isnan(got[T:].astype(np.float32)).all()
    np.testing.assert_array_equal(amax.cpu().numpy(), np.abs(want.astype(np.float32)).max(axis=1))


@pytest.mark.parametrize("norm", [0, 1])
def test_pool_last_and_rows(norm):
    """ "last": the last token of each sequence (an empty one pools to 0); "rows": row b of an
    fp32 [B, N] input (the Dense modules' output); normalize False: never normalised."""
    from zoi.backends.cuda.kernels import pool as k_pool

    rng = np.random.default_rng(norm)
    lens = [3, 1, 0, 40]
    T, H, B = sum(lens), 56, len(lens)
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    x = _rand(rng, T + 2, H)
    hdr = t(np.array([norm, B, T], np.int32))
    p = poison((B + 2, H), torch.float32)
    k_pool.launch_pool(t(x, torch.float16), t(cu), hdr, p, 3, H, "last")
    want = np.zeros((B, H))
    for s in range(B):
        if lens[s]:
            want[s] = f16(x[cu[s + 1] - 1])
    if norm:
        want = ref.normalize(want)
    got = p.cpu().numpy()
    assert rel(got[:B], want) < 1e-6
    assert np.isnan(got[B:]).all(), "slots past B must not be written"
    rows = _rand(rng, B + 1, 33)
    for normalize in (True, False):
        p = poison((B + 2, 33), torch.float32)
        k_pool.launch_pool(t(rows), t(cu), hdr, p, 3, 33, "rows", normalize=normalize)
        want = ref.normalize(rows[:B]) if norm and normalize else rows[:B]
        got = p.cpu().numpy()
        assert rel(got[:B], want) < 1e-6
        assert np.isnan(got[B:]).all()


@pytest.mark.parametrize("T,n", [(1, 37), (17, 5)])
def test_silu_glu_and_linear(T, n):
    """SwiGLU's gate (glu act silu) and a linear with act silu, against the reference."""
    from zoi.backends.cuda.kernels import glu as k_glu
    from zoi.backends.cuda.kernels import linear as k_lin

    rng = np.random.default_rng(T * n)
    x = _rand(rng, T, 2 * n, scale=4.0)
    y = poison((T + 1, n), torch.float16)
    k_glu.launch_glu(t(x, torch.float16), y, None, T, n, "silu")
    got = y.float().cpu().numpy()
    assert rel(got[:T], ref.glu(f16(x), "silu")) < 2e-3
    assert np.isnan(got[T:]).all()
    w, b = _rand(rng, n, 2 * n, scale=0.5), _rand(rng, n)
    y = poison((T, n), torch.float16)
    k_lin.launch_linear(
        t(x, torch.float16), None, t(w, torch.float16), None, t(b), None, y, None, T, n, 2 * n,
        quant=0, act="silu",
    )  # fmt: skip
    want = ref.linear(f16(x), f16(w), b.astype(np.float64), act="silu")
    assert rel(y.float().cpu().numpy(), want) < 3e-3


# ---- whole models -----------------------------------------------------------------------------
COMPILED = not triton_mode.interpreted()
if COMPILED:  # 3 to 80 tokens (120 in all), past the sliding windows; batched: bucket 128
    SHORT = ["x", "Hello world!", TEXTS[2], " ".join(["tokens"] * 15)]
    SIZE, BUCKETS = dict(max_tokens=512, max_batch=64), [32, 128]
else:  # the interpreter's cost is its program count: 26 tokens, bucket 32, max_batch 4
    SHORT = ["x", "Hello world!", "a b c d e f g h i j k l m n o p"]
    SIZE, BUCKETS = dict(max_tokens=512, max_batch=4), [16, 32]


@pytest.fixture(scope="module")
def dec(tmp_path_factory):
    """(arch, precision, pooling) -> (transformers model, the model the cuda backend runs, the
    reference engine of the folder, the folder), built once per module: INT8 quantised by
    zoi.quant (small calibration: tests.conftest.compile_int8_for_kernels), FP16 the
    reference's FP32 weights. Pooling "lasttoken": the mean folder with its pooling switched."""
    cache: dict = {}

    def get(arch, precision, pooling="mean"):
        key = (arch, pooling)
        if key not in cache and pooling == "mean":
            d = tmp_path_factory.mktemp(f"cuda-dec-{arch}")
            hf, folder = decoder_checkpoint(arch, d, seed=DECODER_ARCHS.index(arch))
            cache[key] = hf, folder, zoi.compile(folder, device="reference", **SIZE)
        elif key not in cache:
            hf, _, _, src = get(arch, "fp16")
            folder = tmp_path_factory.mktemp(f"cuda-dec-{arch}-{pooling}") / "m"
            shutil.copytree(src, folder)
            cfg = folder / "1_Pooling" / "config.json"
            pool = json.loads(cfg.read_text())
            pool = {k: False if k.startswith("pooling_mode") else v for k, v in pool.items()}
            cfg.write_text(json.dumps({**pool, f"pooling_mode_{pooling}": True}))
            cache[key] = hf, folder, zoi.compile(folder, device="reference", **SIZE)
        hf, folder, eng = cache[key]
        if (key, precision) not in cache:
            if precision == "int8":
                model = compile_int8_for_kernels(folder, **SIZE).model
                assert {"dynamic_asym", "act_mul"} <= int8_features(model)
            else:
                model = CompiledModel.build(eng.spec, eng.model.weights, "fp16", **SIZE)
            cache[key, precision] = model
        return hf, cache[key, precision], eng, folder

    return get


def _batch(eng, texts=SHORT):
    seqs = eng.tokenize(texts)
    return seqs, *pack(seqs, eng.spec.position_offset)


@pytest.mark.parametrize("arch", DECODER_ARCHS)
@pytest.mark.parametrize("precision", ["fp16", "int8"])
def test_decoder_arch_on_cuda(arch, precision, dec):
    from zoi.backends.arch_support import cuda_missing
    from zoi.backends.cuda import CudaBackend
    from zoi.backends.cuda.persistent import PersistentUnsupported, _layers

    hf, model, eng, _ = dec(arch, precision)
    assert cuda_missing(model.graph) == []
    seqs, ids, pos, cu = _batch(eng)
    assert np.diff(cu).min() <= 3 and len(ids) <= BUCKETS[-1] < 2 * len(ids)
    want = ReferenceBackend(model).run(ids, pos, cu, True)  # INT8: the emulation
    be = CudaBackend(model, buckets=BUCKETS)
    with pytest.raises(PersistentUnsupported):  # the one-launch forward is BERT-only
        _layers(be)
    got = be.run(ids, pos, cu, True)
    assert got.shape == (len(seqs), eng.spec.hidden) and np.isfinite(got).all()
    assert cosine(got, want).min() > 0.999
    if precision == "fp16":  # transformers' mean pooling
        hf_mean = np.stack([hf_hidden(hf, s).mean(0) for s in seqs])
        assert cosine(got, hf_mean).min() > 0.999
    if precision == "fp16" and (COMPILED or arch == "qwen3"):
        # one at a time (other buckets, other tiles) == batched (the interpreter: causal GQA)
        one = np.concatenate([be.run(ids[a:e], pos[a:e], np.array([0, e - a], np.int32), True)
                              for a, e in zip(cu[:-1], cu[1:], strict=True)])  # fmt: skip
        assert cosine(one, got).min() > 0.9999


# the pool reads the same fp16 rows at any precision: INT8 in the compiled run only
@pytest.mark.parametrize("precision", ["fp16", "int8"] if COMPILED else ["fp16"])
def test_qwen3_last_token_on_cuda(precision, dec):
    """Qwen3-Embedding's layout: causal Qwen3, last-token pooling (transformers' last hidden
    state of each text's last token)."""
    from zoi.backends.cuda import CudaBackend

    hf, model, eng, _ = dec("qwen3", precision, "lasttoken")
    assert eng.spec.pooling == "last"
    seqs, ids, pos, cu = _batch(eng)
    got = CudaBackend(model, buckets=BUCKETS).run(ids, pos, cu, False)
    want = ReferenceBackend(model).run(ids, pos, cu, False)
    assert cosine(got, want).min() > 0.999
    if precision == "fp16":
        last = np.stack([hf_hidden(hf, s)[-1] for s in seqs])
        assert cosine(got, last).min() > 0.999


@pytest.fixture(scope="module")
def gemma_dense(dec, tmp_path_factory):
    """Gemma3 with EmbeddingGemma's two Dense modules (Identity, no bias) and Normalize."""
    folder = tmp_path_factory.mktemp("cuda-gemma-dense") / "m"
    shutil.copytree(dec("gemma3", "fp16")[3], folder)
    add_dense(folder, [42, 70, 33], seed=3)
    return zoi.compile(folder, device="reference", **SIZE)


def test_gemma3_dense_modules_on_cuda(gemma_dense):
    """The Dense modules run as linears over the B pooled rows (fp32 in the arena), the output
    rows are the last module's width, normalised on request."""
    from zoi.backends.cuda import CudaBackend

    eng = gemma_dense
    assert eng.spec.out_dim == 33
    model = CompiledModel.build(eng.spec, eng.model.weights, "fp16", **SIZE)
    seqs, ids, pos, cu = _batch(eng)
    be = CudaBackend(model, buckets=BUCKETS[-1:])
    want = ReferenceBackend(model).run(ids, pos, cu, False)
    got = be.run(ids, pos, cu, True)
    assert got.shape == (len(seqs), 33) and np.isfinite(got).all()
    assert cosine(got, want).min() > 0.999
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    raw = be.run_outputs(ids, pos, cu)[model.graph.output]  # not normalised
    np.testing.assert_allclose(raw, want, rtol=0, atol=5e-3 * np.abs(want).max())


def test_gemma3_int8_with_dense_modules_on_cuda(dec, gemma_dense):
    """An INT8 body with the Dense modules: float modules run as fp16 linears on the pooled
    rows; a module the IR marks INT8 runs dequantised too, recorded in the plan's fallbacks."""
    from zoi.backends.cuda import CudaBackend
    from zoi.numerics import primitives as qp

    body, eng = dec("gemma3", "int8")[1], gemma_dense
    dense = {k: v for k, v in eng.model.weights.items() if k.startswith("dense")}
    dense["dense1.w_q"], dense["dense1.w_scale"] = qp.quantize_weight(dense.pop("dense1.w"))
    quant = {**body.quant, "dense1": LinearQuant("dynamic_asym")}
    model = CompiledModel.build(eng.spec, {**body.weights, **dense}, "int8", quant=quant, **SIZE)
    seqs, ids, pos, cu = _batch(eng)
    be = CudaBackend(model, buckets=BUCKETS)
    assert "dense1" in be.plan["fallbacks"]["pooled"]
    buf = np.full((len(seqs) + 1, 33), np.nan, np.float32)  # submit / wait: out_dim wide rows
    got = be.wait(be.submit(ids, pos, cu, True, buf))[: len(seqs)]
    want = ReferenceBackend(model).run(ids, pos, cu, True)
    assert np.isfinite(got).all() and np.isnan(buf[len(seqs) :]).all()
    assert cosine(got, want).min() > 0.999
