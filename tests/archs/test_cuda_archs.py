"""The architectures on the CUDA backend, FP16 and INT8, against the reference engine
(Triton interpreter on the CPU, compiled on a GPU: scripts/gpu_check.sh): Electra / ALBERT
(narrower embeddings + a projection), MPNet (relative position bias), ModernBERT (RoPE, GeGLU,
alternating local / global attention, no position table, pre-norm), NomicBERT / GTE (RoPE and
a gated MLP in BERT's post-norm layers), and their kernels alone
(the attention extras of kernels/attention.py, kernels/glu.py) on awkward shapes, outputs
poisoned."""

from __future__ import annotations

import math

import numpy as np
import pytest
from tests.archs.helpers import TEXTS, cosine

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from tests import triton_mode  # noqa: E402
from tests.conftest import compile_int8_for_kernels, int8_features  # noqa: E402
from tests.ops.helpers import DEV, f16, poison, rel, t  # noqa: E402

import zoi  # noqa: E402
from zoi.backends.reference import ReferenceBackend  # noqa: E402
from zoi.frontend.archs import rope_tables  # noqa: E402
from zoi.frontend.tokenizer import pack  # noqa: E402
from zoi.graph.compiled import CompiledModel  # noqa: E402
from zoi.numerics import reference as ref  # noqa: E402

pytestmark = pytest.mark.skipif(
    not triton_mode.interpreted() and not torch.cuda.is_available(),
    reason="compiled Triton needs a CUDA GPU",
)

# ---- kernels --------------------------------------------------------------------------------
# (variant, heads, head_dim): the odd sizes the archs allow (RoPE needs an even head_dim)
ATTN_CASES = [
    ("bias", 5, 8),
    ("bias", 3, 7),
    ("rope", 5, 8),
    ("rope", 2, 6),
    ("window", 3, 7),
    ("rope+window", 5, 8),
    ("rope+window", 1, 34),
    ("bias+window", 2, 12),
]
# [3, 1, 17] in the slow tier (~14 s over the variants in the interpreter): a batch of mixed
# lengths with a length-1 sequence and one past a 16-row tile, sequences starting off a tile
# edge, is [17, 3, 1, 1]'s too
LENS = [[1], pytest.param([3, 1, 17], marks=pytest.mark.slow), [129], [17, 3, 1, 1]]


def _tiles(k_attn, hdr, cu, n_seq, cfg):
    tcum = torch.full((n_seq,), -1, dtype=torch.int32, device=DEV)
    k_attn.launch_tiles(t(hdr), t(cu), tcum, n_seq, cfg)
    return tcum


@pytest.mark.parametrize("variant,heads,d", ATTN_CASES)
@pytest.mark.parametrize("lens", LENS)
def test_attention_extras_kernel(variant, heads, d, lens):
    from zoi.backends.cuda.kernels import attention as k_attn

    rng = np.random.default_rng(sum(lens) * 7 + heads * d + len(variant))
    T, H, B = sum(lens), heads * d, len(lens)
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    hdr = np.array([0, B, T, 0], np.int32)
    tb = T + 3  # rows past T belong to no sequence
    qkv = np.zeros((tb, 3 * H), np.float32)
    qkv[:T] = rng.standard_normal((T, 3 * H)) * 1.5
    P = max(lens) + int(rng.integers(0, 5))
    kw, args = {}, {}
    if "bias" in variant:
        bias = (rng.standard_normal((heads, 2 * P - 1)) * 2).astype(np.float32)
        kw["bias"], args["bias"] = bias, t(bias)
    if "rope" in variant:
        cos, sin = rope_tables(float(rng.choice([1e4, 37.0])), d, P)
        kw["rope_cs"] = (cos, sin)
        args["cos"], args["sin"] = t(cos), t(sin)
    scale = 1 / math.sqrt(d)
    n_seq = B + 2
    cfg = k_attn.pick_config(tb, d)
    tcum = _tiles(k_attn, hdr, cu, n_seq, cfg)
    # windows smaller than the sequences (3: a few keys, crossing key blocks on 129) and larger
    for window in (3, 200) if "window" in variant else (0,):
        if window:
            kw["window"], args["window"] = window, window
        o = poison((tb, H), torch.float16)
        amax = torch.zeros(tb, dtype=torch.float32, device=DEV)
        k_attn.launch_attention(
            t(qkv, torch.float16), t(hdr), t(cu), tcum, o, amax, tb, n_seq, heads, d, scale,
            cfg=cfg, **args,
        )  # fmt: skip
        want = ref.attention(f16(qkv[:T]), cu, heads, d, scale, **kw)
        got = o.float().cpu().numpy()
        assert rel(got[:T], want) < 3e-3, (variant, window)
        assert np.isnan(got[T:]).all(), "rows past T must not be written"
        np.testing.assert_array_equal(
            amax.cpu().numpy()[:T], np.abs(got[:T]).max(axis=1).astype(np.float32)
        )


