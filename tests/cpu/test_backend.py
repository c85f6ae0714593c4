"""Whole-model CpuBackend against ReferenceBackend (fp32 and the emulated INT8 path), every ISA,
batch independence, threads, two engines with concurrent callers, bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from helpers import batch, make_model, minilm_spec, small_spec, supported_isas

from zoi import _cpu
from zoi.backends.cpu import CpuBackend
from zoi.backends.reference import ReferenceBackend

ISAS = supported_isas()
LENGTHS = [5, 1, 17, 33, 2]


def check(cpu: CpuBackend, model, lengths, atol, normalize=True, seed=0):
    ids, pos, cu = batch(lengths, model.spec.vocab_size, seed, model.spec.position_offset)
    want = ReferenceBackend(model).run(ids, pos, cu, normalize)
    got = cpu.run(ids, pos, cu, normalize)
    assert got.shape == want.shape and got.dtype == np.float32
    assert np.isfinite(got).all()
    err = float(np.abs(got - want).max())
    assert err <= atol, f"max abs diff {err:.3g} > {atol}"
    return err


@pytest.mark.parametrize("isa", ISAS)
def test_fp32_model_matches_reference(isa):
    m = make_model(small_spec(), "fp32", max_tokens=128, max_batch=8)
    be = CpuBackend(m, isa=isa)
    assert be.isa == isa and be.memory()["isa"] == isa
    check(be, m, LENGTHS, 2e-6)
    check(be, m, LENGTHS, 2e-5, normalize=False)
    check(be, m, [1], 2e-6)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("embed_int8", [True, False])
def test_int8_model_matches_emulation(isa, embed_int8):
    schemes = {"l0.qkv": "static", "l1.ffn2": "fp32", "l1.o": "static"}
    m = make_model(
        small_spec(), "int8", max_tokens=128, max_batch=8, embed_int8=embed_int8, schemes=schemes
    )
    be = CpuBackend(m, isa=isa)
    assert be.linear_kinds["l0.qkv"] == "int8-static" and be.linear_kinds["l1.ffn2"] == "fp32"
    assert be.linear_kinds["l0.ffn1"] == "int8"
    check(be, m, LENGTHS, 1e-3)
    check(be, m, [1], 1e-3)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("default_scheme", ["dynamic_asym", "dynamic"])
def test_int8_schemes_and_act_transform_match_quant_forward(isa, default_scheme):
    """dynamic_asym activations and the SmoothQuant pre-transform (p.act_mul / p.act_shift),
    against zoi.quant.forward.run_graph (the emulation the quantiser calibrates with)."""
    from zoi.quant.forward import run_graph

    schemes = {"l0.o": "static", "l1.ffn2": "fp32", "l1.qkv": "dynamic", "l1.o": "weight_only"}
    tr = {"l0.qkv": "shift+mul", "l0.ffn2": "mul", "l1.ffn1": "mul", "l0.o": "mul"}
    m = make_model(
        small_spec(),
        "int8",
        max_tokens=128,
        max_batch=8,
        schemes=schemes,
        default_scheme=default_scheme,
        act_transforms=tr,
    )
    be = CpuBackend(m, isa=isa)
    assert be.linear_kinds["l0.ffn1"] == (
        "int8-dynamic_asym" if default_scheme == "dynamic_asym" else "int8"
    )
    assert be.linear_kinds["l1.o"] == "fp32" and "l1.o.w_q" in m.weights  # weight-only INT8
    for lengths, seed in [(LENGTHS, 0), ([1], 1), ([64, 3], 2)]:
        ids, pos, cu = batch(lengths, m.spec.vocab_size, seed)
        want = run_graph(m.graph, m.weights, ids, pos, cu, quant=m.quant, normalize=True)
        got = be.run(ids, pos, cu, True)
        assert np.isfinite(got).all()
        assert np.abs(got - want).max() <= 1e-3


@pytest.mark.parametrize(
    "variant",
    [
        dict(pooling="cls", act="gelu_tanh"),
        dict(pooling="max", act="relu", type_vocab_size=0),
        dict(
            arch="roberta",
            position_offset=2,
            type_vocab_size=1,
            hidden=48,
            heads=4,
            intermediate=80,
            eps=1e-5,
        ),
        dict(hidden=36, heads=3, intermediate=50, layers=1),
    ],
)
@pytest.mark.parametrize("precision", ["fp32", "int8"])
@pytest.mark.parametrize("isa", ISAS)
def test_model_variants(variant, precision, isa):
    m = make_model(small_spec(**variant), precision, max_tokens=96, max_batch=6, seed=3)
    be = CpuBackend(m, isa=isa)
    check(be, m, [3, 31, 1, 9], 1e-3 if precision == "int8" else 3e-6)


@pytest.fixture(scope="module")
def minilm2():
    spec = minilm_spec(layers=2)
    m = make_model(spec, "int8", max_tokens=160, max_batch=16)
    return m, make_model(spec, "fp32", max_tokens=16).weight_bytes()


@pytest.mark.parametrize("isa", ISAS)
def test_minilm_shape_int8_and_memory(isa, minilm2):
    """Every ISA the machine runs (not only the active one): the emulation's results, and 8-bit
    weights in memory (INT8 weights held <= 0.27x the FP32 model's)."""
    m, fp32_bytes = minilm2
    be = CpuBackend(m, isa=isa)
    assert be.isa == isa
    check(be, m, [128], 1e-3)
    check(be, m, [16], 1e-3, seed=1)
    check(be, m, [7, 40, 3, 1, 9], 1e-3, seed=2)
    mem = be.memory()
    assert mem["isa"] == isa
    assert mem["weights_bytes"] <= 0.27 * fp32_bytes, (mem, fp32_bytes)
    # the linears' packed panels are 1 byte per weight (16-bit panels would be 2 lin)
    W = m.weights
    lin = sum(W[k].size for k in W if k.endswith(".w_q"))
    lin_prefixes = {k[: -len(".w_q")] for k in W if k.endswith(".w_q")}
    other = sum(W[k].nbytes for k in W if k.rsplit(".", 1)[0] not in lin_prefixes)
    assert lin <= mem["weights_bytes"] - other <= 1.1 * lin, (mem, other, lin)
    assert mem["arena_bytes"] == m.plan.arena_bytes


@pytest.mark.parametrize("precision", ["fp32", "int8"])
@pytest.mark.parametrize("isa", ISAS)
def test_batch_equals_single_bitwise(precision, isa):
    m = make_model(small_spec(), precision, max_tokens=128, max_batch=8)
    be = CpuBackend(m, isa=isa)
    ids, pos, cu = batch(LENGTHS, m.spec.vocab_size, 5)
    full = be.run(ids, pos, cu, True)
    for b in range(len(LENGTHS)):
        a, e = cu[b], cu[b + 1]
        one = be.run(ids[a:e], pos[a:e], np.array([0, e - a], np.int32), True)
        np.testing.assert_array_equal(one[0], full[b])


@pytest.mark.parametrize("precision", ["fp32", "int8"])
@pytest.mark.parametrize("isa", ISAS)
def test_threads_give_identical_results(precision, isa):
    m = make_model(small_spec(), precision, max_tokens=128, max_batch=8)
    ids, pos, cu = batch(LENGTHS, m.spec.vocab_size, 7)
    outs = []
    for nt in (1, 2, 3):  # more than the pool: clamped
        be = CpuBackend(m, isa=isa, nthreads=nt)
        assert be.engine.nthreads == min(nt, _cpu.pool_size())
        outs.append(be.run(ids, pos, cu, False))
    for o in outs[1:]:
        np.testing.assert_array_equal(o, outs[0])


def test_two_engines_concurrent_callers():
    m1 = make_model(small_spec(), "int8", max_tokens=128, max_batch=8, seed=1)
    m2 = make_model(small_spec(pooling="cls"), "fp32", max_tokens=64, max_batch=4, seed=2)
    e1, e2 = CpuBackend(m1), CpuBackend(m2)
    cases = []
    for i, (be, lengths) in enumerate([(e1, LENGTHS), (e2, [9, 20]), (e1, [1]), (e2, [64])]):
        ids, pos, cu = batch(lengths, 300, i)
        cases.append((be, ids, pos, cu, be.run(ids, pos, cu, True)))
    errors = []

    def worker(k):
        try:
            for j in range(40):
                be, ids, pos, cu, want = cases[(k + j) % len(cases)]
                got = be.run(ids, pos, cu, True)
                if not np.array_equal(got, want):
                    errors.append((k, j))
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    ts = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors, errors[:5]


def test_bad_batches_raise():
    m = make_model(small_spec(), "int8", max_tokens=64, max_batch=4)
    be = CpuBackend(m)
    ids, pos, cu = batch([10, 5], 300)
    with pytest.raises(ValueError, match="cu_seqlens"):
        be.run(ids, pos, np.array([0, 10, 14], np.int32), False)
    with pytest.raises(ValueError, match="increasing"):
        be.run(ids, pos, np.array([0, 10, 10, 15], np.int32), False)
    bad = ids.copy()
    bad[3] = 300
    with pytest.raises(ValueError, match="vocabulary"):
        be.run(bad, pos, cu, False)
    with pytest.raises(ValueError, match="position"):
        be.run(ids, pos + 100, cu, False)
    big_ids, big_pos, big_cu = batch([40, 30], 300)
    with pytest.raises(ValueError, match="max_tokens"):
        be.run(big_ids, big_pos, big_cu, False)
    with pytest.raises(ValueError, match="max_batch"):
        be.run(*batch([1] * 5, 300), False)
    assert np.isfinite(be.run(ids, pos, cu, False)).all()  # still usable


PIN_SCRIPT = r"""
import os, sys
sys.path.insert(0, sys.argv[1])
from helpers import make_model, small_spec, batch
from zoi import _cpu
from zoi.backends.cpu import CpuBackend
from zoi.compile_checks import _cpu_options
m = make_model(small_spec(), "int8", max_tokens=64, max_batch=4)
be = CpuBackend(m, options=_cpu_options("cpu"))  # the environment, read at the API's edge
be.run(*batch([20], 300), True)
aff = [sorted(os.sched_getaffinity(int(t))) for t in os.listdir("/proc/self/task")]
import json
print(json.dumps([_cpu.pool_size(), be.engine.nthreads, _cpu.pool_cpus(), aff]))
"""


@pytest.mark.parametrize("n", ["1", "2", "3"])
def test_num_threads_env_and_pinning(n):
    env = dict(os.environ, ZOI_NUM_THREADS=n)
    out = subprocess.run(
        [sys.executable, "-c", PIN_SCRIPT, str(Path(__file__).parent)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    pool, nthreads, cpus, aff = json.loads(out.strip().splitlines()[-1])
    assert pool == int(n) and nthreads == int(n)
    pinned = [a for a in aff if len(a) == 1]
    if len(cpus) > 1:  # every worker (threads 1..n-1) pinned to one CPU of the mask
        assert len(pinned) >= int(n) - 1


ISA_SCRIPT = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
from helpers import batch, make_model, small_spec
from zoi import _cpu
from zoi.backends.cpu import CpuBackend
from zoi.compile_checks import _cpu_options
m = make_model(small_spec(), "int8", max_tokens=64, max_batch=4)
try:
    be = CpuBackend(m, options=_cpu_options("cpu"))  # the environment, read at the API's edge
    print(json.dumps([_cpu.active_isa(), be.isa, be.run(*batch([9, 4], 300), True).tolist()]))
except ValueError as e:
    print(json.dumps(["error", str(e), None]))
"""


@pytest.mark.parametrize("isa", ISAS + ["sse9"])
def test_zoi_cpu_isa_env_forces_the_variant(isa):
    env = dict(os.environ, ZOI_CPU_ISA=isa)
    out = subprocess.run(
        [sys.executable, "-c", ISA_SCRIPT, str(Path(__file__).parent)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    active, used, emb = json.loads(out.strip().splitlines()[-1])
    if isa == "sse9":
        assert active == "error" and "ZOI_CPU_ISA" in used
        return
    assert active == isa and used == isa
    m = make_model(small_spec(), "int8", max_tokens=64, max_batch=4)
    want = CpuBackend(m, isa="scalar").run(*batch([9, 4], 300), True)
    assert np.abs(np.array(emb, np.float32) - want).max() <= 1e-5


def test_caller_affinity_is_restored():
    m = make_model(small_spec(), "int8", max_tokens=64, max_batch=4)
    be = CpuBackend(m)
    before = os.sched_getaffinity(0)
    be.run(*batch([20, 7], 300), True)
    assert os.sched_getaffinity(0) == before


def test_release_file_pages_keeps_data(tmp_path):
    from zoi.backends.cpu.backend import _release_file_pages

    data = np.arange(300_000, dtype=np.int8)
    f = tmp_path / "w.bin"
    data.tofile(f)
    mm = np.memmap(f, dtype=np.uint8, mode="r")
    view = mm[4096 * 3 + 5 : 4096 * 60].view(np.int8)
    assert int(view.astype(np.int64).sum()) == int(
        data[4096 * 3 + 5 : 4096 * 60].astype(np.int64).sum()
    )
    assert _release_file_pages([view]) > 0
    np.testing.assert_array_equal(view, data[4096 * 3 + 5 : 4096 * 60])  # faults back from the file
    assert _release_file_pages([np.zeros(10000, np.int8)]) == 0  # not a file mapping: untouched
