"""The persistent megakernel (one launch per forward) against the float64 reference engine.

CI: stage-per-launch mode through the Triton interpreter (the grid barrier is never reached).
GPU (marked ``gpu``): the real one-launch kernel with its grid barrier, run eagerly and in a
captured graph, twice back to back (the barrier resets itself)."""

from __future__ import annotations

import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from tests.cuda_backend.cuda_helpers import (  # noqa: E402
    batch,
    min_cosine,
    rel,
    run_ahead_of_time,
    tiny_model,
)

from zoi.backends.reference import ReferenceBackend  # noqa: E402

INTERP = os.environ.get("TRITON_INTERPRET") == "1"
LENS = ([1], [5, 1, 9], [40, 3, 17])


def _check(be, model, lens_list, seed, tol=5e-3, cos=0.9999):
    ref = ReferenceBackend(model, dtype=np.float64)
    rng = np.random.default_rng(seed)
    for lens in lens_list:
        ids, pos, cu = batch(lens, int(model.spec.vocab_size), rng)
        for norm in (False, True):
            be.d_out.fill_(float("nan"))  # poison: every row must be written
            if be.dev == "cuda":
                torch.cuda.synchronize()  # run() uses its own non-blocking stream
            got = be.run(ids, pos, cu, norm)
            want = ref.run(ids, pos, cu, norm)
            assert got.shape == want.shape and got.dtype == np.float32
            assert np.isfinite(got).all(), (lens, norm)
            assert rel(got, want) < tol, (lens, norm, rel(got, want))
            assert min_cosine(got, want) > cos, (lens, norm)


def _swap(be, max_tb=256, **kw):
    from zoi.backends.cuda.persistent import build_persistent_steps

    for tb in be.buckets:
        if tb <= max_tb:
            be._steps[tb] = build_persistent_steps(be, tb, **kw)


