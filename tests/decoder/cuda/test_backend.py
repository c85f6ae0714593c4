"""CudaDecoderBackend end to end (under the Triton interpreter in CI, compiled + CUDA graphs with
ZOI_TRITON_COMPILED=1): greedy token-identical to transformers FP32 (fp32 weights), fp16 / w8
(weight-only INT8) / int8 (W8A8) logits against the numpy reference, in-flight joins, pool
exhaustion, cancellation, seeds, the precision words."""

from __future__ import annotations

import numpy as np
import pytest
from tests.decoder.cuda.helpers import INTERP, rel

from zoi.decoder.api import FinishReason, KVPoolFull, SamplingParams
from zoi.decoder.cuda import CudaDecoderBackend
from zoi.decoder.loader import load_decoder
from zoi.decoder.reference import ReferenceBackend
from zoi.errors import InputError

from ..dec_helpers import hf_greedy

N_NEW = 4 if INTERP else 64  # the interpreter is slow; the GPU run does the full 64


def prompts(V, lens, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, V, n).astype(np.int32) for n in lens]


def drive(be, ps, params, max_steps=200):
    for i, p in enumerate(ps):
        be.add(i, p, params)
    out = {i: [] for i in range(len(ps))}
    fin = {}
    for _ in range(max_steps):
        ev = be.step()
        if not ev:
            break
        assert len({e.seq_id for e in ev}) == len(ev)  # one event per sequence per step
        for e in ev:
            out[e.seq_id].append(e.token_id)
            if e.finish is not None:
                fin[e.seq_id] = e.finish
    return out, fin


def make(ckpt, name, precision="fp32", **kw):
    spec, w, _ = load_decoder(ckpt(name))
    args = dict(num_blocks=24, block_size=16, max_batch=4, max_seq_len=96)
    args.update(kw)
    return spec, w, CudaDecoderBackend(spec, w, precision=precision, **args)


# the interpreter's default tier: qwen3 (q / k norms); llama_gqa in the slow tier (~18 s): its
# grouped heads run here in test_fp16_int8_logits_vs_reference (every precision), and the FP32
# path token-identical to transformers is qwen3's and qwen2's (test_in_flight_join_and_cancel)
@pytest.mark.parametrize(
    "name",
    [pytest.param("llama_gqa", marks=pytest.mark.slow), "qwen3"]
    if INTERP
    else ["qwen2", "llama_gqa", "qwen3", "llama_tied"],
)
def test_greedy_token_identical_to_transformers(ckpt, name):
    spec, _, be = make(ckpt, name)
    ps = prompts(spec.vocab_size, [7, 1, 19], seed=len(name))
    out, fin = drive(be, ps, SamplingParams(max_new_tokens=N_NEW, ignore_eos=True))
    for i, p in enumerate(ps):
        assert out[i] == hf_greedy(ckpt(name), p.tolist(), N_NEW), i
        assert fin[i] == FinishReason.LENGTH
    assert be.pool().free_blocks == be.pool().num_blocks and be.pool().running == 0


@pytest.mark.parametrize("precision,tol", [("fp16", 2e-2), ("w8", 6e-2), ("int8", 8e-2)])
def test_fp16_int8_logits_vs_reference(ckpt, precision, tol):
    # pipeline off: the logits buffer is read after each step (a step launched ahead would
    # overwrite it)
    spec, w, be = make(ckpt, "llama_gqa", precision, pipeline=False)
    ref = ReferenceBackend(spec, w, num_blocks=24, block_size=16, max_batch=4, max_seq_len=96)
    ps = prompts(spec.vocab_size, [5, 12], seed=4)
    for b in (be, ref):
        for i, p in enumerate(ps):
            b.add(i, p, SamplingParams(max_new_tokens=4, ignore_eos=True))
    for step in range(2):  # the prefill's logits, then a decode step's on the same tokens
        got = [e.token_id for e in be.step()]
        want = [e.token_id for e in ref.step()]
        lg = be.logits[: len(ps)].float().cpu().numpy()
        assert rel(lg, ref.last_logits) < tol, step
        if got != want:  # a near-tie flipped: later logits would differ by construction
            break


