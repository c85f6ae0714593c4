"""The CUDA C++ megakernel on the GPU (marked ``gpu``; scripts/gpu_check.sh mega runs them):
its forward against the float64 reference, the per-op graph and the numpy emulation of the
same instruction list (the first mismatching scratch buffer is named on failure), 1,000
repeated calls bit-identical, and a dependency that never arrives failing the call with the
next call right."""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from tests.cuda_backend.cuda_helpers import batch, min_cosine, rel  # noqa: E402

from zoi.backends.reference import ReferenceBackend  # noqa: E402

INTERP = os.environ.get("TRITON_INTERPRET") == "1"
GPU = torch.cuda.is_available() and not INTERP
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not GPU, reason="needs a CUDA GPU")]

SHAPES = {
    # MiniLM's layer (hidden 384, 12 heads of 32, ffn 1536), 2 layers, random weights
    "minilm": dict(hidden=384, heads=12, layers=2, inter=1536, pooling="mean", type_vocab=2),
    # awkward: 2 heads of 32, ffn 96 (a partial 64-column tile), CLS pooling, no token types
    "h64": dict(hidden=64, heads=2, layers=1, inter=96, pooling="cls", type_vocab=0),
    # head_dim 16, hidden 48 (a partial n tile everywhere), 3 layers
    "h48": dict(hidden=48, heads=3, layers=3, inter=80, pooling="mean", type_vocab=2),
}
LENS = ([1], [7], [128], [300], [5, 1, 9, 40], [100, 28, 3, 1, 60])
BUCKETS = [16, 128, 512]


def model_of(shape: str, seed=0, max_tokens=512):
    from zoi.graph.compiled import CompiledModel
    from zoi.graph.synthetic import random_weights, synthetic_spec

    spec = dataclasses.replace(synthetic_spec(**SHAPES[shape]), max_positions=512)
    return CompiledModel.build(spec, random_weights(spec, seed), "fp16", max_tokens, None, {})


_cache: dict = {}


def backends(shape: str):
    """(megakernel backend, per-op backend or None, model), built once per shape. The per-op
    graph (Triton kernels compiled for three buckets, the slow part) for MiniLM's shape only."""
    if shape not in _cache:
        from zoi.backends.cuda.backend import CudaBackend
        from zoi.backends.cuda.options import CudaOptions

        model = model_of(shape)
        mk = CudaBackend(model, buckets=BUCKETS, options=CudaOptions(megakernel="on"))
        po = None
        if shape == "minilm":
            po = CudaBackend(model, buckets=BUCKETS, options=CudaOptions(megakernel="off"))
        _cache[shape] = (mk, po, model)
    return _cache[shape]


def _run(be, ids, pos, cu, norm):
    be.d_out.fill_(float("nan"))  # poison: every row must be written
    torch.cuda.synchronize()
    return be.run(ids, pos, cu, norm)


def _diagnose(be, model, ids, pos, cu, norm) -> str:
    """The emulator's scratch against the GPU's for this call: the first bad buffer."""
    from zoi.backends.cuda import megakernel as mk

    tb = next(b for b in be.buckets if b >= len(ids))
    plan = be._pplans.get(tb)
    if plan is None or not hasattr(plan, "prog"):
        return f"bucket {tb} does not run the megakernel: {be.bucket_paths.get(tb)}"
    _run(be, ids, pos, cu, norm)
    torch.cuda.synchronize()
    d_in = be.d_in.cpu().numpy()
    wb = be.wbuf.cpu().numpy().view(np.uint8)
    out = np.zeros((be.max_batch, int(model.spec.out_dim)), np.float32)
    _, sc = mk.emulate(plan.prog, wb, d_in, be.hdr_ints, out, scratch=True)
    got = plan.scratch.cpu().numpy()
    rep = mk.compare_scratch(plan.prog, got, sc, len(ids))
    bad = [r for r in rep if r["first_bad"]]
    return f"first bad scratch buffer: {bad[0] if bad else None}; all: {rep}"


@pytest.mark.parametrize("shape", list(SHAPES))
def test_matches_reference_and_per_op(shape):
    """Every L of LENS (1, 7, 128, 300, several sequences) in buckets 16 / 128 / 512, poisoned
    outputs, normalised or not."""
    mk, po, model = backends(shape)
    assert all(mk.bucket_paths[b]["path"] == "persistent" for b in BUCKETS), mk.bucket_paths
    ref = ReferenceBackend(model, dtype=np.float64)
    rng = np.random.default_rng(1)
    for lens in LENS:
        ids, pos, cu = batch(lens, int(model.spec.vocab_size), rng)
        for norm in (False, True):
            got = _run(mk, ids, pos, cu, norm)
            want = ref.run(ids, pos, cu, norm)
            ok = np.isfinite(got).all() and rel(got, want) < 5e-3 and min_cosine(got, want) > 0.9999
            if not ok:
                pytest.fail(
                    f"{shape} lens {lens} norm {norm}: rel {rel(np.nan_to_num(got), want)}; "
                    f"{_diagnose(mk, model, ids, pos, cu, norm)}"
                )
            if po is not None:
                other = _run(po, ids, pos, cu, norm)
                assert rel(got, other) < 5e-3, (lens, norm, rel(got, other), rel(other, want))


