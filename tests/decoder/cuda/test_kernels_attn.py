"""RoPE + paged KV write, flash-decoding over the paged cache and causal varlen prefill
attention (zoi/backends/cuda/kernels/attention_paged.py) against numpy, GQA, awkward lengths."""

from __future__ import annotations

import numpy as np
import pytest
from tests.decoder.cuda.helpers import DEV, dev, host, poisoned, rel, torch

from zoi.backends.cuda.kernels import attention_paged as ka
from zoi.decoder.api import DecoderSpec
from zoi.decoder.rope import rope_tables


def spec(H=4, KVH=2, D=16, **kw):
    return DecoderSpec("llama", 50, H * D, 64, 1, H, KVH, D, **kw)


def rope_ref(x, pos, cos, sin):  # x [T, heads, D]
    c, s = cos[pos][:, None, :], sin[pos][:, None, :]
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h], x[..., h:]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], -1)


def rms_ref(x, w, eps):
    return x / np.sqrt((x**2).mean(-1, keepdims=True) + eps) * w


@pytest.mark.parametrize("norm", [False, True])
@pytest.mark.parametrize(
    "rope_scaling",
    [
        None,
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16,
        },
    ],
)
def test_rope_kv_write(rng, norm, rope_scaling):
    H, KVH, D, BS, NB, T = 6, 2, 20, 16, 5, 7  # head_dim 20: half not a power of two
    sp = spec(H, KVH, D, rope_scaling=rope_scaling, rope_theta=500.0)
    cos, sin = rope_tables(sp, 64)
    qkv = rng.standard_normal((T, (H + 2 * KVH) * D)).astype(np.float32)
    pos = rng.integers(0, 64, T).astype(np.int32)
    slots = rng.permutation(NB * BS)[:T].astype(np.int32)
    qn = rng.standard_normal(D).astype(np.float32) if norm else None
    kn = rng.standard_normal(D).astype(np.float32) if norm else None
    dq = dev(qkv)
    kc, vc = (
        poisoned((NB + 1, KVH, BS, D), torch.float32),
        poisoned((NB + 1, KVH, BS, D), torch.float32),
    )
    ka.rope_kv(
        dq,
        dev(pos),
        dev(slots),
        dev(cos),
        dev(sin),
        kc,
        vc,
        T,
        H,
        KVH,
        D,
        BS,
        dev(qn) if norm else None,
        dev(kn) if norm else None,
        eps=1e-6,
    )
    q = qkv[:, : H * D].reshape(T, H, D).astype(np.float64)
    k = qkv[:, H * D : (H + KVH) * D].reshape(T, KVH, D).astype(np.float64)
    v = qkv[:, (H + KVH) * D :].reshape(T, KVH, D)
    if norm:
        q, k = rms_ref(q, qn, 1e-6), rms_ref(k, kn, 1e-6)
    q, k = rope_ref(q, pos, cos, sin), rope_ref(k, pos, cos, sin)
    got = host(dq)
    assert rel(got[:, : H * D], q.reshape(T, -1)) < 1e-5
    assert rel(got[:, H * D : (H + KVH) * D], k.reshape(T, -1)) < 1e-5
    kh, vh = host(kc), host(vc)
    blk, off = slots // BS, slots % BS
    assert rel(kh[blk, :, off], k) < 1e-5
    assert np.array_equal(vh[blk, :, off], v)
    written = np.zeros((NB + 1, BS), bool)
    written[blk, off] = True
    kt, vt = kh.transpose(0, 2, 1, 3), vh.transpose(0, 2, 1, 3)
    assert np.isnan(kt[~written]).all() and np.isnan(vt[~written]).all()  # nothing else touched