@pytest.mark.skipif(not INTERP, reason="interpreter run (the GPU runs the gpu-marked tests)")
class TestInterpreter:
    def _be(self, model, **kw):
        from zoi.backends.cuda.backend import CudaBackend

        return CudaBackend(model, interpret=True, **kw)

    @pytest.mark.parametrize(
        "kw",
        [
            dict(),  # gelu, mean pooling, with token types
            dict(act="gelu_tanh", pooling="cls", type_vocab=0, seed=3),
            dict(act="relu", pooling="max", layers=1, hidden=64, heads=2, inter=96, seed=5),
        ],
    )
    def test_matches_reference(self, kw):
        model = tiny_model("fp16", **kw)
        be = self._be(model, buckets=[16, 64])
        _swap(be)
        _check(be, model, LENS, seed=1)

    @pytest.mark.parametrize(
        "cfg",
        [
            {"BM": 32, "BN_WIDE": 64, "BN_NARROW": 32},
            {"ATT_BM": 32, "ATT_BN": 32, "POOL_BR": 32},
            # the slow tier: BK 32 is a K loop of 2 steps (cfg3's BK 16 loops too), BN 256
            # masks columns past I (I = 80 masks some in every config)
            pytest.param({"BK": 32, "BN_WIDE": 256, "BN_NARROW": 64}, marks=pytest.mark.slow),
            # deterministic split-K: o in 2, ffn2 in 3 (the last split partly masked), the
            # partials summed by ffn1's / the next qkv's LN-on-load and by the pool
            {"BK": 16, "KSPLIT_O": 2, "KSPLIT_F2": 3, "BK_F2": 16, "POOL_BR": 8, "BM_LN": 32},
            {"KSPLIT_F2": 4, "BK_F2": 16, "BN_NARROW": 16},  # one-shot LN + split ffn2
        ],
    )
    def test_tile_configs(self, cfg):
        """Every knob the GPU sweep turns gives the same forward."""
        from zoi.backends.cuda.persistent import build_persistent_steps

        model = tiny_model("fp16")
        be = self._be(model, buckets=[64])
        be._steps[64] = build_persistent_steps(be, 64, cfg=cfg)
        _check(be, model, ([5, 1, 9], [40, 3, 17]), seed=6)

    # 256 takes ~1 minute in the interpreter, 128 ~25 s: the slow tier (compiled on the GPU
    # every run); 16 keeps the one-shot LN GEMMs and the split-K ffn2 here, and BM 32 is
    # test_tile_configs' first config
    @pytest.mark.parametrize(
        "tb",
        [16, pytest.param(128, marks=pytest.mark.slow), pytest.param(256, marks=pytest.mark.slow)],
    )
    def test_h200_default_cfg_minilm_width(self, tb):
        """The config default_cfg picks for an H200 (132 SMs) at each bucket, on a
        MiniLM-width layer: one-shot LN GEMMs (BK 512 > H 384, masked), split-K ffn2
        partials summed by the final LN, BM 32 above 64 tokens, 64-row fp16 pool chunks."""
        from zoi.backends.cuda.persistent import build_persistent_steps, default_cfg

        model = tiny_model(
            "fp16", hidden=384, heads=12, layers=1, inter=1536, max_tokens=256, max_batch=16,
            pooling="max",
        )  # fmt: skip
        be = self._be(model, buckets=[tb])
        c = default_cfg(tb, None, 132, H=384, I=1536)
        assert c["BK"] == 512 and (tb > 128 or c["KSPLIT_F2"] > 1)
        be._steps[tb] = build_persistent_steps(be, tb, cfg=c)
        lens = {16: ([5, 1, 9], [16]), 128: ([40, 3, 17],), 256: ([40, 40, 40, 3, 17],)}[tb]
        _check(be, model, lens, seed=3)

    def test_stage_count_and_one_launch_plan(self):
        from zoi.backends.cuda.persistent import PersistentPlan, build_persistent_steps

        model = tiny_model("fp16")
        be = self._be(model, buckets=[64])
        L = model.spec.layers
        assert len(build_persistent_steps(be, 64)) == 5 * L + 2  # eager: one launch per stage
        p = PersistentPlan(be, 64, split=False)
        assert len(p.steps()) == 1 and p.n_stages == 5 * L + 2
        assert 1 <= p.grid <= be.sm

    def test_one_launch_with_barrier_code(self):
        """All stages in ONE launch, barrier code executed: possible in the interpreter with
        one program (it never waits). The arrival counter grows by stages - 1 per launch."""
        from zoi.backends.cuda.persistent import PersistentPlan

        model = tiny_model("fp16", layers=2)
        be = self._be(model, buckets=[64])
        plan = PersistentPlan(be, 64, split=False)
        plan.grid = 1
        be._steps[64] = plan.steps()
        assert len(be._steps[64]) == 1
        _check(be, model, ([5, 1, 9], [40, 3, 17]), seed=4)
        assert int(plan.bar[0]) == 4 * (plan.n_stages - 1)  # 2 batches x 2 normalise settings
        assert not plan.barrier_timed_out()

    def test_batched_equals_one_at_a_time(self):
        model = tiny_model("fp16", pooling="cls")
        be = self._be(model, buckets=[64])
        _swap(be)
        rng = np.random.default_rng(2)
        ids, pos, cu = batch([7, 2, 13], seed=rng)
        full = be.run(ids, pos, cu, True)
        for b in range(3):
            a, e = cu[b], cu[b + 1]
            one = be.run(ids[a:e], pos[a:e], np.array([0, e - a], np.int32), True)
            np.testing.assert_allclose(one[0], full[b], rtol=0, atol=1e-6)

    def test_int8_refused(self):
        from zoi.backends.cuda.persistent import PersistentUnsupported, build_persistent_steps

        be = self._be(tiny_model("int8"), buckets=[16])
        with pytest.raises(PersistentUnsupported):
            build_persistent_steps(be, 16)


@pytest.mark.parametrize("tb", [16, 128, 256])
def test_compiles_for_sm90_without_gpu(tb):
    """Compile (ptxas included) for sm_90 in a process without the interpreter: the barrier's
    atomics run on one thread per program, and no activation load goes through L1."""
    from zoi.backends.cuda.persistent import default_cfg

    meta = dict(
        H=384, HP=512, I=1536, NHEAD=12, D=32, BLOCK_D=32, BLOCK_B=64, HAS_TYPE=True, ACT=1,
        POOL=0, SPL=5, **default_cfg(tb, None, 132, H=384, I=1536),
    )  # fmt: skip
    code = (
        "import json, sys; from tests.cuda_backend.ptx_helpers import compile_ahead; "
        "print(json.dumps(compile_ahead(json.loads(sys.argv[1]))))"
    )
    out = run_ahead_of_time(code, meta)
    assert out["l1_activation_loads"] == []
    # one arrival (atom.add acq_rel), predicated to one thread; the polls are plain
    # ld.acquire.gpu loads (no atomics hammering the counter)
    atoms = [x for x in out["sync_ops"] if "atom." in x]
    assert any("atom.global.gpu.acq_rel.add" in x for x in atoms), out["sync_ops"]
    assert all(x.startswith("@%p") for x in atoms), out["sync_ops"]
    assert not any("acquire" in x and "atom." in x for x in atoms), atoms  # no atomic polls
    polls = [x for x in out["sync_ops"] if "ld.acquire.gpu.global.b64" in x]
    assert polls and all(x.startswith("@%p_t0") for x in polls), out["sync_ops"]  # thread 0
    assert out["shared"] <= 227 * 1024  # the sm_90 opt-in maximum per block
    assert out["cp_async_ca"] == 0 and out["cp_async_cg"] > 0  # pipelined copies skip L1


