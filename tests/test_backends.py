"""The Backend protocol (zoi.backends.base): every backend satisfies it, and the engine
needs nothing else of a backend."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

from zoi.backends.base import Backend
from zoi.backends.reference import ReferenceBackend
from zoi.graph.synthetic import random_model

MEMBERS = ("run", "run_into", "memory")


def _backend_classes():
    out = [ReferenceBackend]
    try:
        from zoi.backends.cpu import CpuBackend

        out.append(CpuBackend)
    except ImportError:  # the native core is not built
        pass
    from zoi.backends.cuda.backend import CudaBackend  # imports without torch / triton

    out.append(CudaBackend)
    return out


@pytest.mark.parametrize("cls", _backend_classes(), ids=lambda c: c.name)
def test_every_backend_class_has_the_protocol_signatures(cls):
    assert isinstance(cls.name, str) and cls.name in ("reference", "cpu", "cuda")
    for m in MEMBERS:
        want = list(inspect.signature(getattr(Backend, m)).parameters)
        got = list(inspect.signature(getattr(cls, m)).parameters)
        assert got == want, f"{cls.__name__}.{m}{got} is not Backend.{m}{want}"


def _batch(rng, lens, vocab=97):
    ids = rng.integers(0, vocab, int(sum(lens))).astype(np.int32)
    pos = np.concatenate([np.arange(n) for n in lens]).astype(np.int32)
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    return ids, pos, cu


def _instances():
    model = random_model("fp32", hidden=40, heads=5, layers=2, inter=72, max_tokens=64)
    out = [pytest.param(lambda: ReferenceBackend(model), id="reference")]
    try:
        from zoi.backends.cpu import CpuBackend

        out.append(pytest.param(lambda: CpuBackend(model), id="cpu"))
    except ImportError:
        pass
    return out


@pytest.mark.parametrize("make", _instances())
@pytest.mark.parametrize("normalize", [False, True])
def test_run_into_writes_what_run_returns(make, normalize):
    be = make()
    assert isinstance(be, Backend)
    ids, pos, cu = _batch(np.random.default_rng(1), [5, 1, 17, 9])
    want = be.run(ids, pos, cu, normalize)
    assert want.dtype == np.float32 and want.shape == (4, 40) and np.isfinite(want).all()
    out = np.full((6, 40), np.nan, np.float32)  # larger than B: rows past B stay untouched
    assert be.run_into(ids, pos, cu, normalize, out[:4]) is not None
    np.testing.assert_array_equal(out[:4], want)
    assert np.isnan(out[4:]).all()
    assert be.memory()["weights_bytes"] > 0


class _OnlyTheProtocol:
    """A backend with the protocol's members and nothing else (no attribute to probe)."""

    __slots__ = ("_be", "calls")
    name = "reference"

    def __init__(self, be):
        self._be, self.calls = be, []

    def run(self, ids, positions, cu_seqlens, normalize):
        self.calls.append("run")
        return self._be.run(ids, positions, cu_seqlens, normalize)

    def run_into(self, ids, positions, cu_seqlens, normalize, out):
        self.calls.append("run_into")
        return self._be.run_into(ids, positions, cu_seqlens, normalize, out)

    def memory(self):
        return self._be.memory()

    def submit(self, ids, positions, cu_seqlens, normalize, out):
        self.calls.append("submit")
        return self._be.submit(ids, positions, cu_seqlens, normalize, out)

    def wait(self, ticket):
        self.calls.append("wait")
        return self._be.wait(ticket)


def test_the_engine_uses_only_the_protocol():
    from zoi.engine import Engine

    model = random_model("fp32", hidden=40, heads=5, layers=1, inter=72, max_tokens=64)
    eng = Engine(model, None, "reference")  # run_packed needs no tokenizer
    ref = eng.backend
    eng.backend = _OnlyTheProtocol(ref)
    assert isinstance(eng.backend, Backend)
    lens = [30, 30, 30, 7]  # two chunks of max_tokens 64
    ids, pos, cu = _batch(np.random.default_rng(2), lens)
    got = eng.run_packed(ids, pos, cu, normalize=True)
    assert eng.backend.calls == ["submit", "submit", "wait", "wait"]  # pipelined (zoi.pipeline)
    np.testing.assert_allclose(got, ref.run(ids, pos, cu, True), rtol=1e-5, atol=1e-6)
    assert eng.memory() == ref.memory()