def paged_tables(rng, ctx, NB, MAXB, BS, spare):
    """Block tables for sequences of ctx tokens: shuffled blocks, rows in a shuffled order among
    len(ctx) + spare rows (unused entries: the trash block NB)."""
    B = len(ctx)
    perm = rng.permutation(NB)
    tab = np.full((B + spare, MAXB), NB, np.int32)
    rix = rng.permutation(B + spare)[:B].astype(np.int32)
    used = 0
    for b, n in enumerate(ctx):
        nb = -(-n // BS)
        tab[rix[b], :nb] = perm[used : used + nb]
        used += nb
    return tab, rix


def attn_ref(q, k, v):  # q [H, D] k/v [n, KVH, D] -> [H, D]
    H, KVH = q.shape[0], k.shape[1]
    G = H // KVH
    out = np.empty_like(q, dtype=np.float64)
    for h in range(H):
        s = k[:, h // G] @ q[h] / np.sqrt(q.shape[1])
        p = np.exp(s - s.max())
        out[h] = p @ v[:, h // G] / p.sum()
    return out


# unsplit in both dtypes, each split case in one dtype here (3 and 5 slices in fp16, the min_per
# clamp in fp32), the other dtype in the slow tier (~7 s in the interpreter): SPLITS and IEEE
# are independent constexprs of the one kernel
PAGED_SLOW = {(3, 1, 0), (5, 2, 0), (4, 8, 1)}  # (splits, min_per, dtype index)
PAGED_CASES = [
    pytest.param(dt, s, mp, id=f"{s}-{mp}-dtype{i}",
                 marks=pytest.mark.slow if (s, mp, i) in PAGED_SLOW else ())
    for s, mp in [(1, 1), (3, 1), (5, 2), (4, 8)]
    for i, dt in enumerate([torch.float32, torch.float16])
]  # fmt: skip


@pytest.mark.parametrize("dtype,splits,min_per", PAGED_CASES)
def test_decode_attention_paged(rng, dtype, splits, min_per):
    H, KVH, D, BS, NB, MAXB = 8, 2, 32, 16, 24, 6
    ctx = np.array([1, 17, 40, 96, 16], np.int32)  # a full table, exact block edges
    B = len(ctx)
    kc = rng.standard_normal((NB + 1, KVH, BS, D)).astype(np.float32)
    vc = rng.standard_normal((NB + 1, KVH, BS, D)).astype(np.float32)
    tab, rix = paged_tables(rng, ctx, NB, MAXB, BS, spare=2)
    q = rng.standard_normal((B, (H + 2 * KVH) * D)).astype(np.float32)
    out = poisoned((B, H * D), dtype)
    ws = cnt = None
    if splits > 1:
        ws = poisoned((ka.decode_ws_floats(B, KVH, H // KVH, D, splits),), torch.float32)
        cnt = torch.zeros(B * KVH, dtype=torch.int32, device=DEV)
    dkc, dvc = dev(kc, dtype), dev(vc, dtype)
    for _ in range(2):  # the counters reset: a replay is right too
        ka.decode_attention(
            dev(q, dtype),
            dkc,
            dvc,
            dev(tab),
            dev(rix),
            dev(ctx),
            out,
            B,
            H,
            KVH,
            D,
            BS,
            splits,
            ws,
            cnt,
            ieee=dtype == torch.float32,
            min_per=min_per,
        )
    if dtype == torch.float16:
        kc, vc, q = (a.astype(np.float16).astype(np.float32) for a in (kc, vc, q))
    got = host(out).reshape(B, H, D)
    for b, n in enumerate(ctx):
        blocks = tab[rix[b], : -(-n // BS)]
        k = kc[blocks].transpose(0, 2, 1, 3).reshape(-1, KVH, D)[:n]
        v = vc[blocks].transpose(0, 2, 1, 3).reshape(-1, KVH, D)[:n]
        want = attn_ref(q[b, : H * D].reshape(H, D).astype(np.float64), k, v)
        assert rel(got[b], want) < (1e-5 if dtype == torch.float32 else 3e-3), b
    if cnt is not None:
        assert int(cnt.abs().sum()) == 0


# every (dtype, norm) pair unsplit, 3 slices (fp16, no norm) and 6 slices of >= 2 blocks (fp32,
# q / k norms) here; the other split cases in the slow tier (~22 s in the interpreter): SPLITS,
# NORM and IEEE are independent constexprs of the one kernel, each value runs here
FUSED_FAST = {(3, False, 1), (6, True, 0)}  # (splits, norm, dtype index) of the split cases
FUSED_CASES = [
    pytest.param(dt, norm, s, mp, id=f"{s}-{mp}-{norm}-dtype{i}",
                 marks=() if s == 1 or (s, norm, i) in FUSED_FAST else pytest.mark.slow)
    for s, mp in [(1, 1), (3, 1), (6, 2)]
    for norm in (False, True)
    for i, dt in enumerate([torch.float32, torch.float16])
]  # fmt: skip


@pytest.mark.parametrize("dtype,norm,splits,min_per", FUSED_CASES)
def test_decode_attention_fused_rope(rng, dtype, norm, splits, min_per):
    """rope=(...): q and the current k roped in the attention kernel, k / v written into the
    cache by the slice that holds the current token: the same cache and the same output as
    rope_kv followed by decode_attention (head_dim 20: the half is not a power of two)."""
    H, KVH, D, BS, NB, MAXB = 6, 2, 20, 16, 24, 6
    ctx = np.array([1, 17, 40, 96, 16, 33], np.int32)  # block edges, a full table
    B = len(ctx)
    sp = spec(H, KVH, D, rope_theta=500.0)
    cos, sin = rope_tables(sp, 128)
    tab, rix = paged_tables(rng, ctx, NB, MAXB, BS, spare=1)
    pos = (ctx - 1).astype(np.int32)
    slots = np.array([tab[rix[b], p // BS] * BS + p % BS for b, p in enumerate(pos)], np.int32)
    qkv = rng.standard_normal((B, (H + 2 * KVH) * D)).astype(np.float32)
    kc0 = rng.standard_normal((NB + 1, KVH, BS, D)).astype(np.float32)
    vc0 = rng.standard_normal((NB + 1, KVH, BS, D)).astype(np.float32)
    qn = rng.standard_normal(D).astype(np.float32) if norm else None
    kn = rng.standard_normal(D).astype(np.float32) if norm else None
    args = (dev(tab), dev(rix), dev(ctx))

    def run(fused):
        q, kc, vc = dev(qkv, dtype), dev(kc0, dtype), dev(vc0, dtype)
        out = poisoned((B, H * D), dtype)
        ws = cnt = None
        if splits > 1:
            ws = poisoned((ka.decode_ws_floats(B, KVH, H // KVH, D, splits),), torch.float32)
            cnt = torch.zeros(B * KVH, dtype=torch.int32, device=DEV)
        nq, nk = (dev(qn), dev(kn)) if norm else (None, None)
        rope = (dev(pos), dev(slots), dev(cos), dev(sin), nq, nk, 1e-6)
        if not fused:
            ka.rope_kv(q, rope[0], rope[1], rope[2], rope[3], kc, vc, B, H, KVH, D, BS, nq, nk)
        ka.decode_attention(
            q, kc, vc, *args, out, B, H, KVH, D, BS, splits, ws, cnt,
            ieee=dtype == torch.float32, min_per=min_per, rope=rope if fused else None,
        )  # fmt: skip
        return host(out), host(kc), host(vc)

    got, want = run(True), run(False)
    assert np.array_equal(got[1], want[1]) and np.array_equal(got[2], want[2])  # the caches
    assert rel(got[0], want[0]) < (1e-5 if dtype == torch.float32 else 2e-3)
    # and against numpy: rope (+ norm) of q / k, attention over the cache with the new k / v
    q = qkv[:, : H * D].reshape(B, H, D).astype(np.float64)
    k = qkv[:, H * D : (H + KVH) * D].reshape(B, KVH, D).astype(np.float64)
    if norm:
        q, k = rms_ref(q, qn, 1e-6), rms_ref(k, kn, 1e-6)
    q, k = rope_ref(q, pos, cos, sin), rope_ref(k, pos, cos, sin)
    kc, vc = kc0.astype(np.float64), vc0.astype(np.float64)
    blk, off = slots // BS, slots % BS
    kc[blk, :, off], vc[blk, :, off] = k, qkv[:, (H + KVH) * D :].reshape(B, KVH, D)
    for b, n in enumerate(ctx):
        blocks = tab[rix[b], : -(-n // BS)]
        kk = kc[blocks].transpose(0, 2, 1, 3).reshape(-1, KVH, D)[:n]
        vv = vc[blocks].transpose(0, 2, 1, 3).reshape(-1, KVH, D)[:n]
        ref = attn_ref(q[b], kk, vv)
        assert rel(got[0].reshape(B, H, D)[b], ref) < (1e-5 if dtype == torch.float32 else 5e-3), b


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_prefill_attention_varlen_causal(rng, dtype):
    H, KVH, D = 6, 3, 12
    lens = [5, 1, 19, 16]
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    T = int(cu[-1])
    qkv = rng.standard_normal((T, (H + 2 * KVH) * D)).astype(np.float32)
    tiles = ka.prefill_tiles(cu, 16)
    out = poisoned((T, H * D), dtype)
    ka.prefill_attention(
        dev(qkv, dtype),
        dev(tiles),
        tiles.shape[1],
        out,
        H,
        KVH,
        D,
        16,
        16,
        ieee=dtype == torch.float32,
    )
    if dtype == torch.float16:
        qkv = qkv.astype(np.float16).astype(np.float32)
    got = host(out).reshape(T, H, D)
    for a, b in zip(cu[:-1], cu[1:], strict=True):
        q = qkv[a:b, : H * D].reshape(-1, H, D).astype(np.float64)
        k = qkv[a:b, H * D : (H + KVH) * D].reshape(-1, KVH, D).astype(np.float64)
        v = qkv[a:b, (H + KVH) * D :].reshape(-1, KVH, D).astype(np.float64)
        for i in range(b - a):
            want = attn_ref(q[i], k[: i + 1], v[: i + 1])
            assert rel(got[a + i], want) < (1e-5 if dtype == torch.float32 else 3e-3)
