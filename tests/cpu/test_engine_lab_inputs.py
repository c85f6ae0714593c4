"""The native engine's lab entry points (`profile`, `run_repeat`) check a batch as `run` does:
a batch past the plan's max_batch / max_tokens, ragged lengths or an id outside the vocabulary
is refused with a ValueError naming it, never run over the arena's end."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import batch, make_model, small_spec

from zoi.backends.cpu import CpuBackend


@pytest.fixture(scope="module")
def backend():
    m = make_model(small_spec(), "int8", max_tokens=64, max_batch=2)
    return CpuBackend(m)  # the owner of the weights the native engine reads: kept alive


@pytest.fixture()
def engine(backend):
    return backend.engine, backend.model.spec


def test_profile_runs_a_batch_within_the_plan(engine):
    eng, spec = engine
    ids, pos, cu = batch([5, 9], spec.vocab_size)
    steps = eng.profile(ids, pos, cu)
    assert steps and all(w >= 0 and c >= 0 for _, w, c in steps)


@pytest.mark.parametrize(
    "lens, match",
    [([8, 8, 8], "max_batch"), ([40, 40], "max_tokens")],
)
def test_profile_refuses_a_batch_past_the_plan(engine, lens, match):
    eng, spec = engine
    ids, pos, cu = batch(lens, spec.vocab_size)
    with pytest.raises(ValueError, match=match):
        eng.profile(ids, pos, cu)


def test_profile_refuses_bad_ids_and_lengths(engine):
    eng, spec = engine
    ids, pos, cu = batch([5, 9], spec.vocab_size)
    bad = ids.copy()
    bad[3] = spec.vocab_size
    with pytest.raises(ValueError, match="vocabulary"):
        eng.profile(bad, pos, cu)
    with pytest.raises(ValueError, match="differ in length"):
        eng.profile(ids, pos[:-1], cu)


def test_run_repeat_refuses_a_batch_past_the_plan(engine):
    eng, spec = engine
    ids, pos, cu = batch([8, 8, 8], spec.vocab_size)
    out = np.full((3, spec.hidden), np.nan, np.float32)
    with pytest.raises(ValueError, match="max_batch"):
        eng.run_repeat(ids, pos, cu, True, out, 2)


def test_engine_keeps_its_tables_alive_without_the_backend():
    """The native engine reads the embedding tables in place (not copied): it keeps the arrays
    alive itself, so an engine kept without its CpuBackend still reads live memory (CI runs this
    file under ASan, which reports a read of freed memory)."""
    import gc
    import weakref

    spec = small_spec()
    m = make_model(spec, "int8", max_tokens=64, max_batch=2)
    ids, pos, cu = batch([5, 9], spec.vocab_size)
    be = CpuBackend(m)
    want = be.run(ids, pos, cu, True)
    eng = be.engine
    held = [weakref.ref(a) for a in be._keep]  # the tables the engine was given
    assert held
    del be, m
    gc.collect()
    assert all(r() is not None for r in held), "the engine let its tables go"
    np.zeros(1 << 22, np.float32).fill(np.nan)  # reuse what was freed, if it was
    out = np.full((2, spec.hidden), np.nan, np.float32)
    eng.run(ids, pos, cu, True, out)
    np.testing.assert_array_equal(out, want)
    del eng
    gc.collect()
    assert all(r() is None for r in held), "the tables outlive the engine"