def test_in_flight_join_and_cancel(ckpt):
    spec, _, be = make(ckpt, "qwen2", max_batch=3)
    a, b, c = prompts(spec.vocab_size, [9, 4, 6], seed=7)
    greedy = SamplingParams(max_new_tokens=4, ignore_eos=True)
    be.add(0, a, greedy)
    first = be.step()
    be.add(1, b, greedy)  # joins the running batch
    be.add(2, c, greedy)
    with pytest.raises(KVPoolFull):  # max_batch sequences run
        be.add(3, a, greedy)
    ev = be.step()
    assert sorted(e.seq_id for e in ev) == [0, 1, 2]
    be.cancel(1)
    be.cancel(99)  # unknown: ignored
    toks = {0: [first[0].token_id, ev[[e.seq_id for e in ev].index(0)].token_id]}
    while be.pool().running:
        for e in be.step():
            assert e.seq_id != 1
            toks.setdefault(e.seq_id, []).append(e.token_id)
    assert toks[0] == hf_greedy(ckpt("qwen2"), a.tolist(), 4)
    assert be.pool().free_blocks == be.pool().num_blocks


def test_pool_and_input_errors(ckpt):
    spec, _, be = make(ckpt, "qwen2", num_blocks=3, max_seq_len=64)
    p = prompts(spec.vocab_size, [20])[0]
    be.add(0, p, SamplingParams(max_new_tokens=20))  # ceil(39 / 16) = 3 blocks: all of them
    with pytest.raises(KVPoolFull, match="blocks"):
        be.add(1, p[:2], SamplingParams(max_new_tokens=2))
    with pytest.raises(InputError, match="max_seq_len"):
        be.add(2, p, SamplingParams(max_new_tokens=60))
    with pytest.raises(InputError, match="empty"):
        be.add(3, p[:0], SamplingParams())
    be.cancel(0)
    assert be.pool().free_blocks == 3


def test_seeded_sampling_reproducible(ckpt):
    spec, w, be = make(ckpt, "qwen2")
    ps = prompts(spec.vocab_size, [6, 3], seed=2)
    # a hot temperature: the random-init model's distributions are peaked
    sp = SamplingParams(
        max_new_tokens=2, temperature=50.0, top_k=40, top_p=0.95, seed=1234, ignore_eos=True
    )
    one, _ = drive(be, ps, sp)
    two, _ = drive(be, ps, sp)
    other, _ = drive(
        be, ps, SamplingParams(max_new_tokens=2, temperature=50.0, seed=99, ignore_eos=True)
    )
    assert one == two
    assert one != other


def test_compile_decoder_device_cuda(ckpt):
    from zoi.decoder.compile import compile_decoder

    g = compile_decoder(ckpt("qwen2"), device="cuda", max_seq_len=64, max_batch=2)
    assert type(g.backend).__name__ == "CudaDecoderBackend"
    out = g.generate("kazo mira te", max_new_tokens=3)[0]
    assert out.token_ids == hf_greedy(ckpt("qwen2"), out.prompt_ids, 3)


@pytest.mark.skipif(not INTERP, reason="the interpreter has no programmatic dependent launch")
def test_pdl_off_and_refused_under_the_interpreter(ckpt):
    spec, w, be = make(ckpt, "qwen2")
    assert not be.pdl and not be.prefetch and be.memory()["pdl"] is False
    from zoi.errors import BackendUnavailableError

    with pytest.raises(BackendUnavailableError, match="sm_90"):
        CudaDecoderBackend(spec, w, precision="fp32", num_blocks=8, max_batch=2, pdl=True)


def test_precision_words(ckpt):
    """The backend's own default is "w8" (weight-only INT8); "int8" is W8A8, "w8a8" the same."""
    spec, w, _ = load_decoder(ckpt("qwen2"))
    kw = dict(num_blocks=8, max_batch=1, max_seq_len=32)
    for word, want, a8 in ((None, "w8", False), ("int8", "int8", True), ("w8a8", "int8", True)):
        be = CudaDecoderBackend(spec, w, **kw, **({} if word is None else {"precision": word}))
        assert (be.precision, be.a8, be.wbytes) == (want, a8, 1), word
    with pytest.raises(InputError, match=r"'int4'.*'w8': weight-only INT8, 'int8': W8A8"):
        CudaDecoderBackend(spec, w, precision="int4", **kw)


