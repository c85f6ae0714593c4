"""CpuOptions (zoi.backends.cpu.options): every field reaches the native core (the forced ISA as the
engine's and the dispatcher's active ISA, the pool's threads and pinning, the AMX thresholds
through their getter), bad values refused naming the value and the accepted ones, the environment
and explicit options giving the same engine, and the core itself reading no environment."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import threading

import numpy as np
import pytest
from helpers import batch, make_model, small_spec, supported_isas

from zoi import _cpu
from zoi.backends import make_backend
from zoi.backends.cpu import CpuBackend
from zoi.backends.cpu.options import (
    ARM_ISAS,
    X86_ISAS,
    CpuOptions,
    apply_cpu_options,
    build_isas,
)

ISAS = supported_isas()
ENV_VARS = ("ZOI_CPU_ISA", "ZOI_NUM_THREADS", "ZOI_PIN", "ZOI_AMX_MIN_M", "ZOI_AMX_NT_BYTES")
# the other architecture's ISA names: parsed by the core, never supported by this build
OTHER_ARCH = "neon" if build_isas() is X86_ISAS else "avx2"


@pytest.fixture(autouse=True)
def _defaults_after(monkeypatch):
    for v in ENV_VARS:
        monkeypatch.delenv(v, raising=False)
    yield
    CpuOptions().apply()  # the next test starts from the core's defaults


def _model():
    return make_model(small_spec(), "int8", max_tokens=64, max_batch=4)


def _pinned_threads() -> int:
    """Threads of this process whose affinity is one CPU (the pool pins its workers so)."""
    n = 0
    for t in os.listdir("/proc/self/task"):
        try:
            n += len(os.sched_getaffinity(int(t))) == 1
        except OSError:  # the thread ended meanwhile
            pass
    return n


def test_defaults_are_the_cores():
    assert CpuOptions().__dict__ == dict(_cpu.cpu_option_defaults())
    assert CpuOptions.from_env({}) == CpuOptions()
    assert set(ISAS) <= set(build_isas()) and "scalar" in ISAS
    if platform.machine().lower() in ("x86_64", "amd64"):
        assert build_isas() == X86_ISAS


@pytest.mark.parametrize("isa", ISAS)
def test_isa_reaches_the_engine_and_the_dispatcher(isa):
    m = _model()
    be = CpuBackend(m, options=CpuOptions(isa=isa))
    assert be.isa == isa and be.engine.isa == isa and _cpu.active_isa() == isa
    assert be.options.isa == isa
    got = be.run(*batch([9, 4], 300), True)
    want = CpuBackend(m, isa="scalar", options=CpuOptions(isa=isa)).run(*batch([9, 4], 300), True)
    assert np.isfinite(got).all() and np.abs(got - want).max() <= 1e-5
    # an engine's own isa= wins over the options'; options without an ISA give the best again
    other = "scalar" if isa != "scalar" else ISAS[0]
    assert CpuBackend(m, isa=other, options=CpuOptions(isa=isa)).isa == other
    assert CpuBackend(m, options=CpuOptions()).isa == _cpu.cpu_info()["best_isa"]
    assert _cpu.active_isa() == _cpu.cpu_info()["best_isa"]


@pytest.mark.parametrize("isa", ISAS)
def test_env_and_explicit_options_agree(isa, monkeypatch):
    m = _model()
    args = batch([9, 17, 4], 300)
    n = len(os.sched_getaffinity(0)) + 1  # not the default pool size
    explicit = CpuBackend(m, options=CpuOptions(isa=isa, num_threads=n, pin=False))
    want = explicit.run(*args, True).copy()
    assert _cpu.pool_size() == n and not _cpu.pool_pinned()
    CpuOptions().apply()
    assert _cpu.pool_size() == n - 1 and _cpu.pool_pinned()
    monkeypatch.setenv("ZOI_CPU_ISA", isa)
    monkeypatch.setenv("ZOI_NUM_THREADS", str(n))
    monkeypatch.setenv("ZOI_PIN", "0")
    # below the API's edge nothing reads the environment: no options keep what the core holds
    kept = CpuBackend(m)
    assert kept.options == CpuOptions() and _cpu.pool_size() == n - 1 and _cpu.pool_pinned()
    from_env = CpuBackend(m, options=CpuOptions.from_env())  # what zoi.compile / zoi.load pass
    assert from_env.options == explicit.options == CpuOptions.from_env()
    assert from_env.isa == isa and _cpu.active_isa() == isa
    assert _cpu.pool_size() == n and not _cpu.pool_pinned() and from_env.engine.nthreads == n
    np.testing.assert_array_equal(from_env.run(*args, True), want)
    # make_backend (zoi.compile / zoi.load's path) reads the same environment, or takes options
    assert make_backend(m, "cpu").isa == isa
    assert make_backend(m, "cpu", cpu_options=CpuOptions(isa="scalar")).isa == "scalar"


def test_env_fields_map_to_options():
    env = {
        "ZOI_CPU_ISA": "scalar",
        "ZOI_NUM_THREADS": "3",
        "ZOI_PIN": "0",
        "ZOI_AMX_MIN_M": "1",
        "ZOI_AMX_NT_BYTES": "0",
    }
    assert CpuOptions.from_env(env) == CpuOptions("scalar", 3, False, 1, 0)
    assert CpuOptions.from_env({"ZOI_PIN": "1"}).pin is True
    # an empty variable is unset; keyword fields win over the environment
    assert CpuOptions.from_env({v: "" for v in ENV_VARS}) == CpuOptions()
    assert CpuOptions.from_env(env, num_threads=1, isa=None) == CpuOptions(None, 1, False, 1, 0)


def test_num_threads_and_pin_restart_the_running_pool():
    """The pool takes new settings while it runs: its workers restart (after the current job);
    an engine built before keeps working, its threads capped at the new size."""
    m = _model()
    args = batch([20, 7, 33], 300)
    cpus = len(os.sched_getaffinity(0))
    big = CpuBackend(m, options=CpuOptions(num_threads=3))
    assert _cpu.pool_size() == 3 and big.engine.nthreads == 3 and _cpu.pool_pinned()
    want = big.run(*args, True).copy()
    if cpus > 1:  # workers 1 and 2 pinned, each to one CPU
        assert _pinned_threads() >= 2
    small = CpuBackend(m, options=CpuOptions(num_threads=2, pin=False))
    assert _cpu.pool_size() == 2 and small.engine.nthreads == 2 and not _cpu.pool_pinned()
    if cpus > 1:
        assert _pinned_threads() == 0  # the pinned workers were replaced by unpinned ones
    np.testing.assert_allclose(big.run(*args, True), want, atol=1e-6, rtol=0)
    np.testing.assert_allclose(small.run(*args, True), want, atol=1e-6, rtol=0)
    apply_cpu_options(CpuOptions(num_threads=1))
    assert _cpu.pool_size() == 1
    np.testing.assert_allclose(big.run(*args, True), want, atol=1e-6, rtol=0)
    apply_cpu_options(CpuOptions())  # 0: one thread per CPU of the affinity mask
    assert _cpu.pool_size() == cpus and _cpu.pool_pinned()
    np.testing.assert_allclose(big.run(*args, True), want, atol=1e-6, rtol=0)


def test_the_pool_restarts_safely_while_another_thread_runs_jobs():
    """New pool settings wait for the running job: a caller running an engine in a loop meanwhile
    gets the same outputs every time, and neither side hangs."""
    m = _model()
    args = batch([30, 5, 17], 300)
    be = CpuBackend(m, options=CpuOptions(num_threads=3))
    want = be.run(*args, True).copy()
    stop, bad, runs = threading.Event(), [], [0]

    def loop():
        while not stop.is_set():
            got = be.run(*args, True)
            if not np.allclose(got, want, atol=1e-6, rtol=0):
                bad.append(float(np.abs(got - want).max()))
            runs[0] += 1

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    try:
        for k in range(24):
            CpuOptions(num_threads=1 + k % 3, pin=k % 2 == 0).apply()
            assert _cpu.pool_size() == 1 + k % 3 and _cpu.pool_pinned() == (k % 2 == 0)
    finally:
        stop.set()
        t.join(timeout=60)
    assert not t.is_alive(), "the engine's caller hung"
    assert runs[0] > 0 and not bad, bad


def test_amx_thresholds_round_trip():
    CpuOptions(amx_min_m=1, amx_nt_bytes=0).apply()
    assert _cpu.amx_thresholds() == (1, 0)
    apply_cpu_options(CpuOptions.from_env({"ZOI_AMX_MIN_M": "40", "ZOI_AMX_NT_BYTES": "4096"}))
    assert _cpu.amx_thresholds() == (40, 4096)
    CpuOptions().apply()
    assert _cpu.amx_thresholds() == (16, 12 << 20)


@pytest.mark.parametrize(
    "kw,words",
    [
        ({"isa": "sse9"}, ["isa='sse9'", *build_isas()]),
        ({"isa": OTHER_ARCH}, [repr(OTHER_ARCH), "scalar"]),
        ({"isa": 3}, ["isa=3"]),
        ({"num_threads": -1}, ["num_threads=-1", ">= 0"]),
        ({"num_threads": 2.0}, ["num_threads=2.0", "integer"]),
        ({"num_threads": True}, ["num_threads=True"]),
        ({"pin": "yes"}, ["pin='yes'", "True or False"]),
        ({"amx_min_m": 0}, ["amx_min_m=0", ">= 1"]),
        ({"amx_nt_bytes": -5}, ["amx_nt_bytes=-5", ">= 0"]),
    ],
)
def test_bad_fields_are_refused(kw, words):
    with pytest.raises(ValueError) as e:
        CpuOptions(**kw)
    for w in words:
        assert w in str(e.value), (w, str(e.value))


@pytest.mark.parametrize(
    "env,words",
    [
        ({"ZOI_CPU_ISA": "sse9"}, ["ZOI_CPU_ISA=sse9", *build_isas()]),
        ({"ZOI_NUM_THREADS": "four"}, ["ZOI_NUM_THREADS=four", ">= 0"]),
        ({"ZOI_NUM_THREADS": "-2"}, ["ZOI_NUM_THREADS=-2"]),
        ({"ZOI_PIN": "no"}, ["ZOI_PIN=no", "0", "1"]),
        ({"ZOI_AMX_MIN_M": "0"}, ["ZOI_AMX_MIN_M=0", ">= 1"]),
        ({"ZOI_AMX_NT_BYTES": "12M"}, ["ZOI_AMX_NT_BYTES=12M", ">= 0"]),
    ],
)
def test_bad_env_is_refused_naming_the_variable(env, words, monkeypatch):
    with pytest.raises(ValueError) as e:
        CpuOptions.from_env(env)
    for w in words:
        assert w in str(e.value), (w, str(e.value))
    for k, v in env.items():  # the API's edge refuses it too (for every device), before any build
        monkeypatch.setenv(k, v)
    from zoi.compile_checks import _cpu_options

    for device in ("cpu", "reference"):
        with pytest.raises(ValueError, match=list(env)[0]):
            _cpu_options(device)


def test_an_isa_this_cpu_lacks_is_refused_and_changes_nothing(monkeypatch):
    forced = ISAS[-1]  # scalar: every CPU runs it
    CpuOptions(isa=forced).apply()
    before = (_cpu.active_isa(), _cpu.amx_thresholds())
    # the core's own check (another architecture's ISA: known, never supported here)
    with pytest.raises(ValueError, match="not supported by this CPU"):
        _cpu.set_forced_isa(OTHER_ARCH)
    with pytest.raises(ValueError, match="not one of"):
        _cpu.set_forced_isa("sse9")
    # the options' check names the field, the variable and what this CPU runs
    runs = {"scalar"}
    monkeypatch.setattr(_cpu, "isa_supported", lambda n: n in runs)
    lacking = next(i for i in build_isas() if i != "scalar")
    with pytest.raises(ValueError) as e:
        CpuOptions(isa=lacking, amx_min_m=3).apply()
    msg = str(e.value)
    assert f"isa={lacking!r}" in msg and "ZOI_CPU_ISA" in msg and "it runs: scalar" in msg
    assert (_cpu.active_isa(), _cpu.amx_thresholds()) == before
    with pytest.raises(ValueError, match="num_threads must be >= 0"):
        _cpu.configure_pool(-1, True)
    with pytest.raises(ValueError, match="amx_min_m must be >= 1"):
        _cpu.set_amx_thresholds(0, 0)


def test_apply_takes_cpu_options_only():
    with pytest.raises(TypeError, match="CpuOptions"):
        apply_cpu_options({"isa": "scalar"})
    with pytest.raises(ValueError, match="cpu_options is for device='cpu'"):
        make_backend(_model(), "reference", cpu_options=CpuOptions())


NO_ENV_SCRIPT = r"""
import json
from zoi import _cpu
core = [_cpu.active_isa(), _cpu.amx_thresholds()[0]]
from zoi.backends.cpu.options import CpuOptions, apply_cpu_options
apply_cpu_options()  # no options: nothing changes, nothing read
kept = [_cpu.active_isa(), _cpu.amx_thresholds()[0]]
apply_cpu_options(CpuOptions.from_env())
applied = [_cpu.active_isa(), _cpu.amx_thresholds()[0], _cpu.pool_size()]
print(json.dumps([core, kept, applied]))
"""


def test_the_core_reads_no_environment():
    """ZOI_* set for a fresh process: the core alone keeps its defaults; the options read at the
    API's edge carry the variables in."""
    env = dict(os.environ, ZOI_CPU_ISA="scalar", ZOI_AMX_MIN_M="7", ZOI_NUM_THREADS="1")
    out = subprocess.run(
        [sys.executable, "-c", NO_ENV_SCRIPT],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    core, kept, applied = json.loads(out.strip().splitlines()[-1])
    assert core == kept == [_cpu.cpu_info()["best_isa"], 16]
    assert applied == ["scalar", 7, 1]


EDGE_SCRIPT = r"""
from zoi import _cpu
from zoi.compile_checks import _cpu_options
print(_cpu_options("reference"), _cpu.pool_size())
"""


def test_the_edge_sizes_the_tokenizer_pool_for_every_device():
    """zoi.compile / zoi.load on a device other than the CPU still tokenise on the core's pool:
    ZOI_NUM_THREADS sizes it there too."""
    env = dict(os.environ, ZOI_NUM_THREADS="1")
    out = subprocess.run(
        [sys.executable, "-c", EDGE_SCRIPT], env=env, capture_output=True, text=True, check=True
    ).stdout
    assert out.split() == ["None", "1"]


def test_the_decoder_backend_applies_the_options(tmp_path):
    from zoi.decoder.cpu import CpuBackend as DecoderCpuBackend
    from zoi.decoder.loader import load_decoder
    from zoi.decoder.synthetic import write_decoder

    spec, w, _ = load_decoder(write_decoder(tmp_path, hidden=32, inter=48, layers=1))
    kw = dict(num_blocks=4, block_size=4, max_batch=1, max_seq_len=16)
    isa = ISAS[-1]
    be = DecoderCpuBackend(spec, w, options=CpuOptions(isa=isa, num_threads=1), **kw)
    assert be.isa == isa and _cpu.active_isa() == isa and _cpu.pool_size() == 1
    assert DecoderCpuBackend(spec, w, isa=ISAS[0], options=CpuOptions(isa=isa), **kw).isa == ISAS[0]


def test_every_accepted_name_is_one_the_core_parses():
    """Either architecture's names: the core parses them all (an unknown one raises)."""
    for name in set(X86_ISAS) | set(ARM_ISAS):
        assert isinstance(_cpu.isa_supported(name), bool)
    with pytest.raises(ValueError):
        _cpu.isa_supported("sse9")
