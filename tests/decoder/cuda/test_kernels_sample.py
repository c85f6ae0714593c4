"""The fused sampling step and the embedding gather (zoi/backends/cuda/kernels/sample.py)
against numpy: greedy ties, temperature + top-k + top-p on the same uniforms (the NOISE_IN
seam), and the Philox path's reproducibility and distribution."""

from __future__ import annotations

import numpy as np
import pytest
from tests.decoder.cuda.helpers import DEV, dev, host, poisoned, torch

from zoi.backends.cuda.kernels import sample as ks


def sample_ref(x, temp, k, p, u):
    """transformers' warpers order (temperature, top-k, top-p), then Gumbel-max on u."""
    if temp <= 0:
        return int(np.argmax(x))
    lx = x.astype(np.float64) / temp
    keep = np.ones(len(x), bool)
    if 0 < k < len(x):
        keep &= x >= np.sort(x)[::-1][k - 1]
    if p < 1:
        e = np.where(keep, np.exp(lx - lx.max()), 0.0)
        e = e / e.sum()
        order = np.argsort(-x, kind="stable")
        above = np.cumsum(e[order]) - e[order]  # mass strictly ranked above each token
        kp = np.zeros(len(x), bool)
        kp[order] = above < p
        thr = x[kp].min()
        keep &= x >= thr  # ties with the last kept value stay
    g = -np.log(-np.log(np.maximum(u.astype(np.float64), 1e-30)))
    return int(np.argmax(np.where(keep, lx + g, -np.inf)))


def launch(logits, temp, k, p, seed, step, noise=None, block_v=64, split=True):
    """split: the greedy / plain-temperature rows argmax'ed over several programs per row
    (block_v 64 gives V / 64 of them; counters checked back at zero)."""
    B, V = logits.shape
    out = poisoned((B,), torch.int32)
    ws = None
    if split:
        S, _ = ks.sample_splits(V, block_v)
        ws = (
            poisoned((B * S,), torch.float32),
            poisoned((B * S,), torch.int32),
            torch.zeros(B, dtype=torch.int32, device=DEV),
        )
    ks.sample(
        dev(logits),
        V,
        B,
        dev(np.array(temp, np.float32)),
        dev(np.array(k, np.int32)),
        dev(np.array(p, np.float32)),
        dev(np.array(seed, np.int32)),
        dev(np.array(step, np.int32)),
        out,
        None if noise is None else dev(noise),
        block_v,
        ws=ws,
    )
    if ws is not None:
        assert int(ws[2].abs().sum()) == 0, "split counters not reset"
    return host(out)


@pytest.mark.parametrize("split", [True, False])
def test_greedy_lowest_id_on_ties(rng, split):
    B, V = 4, 300
    x = rng.standard_normal((B, V)).astype(np.float32)
    x[1, [7, 150, 299]] = 9.0  # ties across BLOCK_V chunks: 7 wins
    x[2, [200, 130]] = 9.0
    x[3, :] = 1.0
    got = launch(x, [0.0] * B, [0] * B, [1.0] * B, [0] * B, [0] * B, split=split)
    assert got.tolist() == [int(np.argmax(x[0])), 7, 130, 0]


@pytest.mark.parametrize("split", [True, False])
def test_sampling_matches_numpy_on_the_same_uniforms(rng, split):
    B, V = 12, 203
    x = (rng.standard_normal((B, V)) * 2).astype(np.float32)
    x[5, 10:14] = x[5].max() + 1  # ties at the top-k edge
    temp = [0.7, 1.0, 1.3, 0.5, 2.0, 1.0, 0.9, 1.1, 1.0, 0.6, 3.0, 1.0]
    k = [0, 5, 0, 17, 1, 3, 0, 40, 202, 0, 7, 203]
    p = [1.0, 1.0, 0.9, 0.8, 1.0, 1.0, 0.5, 0.95, 0.3, 0.05, 0.7, 1.0]
    for trial in range(1):
        u = rng.random((B, V)).astype(np.float32)
        got = launch(x, temp, k, p, [1] * B, [trial] * B, noise=u, split=split)
        want = [sample_ref(x[b], temp[b], k[b], p[b], u[b]) for b in range(B)]
        assert got.tolist() == want, trial