@pytest.mark.parametrize(
    "shape,lens,fuse",
    [
        ("h64", [3, 50, 11], (None, None)),  # bucket 128: the default (no fusion)
        ("h64", [3, 50, 11], (True, False)),  # LayerNorms in the prologues, 32-row tiles
        ("h64", [3, 9], (None, None)),  # bucket 16: attention in the o tiles (head_dim 32)
        ("h64", [3, 9], (True, True)),  # both fusions
        ("h48", [5, 1, 7], (True, True)),  # head_dim 16, hidden shorter than a k step
        ("minilm", [16], (None, None)),
        ("minilm", [16], (True, True)),
        ("minilm", [40, 9], (True, False)),  # bucket 128, the LN prologue over 384 columns
    ],
)
def test_matches_emulation(shape, lens, fuse):
    """The numpy emulation of the same instruction list (fields read as the kernel reads them)
    and the GPU agree buffer by buffer, for each prologue fusion."""
    from zoi.backends.cuda import megakernel as mk

    be, _, model = backends(shape)
    rng = np.random.default_rng(5)
    ids, pos, cu = batch(lens, int(model.spec.vocab_size), rng)
    _run(be, ids, pos, cu, True)
    torch.cuda.synchronize()
    tb = next(b for b in be.buckets if b >= len(ids))
    base = be._pplans[tb]
    plan = base
    if fuse != (None, None):
        prog = mk.build_program(base.desc, tb, base.n_blocks, max_seq=min(be.max_batch, tb),
                                fuse_ln=fuse[0], fuse_attn=fuse[1])  # fmt: skip
        plan = mk.MegakernelPlan(be, tb, program=prog)
        want = be.d_out[: len(lens)].cpu().numpy()
        be.d_out.fill_(float("nan"))
        plan.launch()
        torch.cuda.synchronize()
        got = be.d_out[: len(lens)].cpu().numpy()
        assert rel(got, want) < 2e-3, rel(got, want)  # the same forward, other phases
    out = np.zeros((be.max_batch, int(model.spec.out_dim)), np.float32)
    _, sc = mk.emulate(
        plan.prog, be.wbuf.cpu().numpy().view(np.uint8), be.d_in.cpu().numpy(), be.hdr_ints,
        out, scratch=True,
    )  # fmt: skip
    rep = mk.compare_scratch(plan.prog, plan.scratch.cpu().numpy(), sc, len(ids))
    assert not [r for r in rep if r["first_bad"]], rep


def test_repeated_calls_bit_identical():
    be, _, model = backends("minilm")
    rng = np.random.default_rng(2)
    ids, pos, cu = batch([60, 4, 64], int(model.spec.vocab_size), rng)
    first = _run(be, ids, pos, cu, True)
    assert np.isfinite(first).all()
    for i in range(1000):
        got = be.run(ids, pos, cu, True)
        assert np.array_equal(got.view(np.uint32), first.view(np.uint32)), f"call {i} differs"


def test_timeout_fails_the_call_and_the_next_is_right():
    from zoi.backends.cuda import megakernel as mk
    from zoi.errors import BackendUnavailableError

    be, _, model = backends("h64")
    ref = ReferenceBackend(model, dtype=np.float64)
    ids, pos, cu = batch([9, 20], int(model.spec.vocab_size), 3)
    plan = be._pplans[128]
    good = plan.instr.clone()
    bad = plan.prog.rows.copy()
    k = next(i for i, r in enumerate(bad) if r[mk.F_WAIT] >= 0)
    bad[k, mk.F_WAIT_N] += 1  # one bump more than the counter ever gets
    plan.instr.copy_(torch.from_numpy(bad.reshape(-1)).to(plan.instr.device))
    torch.cuda.synchronize()
    with pytest.raises(BackendUnavailableError, match="gave up waiting"):
        be.run(ids, pos, cu, True)
    plan.instr.copy_(good)
    torch.cuda.synchronize()
    for _ in range(3):
        got = _run(be, ids, pos, cu, True)
        assert rel(got, ref.run(ids, pos, cu, True)) < 5e-3


def test_profiled_launch_respects_every_dependency():
    """A profiled launch (globaltimer per instruction) of the same program: every instruction
    starts its work only after all the instructions bumping its counter are done, and its
    output equals the captured launch's, bit for bit."""
    from zoi.backends.cuda import megakernel as mk

    be, _, model = backends("minilm")
    ids, pos, cu = batch([70, 5, 40], int(model.spec.vocab_size), 4)
    want = _run(be, ids, pos, cu, True)  # stages the input on the device
    torch.cuda.synchronize()
    plan = mk.MegakernelPlan(be, 128, profile=True)
    be.d_out.fill_(float("nan"))
    plan.launch()
    torch.cuda.synchronize()
    assert not plan.barrier_timed_out()
    got = be.d_out[: len(want)].cpu().numpy()
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    t = plan.prof.cpu().numpy().reshape(-1, 4)
    R = plan.prog.rows
    assert (t[:, 0] > 0).all() and (t[:, 0] <= t[:, 1]).all() and (t[:, 1] <= t[:, 2]).all()
    done_by_ctr: dict = {}
    for i, r in enumerate(R):
        if r[mk.F_SIGNAL] >= 0:
            done_by_ctr.setdefault(int(r[mk.F_SIGNAL]), []).append(t[i, 2])
    for i, r in enumerate(R):
        if r[mk.F_WAIT] >= 0:  # released only after its last producer finished
            assert t[i, 1] >= max(done_by_ctr[int(r[mk.F_WAIT])]) - 2000, plan.prog.names[i]
    rep = plan.profile_report()
    print("megakernel profile, minilm-shaped 2 layers, 115 tokens:", rep)
    assert 0 < rep["span_us"] < 10_000
