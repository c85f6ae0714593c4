"""`--batch-balance` and `--gc-freeze`: flags, variables, defaults, where they take effect."""

from __future__ import annotations

import argparse
import gc
from types import SimpleNamespace

import numpy as np
import pytest

from zoi.serve.app import apply_batch_balance
from zoi.serve.batcher import Batcher
from zoi.serve.cli import PROCESS_OPTIONS, config_from_args, freeze_heap, register
from zoi.serve.config import ServeConfig


def parse(argv, env=None, skip=()):
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers()
    register(sub)
    return config_from_args(ap.parse_args(["serve", *argv]), env or {}, skip=skip)


def test_flags_variables_and_defaults():
    c = parse([])
    assert c.batch_balance == "auto" and c.gc_freeze is True
    c = parse([], {"ZOI_BATCH_BALANCE": "off", "ZOI_GC_FREEZE": "0"})
    assert c.batch_balance == "off" and c.gc_freeze is False
    c = parse(
        ["--batch-balance", "on", "--gc-freeze"], {"ZOI_BATCH_BALANCE": "off", "ZOI_GC_FREEZE": "0"}
    )
    assert c.batch_balance == "on" and c.gc_freeze is True
    with pytest.raises(ValueError, match="ZOI_BATCH_BALANCE"):
        parse([], {"ZOI_BATCH_BALANCE": "sometimes"})
    with pytest.raises(SystemExit):
        parse(["--batch-balance", "sometimes"])
    with pytest.raises(ValueError, match="batch_balance must be auto, on or off"):
        ServeConfig(batch_balance="yes").validate()
    # not a process option: each replica of zoi deploy ray freezes its own heap
    assert "gc_freeze" not in PROCESS_OPTIONS
    assert parse(["--no-gc-freeze"], skip=PROCESS_OPTIONS).gc_freeze is False


def _service(device="cpu", engines=1, delay=0, mode="auto"):
    def run(seqs):
        return np.zeros((len(seqs), 4), np.float32)

    batcher = Batcher(run, 4, 100, 10)
    heads = SimpleNamespace(batcher=Batcher(run, 4, 100, 10, name="zoi-heads"))
    eng = SimpleNamespace(device=device)
    svc = SimpleNamespace(
        config=ServeConfig(batch_balance=mode, max_queue_delay_us=delay),
        engine=eng,
        engines=[eng] * engines,
        batcher=batcher,
        heads=heads,
    )
    return svc


@pytest.mark.parametrize(
    ("device", "engines", "delay", "mode", "want"),
    [
        ("cpu", 1, 0, "auto", True),
        ("cuda", 1, 0, "auto", False),
        ("cpu", 1, 1000, "auto", False),
        ("cpu", 1, 0, "off", False),
        ("cuda", 1, 0, "on", True),
    ],
)
def test_apply_batch_balance_sets_every_batcher(device, engines, delay, mode, want):
    svc = _service(device, engines, delay, mode)
    try:
        assert apply_batch_balance(svc) is want
        assert svc.batcher.balance is want and svc.heads.batcher.balance is want
    finally:
        svc.batcher.close()
        svc.heads.batcher.close()


def test_freeze_heap_takes_what_is_alive_out_of_the_scans():
    kept = [[i] for i in range(1000)]  # tracked containers alive at freeze time
    scanned = {id(o) for o in gc.get_objects()}  # what a full collection walks
    assert all(id(x) in scanned for x in kept)
    before = gc.get_freeze_count()  # a test process may have frozen objects before
    try:
        n = freeze_heap()
        # objects frozen while alive that die afterwards (temporaries, another thread's) leave
        # the count
        assert before + len(kept) <= n and gc.get_freeze_count() <= n
        scanned = {id(o) for o in gc.get_objects()}
        assert not any(id(x) in scanned for x in kept)
        later = [[0]]  # allocated after the freeze: scanned as usual
        assert id(later[0]) in {id(o) for o in gc.get_objects()}
    finally:
        gc.unfreeze()
