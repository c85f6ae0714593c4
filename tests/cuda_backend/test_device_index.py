"""CudaOptions.device_index (zoi.compile / zoi.load with device="cuda:N"): the
backend is built on, and bound to, that GPU; several backends run at once from their own
threads (zoi serve --gpus: one engine and worker thread per GPU).

In the interpreter (CI) the index is only recorded (there are no GPUs) and the forward is
checked against a backend without one; compiled on a GPU (scripts/gpu_check.sh) every
visible GPU is used, buffers are checked to live on it, the caller's current device is left
as it was, and a call from a thread whose current device is another GPU still runs on the
engine's own."""

from __future__ import annotations

import contextlib
import threading

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from tests import triton_mode  # noqa: E402
from tests.cuda_backend.cuda_helpers import batch, min_cosine, tiny_model  # noqa: E402

from zoi.backends.reference import ReferenceBackend  # noqa: E402

COMPILED = not triton_mode.interpreted()
pytestmark = pytest.mark.skipif(
    COMPILED and not torch.cuda.is_available(), reason="compiled Triton needs a CUDA GPU"
)
LENS = [5, 1, 9] if not COMPILED else [5, 1, 9, 32, 17]  # <= max_tokens 64


def _backend(model, index):
    from zoi.backends.cuda.backend import CudaBackend
    from zoi.backends.cuda.options import CudaOptions

    return CudaBackend(
        model,
        buckets=[16, 64],
        interpret=None if COMPILED else True,
        options=CudaOptions(device_index=index, persistent="off"),
    )


@pytest.fixture(scope="module")
def model():
    return tiny_model("fp16", max_tokens=64)


def _run(be, lens, seed=0):
    ids, pos, cu = batch(lens, be.spec.vocab_size, seed)
    return be.run(ids, pos, cu, False)


def test_each_gpu_gets_its_own_backend(model):
    ref = ReferenceBackend(model)
    ids, pos, cu = batch(LENS, model.spec.vocab_size, 0)
    want = ref.run(ids, pos, cu, False)
    indices = list(range(torch.cuda.device_count())) if COMPILED else [0, 1]
    before = torch.cuda.current_device() if COMPILED else None
    backends = [_backend(model, i) for i in indices]
    if COMPILED:
        assert torch.cuda.current_device() == before  # the build put the caller's device back
    for i, be in zip(indices, backends, strict=True):
        assert be.device_index == i
        got = _run(be, LENS)
        assert np.isfinite(got).all() and min_cosine(got, want) > 0.999
        if COMPILED:
            assert be.memory()["device_index"] == i
            assert be.wbuf.device == torch.device("cuda", i) and be.arena.device.index == i


def test_engines_run_at_once_from_their_own_threads(model):
    """Two backends (the same GPU twice when there is one, else two GPUs), each called from
    a worker thread whose current device is set elsewhere: answers stay correct."""
    n = torch.cuda.device_count() if COMPILED else 0
    indices = [0, 1] if n >= 2 else [0, 0]
    backends = [_backend(model, i) for i in indices]
    ref = ReferenceBackend(model)
    want = {s: ref.run(*batch(LENS, model.spec.vocab_size, s), False) for s in range(6)}
    errors: list = []
    got: dict = {}
    # the interpreter patches triton.language globally: one kernel at a time there
    one_at_a_time = threading.Lock() if not COMPILED else contextlib.nullcontext()

    def work(k, be):
        try:
            if COMPILED and n >= 2:
                torch.cuda.set_device(1 - indices[k])  # the other GPU current in this thread
            for s in range(6):
                with one_at_a_time:
                    got[(k, s)] = _run(be, LENS, s)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k, be)) for k, be in enumerate(backends)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors, errors
    for (_k, s), out in got.items():
        assert min_cosine(out, want[s]) > 0.999
    assert len(got) == 12


@pytest.mark.skipif(not COMPILED, reason="the interpreter has no GPUs to count")
def test_an_index_past_the_last_gpu_is_refused(model):
    from zoi.errors import BackendUnavailableError

    n = torch.cuda.device_count()
    with pytest.raises(BackendUnavailableError, match=f"torch sees {n} GPU"):
        _backend(model, n)