def _scenario(be, ps, stop_tok):
    """Stops, length ends, a join and a cancel while a step is in flight, one seeded sampler."""
    sp = lambda n, **k: SamplingParams(max_new_tokens=n, ignore_eos=True, **k)  # noqa: E731
    be.add(0, ps[0], sp(6, stop_token_ids=(stop_tok,)))
    be.add(1, ps[1], sp(3))
    be.add(2, ps[2], sp(8))
    out, fin, k = {i: [] for i in range(4)}, {}, 0
    while be.pool().running:
        for e in be.step():
            out[e.seq_id].append(e.token_id)
            if e.finish is not None:
                fin[e.seq_id] = e.finish
        k += 1
        if k == 2:  # joins while the next decode step is in flight
            be.add(3, ps[3], sp(4, temperature=50.0, top_k=20, seed=7))
        if k == 3:
            be.cancel(2)
    return out, fin


def test_pipelined_steps_equal_plain_steps(ckpt):
    """pipeline=True (the next decode step launched before this one's tokens are read, ids fed
    back on the device) gives the plain loop's tokens and finishes, and leaves the pool free."""
    spec, w, _ = load_decoder(ckpt("qwen2"))
    ps = prompts(spec.vocab_size, [5, 9, 2, 4], seed=3)
    kw = dict(precision="fp32", num_blocks=24, block_size=16, max_batch=4, max_seq_len=64)
    probe, _ = drive(
        CudaDecoderBackend(spec, w, pipeline=False, **kw),
        ps[:1],
        SamplingParams(max_new_tokens=2, ignore_eos=True),
    )
    stop_tok = probe[0][1]  # sequence 0 stops at its second token at the latest
    plain_be = CudaDecoderBackend(spec, w, pipeline=False, **kw)
    plain = _scenario(plain_be, ps, stop_tok)
    be = CudaDecoderBackend(spec, w, pipeline=True, **kw)
    piped = _scenario(be, ps, stop_tok)
    assert piped == plain
    assert plain[1][0] == FinishReason.STOP and plain[1][1] == FinishReason.LENGTH
    assert len(plain[0][2]) < 8 and len(plain[0][3]) == 4
    assert be.n_ahead > 0 and plain_be.n_ahead == 0
    assert be.pool().free_blocks == be.pool().num_blocks
    be.drain()
    assert be.step() == []


def test_buffers_are_one_arena_placed_by_liveness(ckpt):
    """Every device buffer of generation lies in one arena (the planner's placement): buffers live
    through the whole step share bytes with nothing, those of different layer phases may, and the
    arena is no bigger than the buffers laid end to end."""
    _, _, be = make(ckpt, "qwen3", precision="w8")
    base, end = be.arena.data_ptr(), be.arena.data_ptr() + be.arena_bytes

    def span(t):
        return t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()

    named = {
        "kc": be.kc, "vc": be.vc, "h": be.h, "qkv": be.qkv, "att": be.att, "mlp": be.mlp,
        "logits": be.logits, "tok": be.tok, "tok_pre": be.tok_pre, "tab": be.tab, "ws": be.ws,
        "cnt": be.cnt, "aws": be.aws, "acnt": be.acnt, "d_stage": be.d_stage,
        **{f"sws{i}": t for i, t in enumerate(be.sws)},
    }  # fmt: skip
    phased = {"qkv": (1, 2), "att": (2, 3), "mlp": (4, 5), "logits": (6, 7)}
    for n, t in named.items():
        a, b = span(t)
        assert base <= a < b <= end, n
    for n1, t1 in named.items():
        for n2, t2 in named.items():
            if n1 >= n2:
                continue
            (a1, b1), (a2, b2) = span(t1), span(t2)
            if a1 < b2 and a2 < b1:  # they share bytes: only buffers whose phases never meet
                assert n1 in phased and n2 in phased, (n1, n2)
                (f1, l1), (f2, l2) = phased[n1], phased[n2]
                assert l1 < f2 or l2 < f1, (n1, n2)
    laid = sum(span(t)[1] - span(t)[0] for t in named.values())
    assert be.arena_bytes < laid  # the phased buffers do share bytes
    mem = be.memory()
    assert mem["arena_bytes"] == be.arena_bytes
    assert mem["kv_pool_bytes"] + mem["activation_bytes"] == be.arena_bytes