GPU = torch.cuda.is_available() and not INTERP
MINILM = dict(hidden=384, heads=12, layers=2, inter=1536)


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="needs a CUDA GPU")
class TestGPU:
    def _be(self, model, **kw):
        from zoi.backends.cuda.backend import CudaBackend

        return CudaBackend(model, **kw)

    @pytest.mark.parametrize("split", [True, False])
    @pytest.mark.parametrize("shape", ["tiny", "minilm"])
    def test_eager_matches_reference(self, shape, split):
        """Steps run eagerly on the GPU (no graph): be.run replays the per-op graph, so call
        the steps ourselves and read d_out."""
        from zoi.backends.cuda.persistent import PersistentPlan

        kw = MINILM if shape == "minilm" else {}
        model = tiny_model("fp16", max_tokens=512, max_batch=64, **kw)
        be = self._be(model, buckets=[16, 128, 256, 512])
        ref = ReferenceBackend(model, dtype=np.float64)
        rng = np.random.default_rng(7)
        cases = ((16, [1]), (16, [5, 1, 9]), (128, [40, 3, 17]), (256, [40] * 6 + [3, 13]))
        for tb, lens in cases:  # (the tiny model has 40 positions)
            plan = PersistentPlan(be, tb, split=split)
            steps = plan.steps()
            for lens_ in (lens, [16] if tb == 16 else [40, 40, 40, 8]):
                ids, pos, cu = batch(lens_, seed=rng)
                for norm in (False, True):
                    n, B = be._stage(ids, pos, cu, norm, tb)
                    be.d_in[:n].copy_(torch.from_numpy(be.h_in[:n].copy()).cuda())
                    be.d_out.fill_(float("nan"))
                    torch.cuda.synchronize()  # be.tstream does not sync with the default stream
                    with torch.cuda.stream(be.tstream):
                        for _ in range(2):  # twice back to back: the barrier resets itself
                            for s in steps:
                                s()
                    torch.cuda.synchronize()
                    assert not plan.barrier_timed_out()
                    got = be.d_out[:B].cpu().numpy()
                    want = ref.run(ids, pos, cu, norm)
                    assert np.isfinite(got).all()
                    assert rel(got, want) < 5e-3, (tb, lens_, norm, rel(got, want))
                    assert min_cosine(got, want) > 0.9999

    def test_in_backend_graph(self):
        """The backend's own wiring, forced (persistent="force": no timing choice): graphs
        replay the one-launch kernel through run()."""
        from zoi.backends.cuda.options import CudaOptions

        model = tiny_model("fp16", max_tokens=512, max_batch=64, **MINILM)
        be = self._be(model, options=CudaOptions(persistent="force"))
        assert all(be._graphs[tb][2] == 1 for tb in be.buckets if tb <= 256)
        _check(be, model, LENS + ([40, 40, 40, 8], [16] * 16, [40] * 6 + [1, 15]), seed=9)
        # repeat the same call many times: barrier state stays consistent
        ids, pos, cu = batch([64, 64], seed=np.random.default_rng(1))
        first = be.run(ids, pos, cu, True)
        for _ in range(50):
            np.testing.assert_array_equal(be.run(ids, pos, cu, True), first)