@pytest.mark.parametrize("window", [1, 4, 40])
def test_attention_window_and_bias_matter(window):
    """Each extra moves the output far beyond rounding (none is silently ignored)."""
    from zoi.backends.cuda.kernels import attention as k_attn

    rng = np.random.default_rng(window)
    heads, d, L = 2, 8, 33
    qkv = t(rng.standard_normal((L, 3 * heads * d)).astype(np.float32), torch.float16)
    cu, hdr = np.array([0, L], np.int32), np.array([0, 1, L, 0], np.int32)
    cfg = k_attn.pick_config(L, d)
    tcum = _tiles(k_attn, hdr, cu, 1, cfg)
    cos, sin = rope_tables(1e4, d, L)
    bias = rng.standard_normal((heads, 2 * L - 1)).astype(np.float32)

    def run(**kw):
        o = poison((L, heads * d), torch.float16)
        k_attn.launch_attention(
            qkv, t(hdr), t(cu), tcum, o, None, L, 1, heads, d, 0.35, cfg=cfg, **kw
        )
        return o.float().cpu().numpy()

    base = run()
    for kw in (dict(bias=t(bias)), dict(window=window), dict(cos=t(cos), sin=t(sin))):
        if kw.get("window", 0) >= L:
            assert rel(run(**kw), base) < 2e-3  # a window past the sequence changes nothing
        else:
            assert rel(run(**kw), base) > 0.05, kw.keys()


@pytest.mark.parametrize("act", ["gelu", "gelu_tanh", "relu"])
@pytest.mark.parametrize("T,n", [(1, 37), (17, 5), (129, 64), (3, 300)])
def test_glu_kernel(act, T, n):
    from zoi.backends.cuda.kernels import glu as k_glu

    rng = np.random.default_rng(T * n)
    tb = T + 2
    x = np.zeros((tb, 2 * n), np.float32)
    x[:T] = rng.standard_normal((T, 2 * n)) * 2
    y = poison((tb, n), torch.float16)
    amax = torch.zeros(tb, dtype=torch.float32, device=DEV)
    k_glu.launch_glu(t(x, torch.float16), y, amax, T, n, act)
    got = y.float().cpu().numpy()
    want = ref.glu(f16(x[:T]), act)
    assert rel(got[:T], want) < 2e-3
    assert np.isnan(got[T:]).all()
    np.testing.assert_array_equal(
        amax.cpu().numpy()[:T], np.abs(got[:T]).max(axis=1).astype(np.float32)
    )


# ---- whole models -----------------------------------------------------------------------------
COMPILED = not triton_mode.interpreted()
if COMPILED:
    # 1 to ~30 tokens, past ModernBERT's window of 8; batched: bucket 96 (attention's 64-row
    # tiles), one at a time: bucket 32
    SHORT = [
        "x",
        "Hello world!",
        " ".join(["tokens"] * 15),
        "a b c d e f g h i j k l m n o p q r s t u v w",
    ]
    SIZE, BUCKETS, LONG_BUCKETS = dict(max_tokens=512, max_batch=64), [32, 96], [128]
else:
    # the interpreter runs every Triton program in Python: its cost is the number of programs,
    # so 29 tokens (batched: bucket 32; one at a time: buckets 16 and 32), max_batch 8 (the
    # attention grid has ~min(max_batch, bucket) + tiles programs per head, 98 at max_batch 64)
    SHORT = ["x", "Hello world!", "a b c d e f g h i j k l m n o p q r s"]
    SIZE, BUCKETS, LONG_BUCKETS = dict(max_tokens=512, max_batch=8), [16, 32], [96]


