"""The head kernels of the CUDA backend alone (kernels/sparse_pool.py: SPLADE's segmented
log1p(relu) max), against zoi.numerics.reference on awkward shapes, outputs poisoned."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from tests.ops.helpers import f16, poison, t  # noqa: E402

from zoi.numerics import reference as ref  # noqa: E402


@pytest.mark.parametrize("lens", [[1], [3, 1, 17], [129], [0, 2], [17, 3, 1, 1]])
@pytest.mark.parametrize("V", [1, 37, 1030])
def test_sparse_pool(lens, V):
    from zoi.backends.cuda.kernels import sparse_pool as k_sp

    rng = np.random.default_rng(sum(lens) + V)
    T, B = sum(lens), len(lens)
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    hdr = np.array([0, B, T, 0], np.int32)
    x = (rng.standard_normal((max(T, 1) + 2, V)) * 3 - 1).astype(np.float32)
    x[T:] = 50.0  # rows past T are no sequence's: must not be read
    p = poison((B + 3, V), torch.float32)
    k_sp.launch_sparse_pool(t(x, torch.float16), t(cu), t(hdr), p, B + 3, V)
    got = p.cpu().numpy()
    want = np.zeros((B, V))  # an empty sequence pools to zeros
    for i, n in enumerate(lens):
        if n:
            want[i] = ref.pool(f16(x[cu[i] : cu[i + 1]]), np.array([0, n]), "splade")[0]
    assert np.isfinite(got[:B]).all()
    np.testing.assert_allclose(got[:B], want, rtol=2e-6, atol=1e-7)
    assert np.isnan(got[B:]).all(), "rows past B must not be written"
    assert (got[:B] >= 0).all()


def test_sparse_pool_keeps_nan():
    from zoi.backends.cuda.kernels import sparse_pool as k_sp

    V, T = 20, 9
    x = np.random.default_rng(0).standard_normal((T, V)).astype(np.float32)
    x[4, 3] = np.nan
    cu = np.array([0, 5, T], np.int32)
    p = poison((2, V), torch.float32)
    k_sp.launch_sparse_pool(
        t(x, torch.float16), t(cu), t(np.array([0, 2, T, 0], np.int32)), p, 2, V
    )
    got = p.cpu().numpy()
    assert np.isnan(got[0, 3]) and np.isfinite(np.delete(got[0], 3)).all()
    assert np.isfinite(got[1]).all()
