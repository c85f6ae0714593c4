"""Generation on the CPU engine, every ISA: greedy token-identical to transformers FP32, logits
against the numpy reference, chunked prefill, threads, INT8 (W8A8) against its exact emulation, the
sampler against numpy's."""

from __future__ import annotations

import numpy as np
import pytest
from tests.fixtures import supported_isas

from zoi.decoder.api import SamplingParams
from zoi.decoder.compile import compile_decoder
from zoi.decoder.cpu import CpuBackend
from zoi.decoder.loader import load_decoder
from zoi.decoder.reference import ReferenceBackend
from zoi.errors import InputError

from .dec_helpers import MODELS, PROMPTS, hf_greedy

pytest.importorskip("zoi._cpu")
ISAS = supported_isas()


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("name", list(MODELS))
def test_greedy_token_identical_to_transformers(ckpt, name, isa):
    g = compile_decoder(
        ckpt(name), device="cpu", max_seq_len=256, kv_blocks=50, block_size=8, isa=isa
    )
    assert g.backend.isa == isa
    outs = g.generate(PROMPTS, max_new_tokens=64)
    for o in outs:
        assert len(o.token_ids) == 64
        assert o.token_ids == hf_greedy(ckpt(name), o.prompt_ids, 64)
    for i in (0, 1):  # alone
        assert g.generate(PROMPTS[i], max_new_tokens=64)[0].token_ids == outs[i].token_ids
    assert g.backend.pool().free_blocks == 50 and g.backend.pool().running == 0


def _drive(backends, prompts, params, steps):
    """Admit prompts on each backend, step them together; returns per backend the event lists."""
    for be in backends:
        for i, p in enumerate(prompts):
            be.add(i, p, params[i] if isinstance(params, list) else params)
    trace = [[] for _ in backends]
    for _ in range(steps):
        for j, be in enumerate(backends):
            trace[j].append([(e.seq_id, e.token_id, e.finish) for e in be.step()])
    return trace


def _prompts(spec, lengths, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, spec.vocab_size, n).astype(np.int32) for n in lengths]


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("name", ["llama_gqa", "qwen3"])
def test_logits_match_reference_each_step(ckpt, name, isa):
    spec, w, _ = load_decoder(ckpt(name))
    c = CpuBackend(spec, w, num_blocks=30, block_size=5, max_batch=4, max_seq_len=120, isa=isa)
    r = ReferenceBackend(spec, w, num_blocks=30, block_size=5, max_batch=4, max_seq_len=120)
    for i, p in enumerate(_prompts(spec, [9, 31, 1])):
        c.add(i, p, SamplingParams(max_new_tokens=12))
        r.add(i, p, SamplingParams(max_new_tokens=12))
    for _ in range(12):
        ec, er = c.step(), r.step()
        assert [(e.seq_id, e.token_id, e.finish) for e in ec] == [
            (e.seq_id, e.token_id, e.finish) for e in er
        ]
        lc, lr = c.last_logits(), r.last_logits
        assert np.isfinite(lc).all()
        assert np.abs(lc - lr).max() < 1e-5 * np.abs(lr).max()


@pytest.mark.parametrize("isa", ISAS)
def test_chunked_prefill_and_threads_change_nothing(ckpt, isa):
    spec, w, _ = load_decoder(ckpt("qwen2"))
    ps = _prompts(spec, [40, 3, 17], seed=1)
    p = SamplingParams(max_new_tokens=10)
    bes = [
        CpuBackend(
            spec, w, num_blocks=40, block_size=4, max_batch=3, max_seq_len=100, isa=isa, **kw
        )
        for kw in ({}, {"max_tokens": 7}, {"threads": 1}, {"max_tokens": 1})
    ]
    t = _drive(bes, ps, p, 10)
    assert t[0] == t[1] == t[2] == t[3]
    assert sum(len(s) for s in t[0]) == 30


@pytest.mark.parametrize("isa", ISAS)
def test_long_context_matches_reference(ckpt, tmp_path, isa):
    """Contexts past 512 positions (the decode attention then splits over the sequence)."""
    from zoi.decoder.synthetic import write_decoder

    d = write_decoder(
        tmp_path / "long",
        arch="llama",
        heads=4,
        kv_heads=1,
        hidden=32,
        inter=48,
        layers=1,
        max_pos=1024,
        seed=9,
    )
    spec, w, _ = load_decoder(d)
    c = CpuBackend(
        spec, w, num_blocks=50, block_size=16, max_batch=1, max_seq_len=800, isa=isa, threads=1
    )
    r = ReferenceBackend(spec, w, num_blocks=50, block_size=16, max_batch=1, max_seq_len=800)
    tc, tr = _drive([c, r], _prompts(spec, [700], seed=3), SamplingParams(max_new_tokens=6), 6)
    assert tc == tr
    assert np.abs(c.last_logits() - r.last_logits).max() < 1e-4 * np.abs(r.last_logits).max()