@pytest.fixture(scope="module")
def cuda_models(arch_ckpts):
    """(arch, precision) -> (the model the cuda backend runs, the reference engine of the
    folder), built once per module: INT8 quantised by zoi.quant (small calibration:
    tests.conftest.compile_int8_for_kernels), FP16 the reference's FP32 weights."""
    cache: dict = {}

    def get(arch, precision):
        if (arch, precision) not in cache:
            _, folder = arch_ckpts(arch, seed=11)
            if arch not in cache:
                cache[arch] = zoi.compile(folder, device="reference", **SIZE)
            ref_eng = cache[arch]
            if precision == "int8":
                model = compile_int8_for_kernels(folder, **SIZE).model
                assert {"dynamic_asym", "act_mul"} <= int8_features(model)
            else:
                model = CompiledModel.build(ref_eng.spec, ref_eng.model.weights, "fp16", **SIZE)
            cache[arch, precision] = model, ref_eng
        return cache[arch, precision]

    return get


ARCHS = ["electra", "albert", "mpnet", "modernbert", "nomic_bert", "gte"]
# INT8 Electra / MPNet / GTE in the slow tier (~10 s in the interpreter): their own ops run here
# in FP16 (with one at a time == batched); in INT8, Electra's narrow embeddings + projection are
# ALBERT's too, GTE's RoPE + gated MLP NomicBERT's, MPNet's relative position bias sits in the
# attention (not quantised) beside BERT's INT8 linears (tests/cuda_backend)
INT8_SLOW = {"electra", "mpnet", "gte"}
ARCH_CASES = [
    pytest.param(precision, arch, id=f"{precision}-{arch}",
                 marks=pytest.mark.slow if precision == "int8" and arch in INT8_SLOW else ())
    for precision in ("fp16", "int8")
    for arch in ARCHS
]  # fmt: skip


@pytest.mark.parametrize("precision,arch", ARCH_CASES)
def test_arch_on_cuda(arch, precision, cuda_models):
    from zoi.backends.arch_support import cuda_missing
    from zoi.backends.cuda import CudaBackend

    model, eng = cuda_models(arch, precision)
    assert cuda_missing(model.graph) == []
    ids, pos, cu = pack(eng.tokenize(SHORT), eng.spec.position_offset)
    assert np.diff(cu).max() > 20 and np.diff(cu).min() <= 3
    assert len(ids) <= BUCKETS[-1] < 2 * len(ids)
    want = ReferenceBackend(model).run(ids, pos, cu, True)  # INT8: the emulation
    be = CudaBackend(model, buckets=BUCKETS)
    if arch in ("mpnet", "modernbert", "nomic_bert", "gte"):  # the one-launch forward is
        # BERT's alone: refused (a bias, RoPE, a window, no position table; an INT8 artifact
        # compiled for the CPU carries the first-row term, refused first), the per-op plan runs
        from zoi.backends.cuda.persistent import PersistentUnsupported, _layers

        with pytest.raises(
            PersistentUnsupported,
            match="bias, RoPE or window|position table|launch list|first-row term",
        ):
            _layers(be)
    got = be.run(ids, pos, cu, True)
    assert np.isfinite(got).all()
    assert cosine(got, want).min() > 0.999
    if precision == "fp16":  # one at a time (other buckets, other tiles) == batched
        one = np.concatenate([be.run(ids[a:e], pos[a:e], np.array([0, e - a], np.int32), True)
                              for a, e in zip(cu[:-1], cu[1:], strict=True)])  # fmt: skip
        assert cosine(one, got).min() > 0.9999


def test_modernbert_long_sequence_on_cuda(cuda_models):
    """ModernBERT past its window on many tiles: one sequence of the long text (FP16), rows
    past it in the bucket."""
    from zoi.backends.cuda import CudaBackend

    model, eng = cuda_models("modernbert", "fp16")
    ids, pos, cu = pack(eng.tokenize([TEXTS[2]]), eng.spec.position_offset)
    assert 64 < len(ids) < LONG_BUCKETS[0]  # 2 tiles of 64 rows, 2 key blocks of 64
    want = ReferenceBackend(model).run(ids, pos, cu, False)
    got = CudaBackend(model, buckets=LONG_BUCKETS).run(ids, pos, cu, False)
    assert cosine(got, want).min() > 0.999