def test_split_argmax_equals_one_program(rng):
    """Greedy and plain-temperature rows over 11 programs per row (Philox noise keyed by the
    column, so the chunks draw what one program draws), top-k / top-p rows beside them."""
    B, V = 6, 700
    x = rng.standard_normal((B, V)).astype(np.float32)
    x[0, [3, 650]] = 9.0  # a tie across chunks
    args = ([0.0, 0.8, 1.5, 0.0, 1.0, 0.9], [0, 0, 0, 0, 5, 0], [1.0, 1.0, 1.0, 1.0, 1.0, 0.7])
    seeds, steps = [5, 6, 7, 8, 9, 10], [0, 1, 2, 3, 4, 5]
    a = launch(x, *args, seeds, steps, split=True)
    assert a.tolist() == launch(x, *args, seeds, steps, split=False).tolist()
    assert a[0] == 3 and a[3] == int(np.argmax(x[3]))


def test_philox_reproducible_and_distributed(rng):
    V, n, m = 4, 120, 24  # the interpreter is slow: few rows
    x = np.log(np.array([0.6, 0.25, 0.1, 0.05], np.float32))
    logits = np.repeat(x[None], n, 0)
    seeds = np.arange(n) * 7919 % 100003
    a = launch(logits, [1.0] * n, [0] * n, [1.0] * n, seeds, [3] * n, block_v=8)
    b = launch(logits[:m], [1.0] * m, [0] * m, [1.0] * m, seeds[:m], [3] * m, block_v=8)
    c = launch(logits[:m], [1.0] * m, [0] * m, [1.0] * m, seeds[:m], [4] * m, block_v=8)
    assert np.array_equal(a[:m], b)  # same seed and step: same tokens
    assert not np.array_equal(a[:m], c)  # the step changes the draw
    freq = np.bincount(a, minlength=V) / n
    assert np.abs(freq - np.exp(x)).max() < 0.14, freq
    top2 = launch(logits[:m], [1.0] * m, [2] * m, [1.0] * m, seeds[:m], [3] * m, block_v=8)
    assert set(top2.tolist()) == {0, 1}


def test_embed_gather(rng):
    V, Hd, T = 40, 70, 9
    emb = rng.standard_normal((V, Hd)).astype(np.float16)
    ids = rng.integers(0, V, T).astype(np.int32)
    h = poisoned((T, Hd), torch.float32)
    ks.embed(dev(ids), dev(emb), h, T)
    assert np.array_equal(host(h), emb[ids].astype(np.float32))
    assert DEV in ("cpu", "cuda")


def test_embed_feedback(rng):
    """Rows with fb >= 0 take the previous step's token prev[fb] (pipelined decode), the others
    their staged id."""
    V, Hd, T = 50, 33, 7
    emb = rng.standard_normal((V, Hd)).astype(np.float16)
    ids = rng.integers(0, V, T).astype(np.int32)
    prev = rng.integers(0, V, 5).astype(np.int32)
    fb = np.array([3, -1, 0, 4, -1, -1, 1], np.int32)
    want = np.where(fb >= 0, prev[np.maximum(fb, 0)], ids)
    h = poisoned((T, Hd), torch.float32)
    ks.embed(dev(ids), dev(emb), h, T, fb=dev(fb), prev=dev(prev))
    assert np.array_equal(host(h), emb[want].astype(np.float32))


@pytest.mark.parametrize("V", [1, 2])
def test_tiny_vocab(V):
    x = np.zeros((2, V), np.float32)
    assert launch(x, [0.0, 1.0], [0, 1], [1.0, 0.5], [1, 2], [0, 0]).tolist() == [0, 0]
