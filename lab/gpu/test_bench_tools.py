"""The GPU benchmark's host-side helpers (no GPU needed): chunking a call over an engine
smaller than the call, as Engine.run_packed does."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")

from lab.gpu.bench import inputs, run_chunks  # noqa: E402


class _SumBackend:
    """Stands in for CudaBackend.run: per-sequence (sum of ids, length), checks its limits."""

    def __init__(self, max_tokens, max_batch):
        self.max_tokens, self.max_batch, self.calls = max_tokens, max_batch, []

    def run(self, ids, pos, cu, normalize):
        assert len(ids) <= self.max_tokens and len(cu) - 1 <= self.max_batch
        assert cu[0] == 0 and cu[-1] == len(ids) and len(pos) == len(ids)
        self.calls.append(len(cu) - 1)
        return np.array(
            [[ids[cu[i] : cu[i + 1]].sum(), cu[i + 1] - cu[i]] for i in range(len(cu) - 1)],
            np.float64,
        )


@pytest.mark.parametrize("max_tokens,max_batch", [(4096, 256), (300, 256), (128, 256), (1000, 3)])
def test_run_chunks_covers_every_sequence_once(max_tokens, max_batch):
    rng = np.random.default_rng(0)
    ids, pos, cu = inputs(rng, 10, 128)
    be = _SumBackend(max_tokens, max_batch)
    got = run_chunks(be, ids.reshape(-1), pos, cu)
    want = np.array([[ids[i].sum(), 128] for i in range(10)], np.float64)
    np.testing.assert_array_equal(got, want)
    assert sum(be.calls) == 10
    assert len(be.calls) == -(-10 // min(max_batch, max(1, max_tokens // 128)))