@pytest.mark.skipif(not INTERP, reason="interpreter run (the GPU runs the gpu-marked tests)")
def test_barrier_timeout_fails_the_call_and_recovers():
    """A grid barrier that gave up (its flag set) voids that call: run() raises a clear error
    instead of returning the output, clears the flag, and the next call is sound."""
    from zoi.backends.cuda.backend import CudaBackend
    from zoi.backends.cuda.options import CudaOptions
    from zoi.errors import BackendUnavailableError

    model = tiny_model("fp16", max_tokens=64)
    be = CudaBackend(
        model, interpret=True, buckets=[16, 64], persistent_max=256,
        options=CudaOptions(persistent="time"),
    )  # fmt: skip
    assert be.memory()["bucket_paths"][16]["path"] == "persistent"
    rng = np.random.default_rng(3)
    ids, pos, cu = batch([5, 7], int(model.spec.vocab_size), rng)
    first = be.run(ids, pos, cu, True)
    be._pplans[16].bar[1] = 1  # what a barrier that gave up writes
    with pytest.raises(BackendUnavailableError, match="grid barrier"):
        be.run(ids, pos, cu, True)
    assert int(be._pplans[16].bar[1]) == 0
    np.testing.assert_array_equal(be.run(ids, pos, cu, True), first)


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="needs a CUDA GPU")
@pytest.mark.parametrize(
    "precision,path",
    [("fp16", "force"), ("fp16", "time"), ("fp16", "off"), ("int8", "off")],
)
def test_thousand_repeated_calls_bit_identical(precision, path):
    """1,000 calls of the same request through run() give the same bits every time
    (no race, no order-dependent reduction: atomics only take maxima), on the one-launch
    persistent path (FP16: forced, and as the compile-time timing picks) and the per-op graphs
    (FP16 and INT8), with a different
    request in between every 100 calls (its result must come back too) and the output
    poisoned before each call."""
    from zoi.backends.cuda.backend import CudaBackend
    from zoi.backends.cuda.options import CudaOptions

    default = "dynamic_asym" if precision == "int8" else "dynamic"
    model = tiny_model(
        precision, max_tokens=256, max_batch=16, default=default, **MINILM
    )  # minilm widths, 2 layers
    be = CudaBackend(model, buckets=[16, 128, 256], options=CudaOptions(persistent=path))
    rng = np.random.default_rng(11)
    vocab = int(model.spec.vocab_size)
    a = batch([40, 7, 33, 1], vocab, rng)
    b = batch([12], vocab, rng)
    first_a, first_b = be.run(*a, True), be.run(*b, True)
    assert np.isfinite(first_a).all() and np.isfinite(first_b).all()
    for i in range(1000):
        be.d_out.fill_(float("nan"))
        torch.cuda.synchronize()
        np.testing.assert_array_equal(be.run(*a, True), first_a, err_msg=f"call {i}")
        if i % 100 == 99:
            np.testing.assert_array_equal(be.run(*b, True), first_b, err_msg=f"call {i}")


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="needs a CUDA GPU")
def test_non_resident_grid_gives_up_and_the_next_call_is_sound():
    """A one-launch forward whose grid the GPU cannot hold at once (64 programs per
    SM) can never meet at its grid barrier. The bounded spin (POLLS acquire polls, small here)
    gives up and sets the plan's flag instead of hanging the GPU, the launch ends, and the
    engine's next call (its own plan, own barrier counter) is bit-identical to the one
    before. The call-level handling of the flag (a clear error, flag cleared) is
    test_barrier_timeout_fails_the_call_and_recovers."""
    import time

    from zoi.backends.cuda.backend import CudaBackend
    from zoi.backends.cuda.options import CudaOptions
    from zoi.backends.cuda.persistent import PersistentPlan

    model = tiny_model("fp16", max_tokens=256, max_batch=16, **MINILM)
    be = CudaBackend(model, buckets=[128], options=CudaOptions(persistent="force"))
    rng = np.random.default_rng(5)
    ids, pos, cu = batch([40, 7, 33], int(model.spec.vocab_size), rng)
    first = be.run(ids, pos, cu, True)
    plan = PersistentPlan(be, 128, split=False)
    plan.meta["POLLS"] = 1 << 12  # ~2 ms per barrier instead of ~2 s
    plan.grid = 64 * int(be.sm)
    n, _ = be._stage(ids, pos, cu, True, 128)
    be.d_in[:n].copy_(torch.from_numpy(be.h_in[:n].copy()).cuda())
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    with torch.cuda.stream(be.tstream):
        plan.launch(0, plan.n_stages)
    torch.cuda.synchronize()
    assert plan.barrier_timed_out()
    assert time.perf_counter() - t0 < 120
    for _ in range(3):
        np.testing.assert_array_equal(be.run(ids, pos, cu, True), first)