@pytest.mark.parametrize("isa", ISAS)
def test_sampler_matches_numpy(ckpt, isa):
    spec, w, _ = load_decoder(ckpt("qwen3"))
    ps = _prompts(spec, [6, 11, 2, 8], seed=4)
    params = [
        SamplingParams(max_new_tokens=20, temperature=0.9, top_k=30, top_p=0.9, seed=1),
        SamplingParams(max_new_tokens=20, temperature=1.3, seed=2),
        SamplingParams(max_new_tokens=20, temperature=0.7, top_p=0.5, seed=3),
        SamplingParams(max_new_tokens=20, temperature=2.0, top_k=5, seed=4),
    ]
    c = CpuBackend(spec, w, num_blocks=40, block_size=8, max_batch=4, max_seq_len=64, isa=isa)
    r = ReferenceBackend(spec, w, num_blocks=40, block_size=8, max_batch=4, max_seq_len=64)
    tc, tr = _drive([c, r], ps, params, 20)
    assert tc == tr
    toks = [[ev[1] for step in tc for ev in step if ev[0] == i] for i in range(4)]
    assert len(set(toks[1])) > 5 and len(set(toks[0])) > 3  # it samples, not argmax over and over


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("name", ["llama_tied", "qwen3"])
def test_int8_matches_its_emulation(ckpt, name, isa):
    """precision="int8" (W8A8: the encoders' INT8 GEMM) against numpy's exact integer emulation."""
    spec, w, _ = load_decoder(ckpt(name))
    ps = _prompts(spec, [12, 5, 30], seed=2)
    p = SamplingParams(max_new_tokens=8)
    c = CpuBackend(
        spec,
        w,
        precision="int8",
        num_blocks=40,
        block_size=8,
        max_batch=3,
        max_seq_len=100,
        isa=isa,
    )
    r = ReferenceBackend(
        spec, w, num_blocks=40, block_size=8, max_batch=3, max_seq_len=100, w8a8=True
    )
    c32 = CpuBackend(spec, w, num_blocks=40, block_size=8, max_batch=3, max_seq_len=100, isa=isa)
    tc, tr, t32 = _drive([c, r, c32], ps, p, 1)
    assert tc == tr
    lc, lr, l32 = c.last_logits(), r.last_logits, c32.last_logits()
    assert np.isfinite(lc).all()
    assert np.abs(lc - lr).max() < 2e-3 * np.abs(lr).max()
    assert np.abs(lc - l32).max() < 0.1 * np.abs(l32).max()
    assert np.abs(lc - l32).max() > 1e-4 * np.abs(l32).max()  # it did quantise


def test_zoi_cpu_isa_forces_the_decoder_kernels(ckpt):
    import os
    import subprocess
    import sys

    code = (
        "from zoi.decoder.compile import compile_decoder; import sys; "
        "print(compile_decoder(sys.argv[1], max_seq_len=32).backend.isa)"
    )
    for isa in ISAS:
        env = dict(os.environ, ZOI_CPU_ISA=isa)
        out = subprocess.run(
            [sys.executable, "-c", code, str(ckpt("qwen2"))],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        assert out.stdout.strip() == isa


def test_precision_words(ckpt):
    """int8 is W8A8 (w8a8, its earlier name, runs the same); weight-only INT8 is refused by name."""
    spec, w, _ = load_decoder(ckpt("qwen3"))
    ps = _prompts(spec, [9, 4], seed=5)
    kw = dict(num_blocks=20, block_size=8, max_batch=2, max_seq_len=48)
    a, b = (CpuBackend(spec, w, precision=p, **kw) for p in ("int8", "w8a8"))
    ta, tb = _drive([a, b], ps, SamplingParams(max_new_tokens=5), 5)
    assert ta == tb
    assert np.array_equal(a.last_logits(), b.last_logits())
    for bad in ("w8", "fp16", "int4"):
        with pytest.raises(InputError, match="'fp32' or 'int8'"):
            CpuBackend(spec, w, precision=bad, **kw)


def test_decode_bench_cpu_rows(ckpt, tmp_path, monkeypatch):
    """`zoi bench` decode on the CPU providers (a tiny checkpoint in place of the real shapes):
    every row measured, none an error, the row naming its precision, ISA and threads."""
    from zoi.bench import decode

    monkeypatch.setitem(decode.WORKLOADS, "tiny-decode", "tiny")
    monkeypatch.setattr(decode, "model_folder", lambda shape, cache: ckpt("qwen2"))
    res = decode.run(
        ["tiny-decode"],
        ["zoi-int8", "zoi-fp32"],
        prompt_len=8,
        new_tokens=3,
        streams=[1],
        cache=tmp_path,
        out=tmp_path / "r.json",
        devices={"cpu"},
    )
    rows = {r["provider"]: r for r in res["rows"]}
    assert sorted(rows) == ["zoi-fp32", "zoi-int8"]
    for name, r in rows.items():
        assert "error" not in r, r.get("error")
        assert r["precision"] == name.split("-")[1] and r["threads"] >= 1 and r["isa"]
        assert r["decode_ms_per_token"] > 0 and r["ttft_ms"] > 0
