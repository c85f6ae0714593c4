"""GPU only (scripts/gpu_check.sh, ZOI_TRITON_COMPILED=1): CUDA-graph decode equal to eager launches,
greedy token-identical to transformers FP32 over 64 tokens on a Qwen2.5-0.5B-shaped model (2 layers,
smaller vocabulary), the Llama-3.2-1B shape (w8: weight-only INT8) running at its real sizes (split-K over 132 SMs,
a 128256 vocabulary) with its per-token decode time printed (the target lives in
lab/gpu/decode_bench.py, not in a test)."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
from tests.decoder.cuda.helpers import INTERP

from zoi.decoder.api import SamplingParams
from zoi.decoder.cuda import CudaDecoderBackend
from zoi.decoder.cuda.synth import random_weights, shape_spec
from zoi.decoder.loader import load_decoder
from zoi.decoder.synthetic import write_decoder

from ..dec_helpers import hf_greedy

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(INTERP, reason="compiled kernels on a GPU")]


def run(be, ps, params):
    for i, p in enumerate(ps):
        be.add(i, p, params)
    out = {i: [] for i in range(len(ps))}
    while be.pool().running:
        for e in be.step():
            out[e.seq_id].append(e.token_id)
    return out


@pytest.mark.parametrize("precision", ["w8", "int8", "fp16"])
def test_graphs_equal_eager(ckpt, precision):
    spec, w, _ = load_decoder(ckpt("llama_gqa"))
    rng = np.random.default_rng(0)
    ps = [rng.integers(0, spec.vocab_size, n).astype(np.int32) for n in (3, 17, 40, 1, 9)]
    kw = dict(precision=precision, num_blocks=64, block_size=16, max_batch=8, max_seq_len=128)
    sp = SamplingParams(max_new_tokens=20, temperature=0.8, top_k=30, seed=5, ignore_eos=True)
    a = run(CudaDecoderBackend(spec, w, graphs=True, **kw), ps, sp)
    b = run(CudaDecoderBackend(spec, w, graphs=False, **kw), ps, sp)
    assert a == b


def test_qwen2_shape_greedy_vs_transformers_64(tmp_path):
    folder = write_decoder(
        tmp_path / "q",
        arch="qwen2",
        vocab=4000,
        hidden=896,
        inter=4864,
        layers=2,
        heads=14,
        kv_heads=2,
        tie=True,
        rope_theta=1e6,
        max_pos=512,
    )
    spec, w, _ = load_decoder(folder)
    be = CudaDecoderBackend(spec, w, precision="fp32", max_batch=4, max_seq_len=256)
    rng = np.random.default_rng(1)
    ps = [rng.integers(0, spec.vocab_size, n).astype(np.int32) for n in (30, 1, 77)]
    out = run(be, ps, SamplingParams(max_new_tokens=64, ignore_eos=True))
    for i, p in enumerate(ps):
        assert out[i] == hf_greedy(folder, p.tolist(), 64), i


def test_llama_1b_shape_w8_decode():
    spec = shape_spec("llama-3.2-1b")
    w = random_weights(spec, 0)
    be = CudaDecoderBackend(spec, w, precision="w8", max_batch=1, max_seq_len=1024)
    del w
    p = np.random.default_rng(0).integers(0, spec.vocab_size, 128).astype(np.int32)
    be.add(0, p, SamplingParams(max_new_tokens=200, ignore_eos=True))
    t0 = time.perf_counter()
    first = be.step()
    ttft = time.perf_counter() - t0
    times, toks = [], [first[0].token_id]
    while be.pool().running:
        t0 = time.perf_counter()
        ev = be.step()
        times.append(time.perf_counter() - t0)
        toks.append(ev[0].token_id)
    assert len(toks) == 200 and all(0 <= t < spec.vocab_size for t in toks)
    print(
        json.dumps(
            {
                "llama-3.2-1b w8 b1": {
                    "ttft_ms_128": round(ttft * 1e3, 2),
                    "decode_ms_median": round(float(np.median(times)) * 1e3, 3),
                    "graph_us": round(be.time_decode_graph(1), 1),
                }
            }
        )
    )


@pytest.mark.parametrize("precision", ["w8", "fp16"])
def test_pdl_equals_no_pdl(ckpt, precision):
    """Programmatic dependent launch (and the L2 prefetch of W before the wait) changes when the
    kernels start, never what they compute: the same tokens, step for step, graphs and eager."""
    spec, w, _ = load_decoder(ckpt("llama_gqa"))
    rng = np.random.default_rng(2)
    ps = [rng.integers(0, spec.vocab_size, n).astype(np.int32) for n in (5, 33, 2, 70)]
    kw = dict(precision=precision, num_blocks=64, block_size=16, max_batch=8, max_seq_len=128)
    sp = SamplingParams(max_new_tokens=24, temperature=0.7, top_p=0.9, seed=9, ignore_eos=True)
    on = CudaDecoderBackend(spec, w, pdl=True, prefetch=True, **kw)
    assert on.pdl and on.prefetch and on.memory()["pdl"]
    a = run(on, ps, sp)
    assert a == run(CudaDecoderBackend(spec, w, pdl=False, **kw), ps, sp)
    assert a == run(CudaDecoderBackend(spec, w, pdl=True, **kw), ps, sp)
    assert a == run(
        CudaDecoderBackend(spec, w, pdl=True, prefetch=True, graphs=False, **kw), ps, sp
    )


@pytest.mark.parametrize("M", [1, 32, 300])
@pytest.mark.parametrize("wdt", ["int8", "fp16", "fp32"])
@pytest.mark.parametrize("pdl", [False, True])
def test_linear_real_configs(M, wdt, pdl):
    """The tile configs the backend picks on this GPU (split-K, 256-wide K, 4 stages) at the
    Llama-3.2-1B sites, against numpy."""
    from tests.decoder.cuda.test_kernels_linear import TOL, run_case

    from zoi.backends.cuda.kernels import linear_decode as kl

    if wdt == "fp32" and M > 1:
        pytest.skip("fp32 weights: one shape is enough")
    import torch

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rng = np.random.default_rng(M)
    wb = {"int8": 1, "fp16": 2, "fp32": 4}[wdt]
    for N, K, kw in (
        (3072, 2048, dict(rms=True, bias=True)),
        (8192, 2048, dict(rms=True, swiglu=True)),
        (2048, 8192, dict(res=True)),
    ):
        cfg = kl.pick_config(M, N, K, sms, wbytes=wb, swiglu=kw.get("swiglu", False))
        assert run_case(rng, M, N, K, wdt, cfg, reps=2, pdl=pdl, **kw) < TOL[wdt], (N, K, cfg)


@pytest.mark.parametrize("M", [8, 32, 300])
def test_w8a8_real_configs(M):
    """W8A8 (int8 x in the mma / dot kernels) with the tiles the backend picks at the Qwen2.5-0.5B
    and Llama-3.2-1B sites, against the int8-x reference of the same K tiles."""
    import torch
    from tests.decoder.cuda.test_kernels_linear import run_case

    from zoi.backends.cuda.kernels import linear_decode as kl

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rng = np.random.default_rng(M + 1)
    for N, K, kw in (
        (1152, 896, dict(rms=True, bias=True)),
        (4864, 896, dict(rms=True, swiglu=True)),
        (896, 4864, dict(res=True)),
        (3072, 2048, dict(rms=True)),
    ):
        cfg = kl.pick_config(M, N, K, sms, wbytes=1, swiglu=kw.get("swiglu", False))
        assert run_case(rng, M, N, K, "int8", cfg, reps=2, a8=True, **kw) < 1e-3, (N, K, cfg)
