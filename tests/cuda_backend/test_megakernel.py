"""The megakernel's host side on the CPU: the instruction-list builder (dependencies, hazards,
queue balance), its numpy emulation against the float64 reference, the model checks, and the
nvcc build of csrc/cuda/megakernel.cu for sm_90a / sm_90 with its ptxas report."""

from __future__ import annotations

import dataclasses
import shutil

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tests.cuda_backend.cuda_helpers import batch, min_cosine, rel, tiny_model  # noqa: E402

from zoi.backends.cuda import megakernel as mk  # noqa: E402
from zoi.backends.cuda.arena import header_ints  # noqa: E402
from zoi.backends.cuda.options import CudaOptions  # noqa: E402
from zoi.backends.reference import ReferenceBackend  # noqa: E402


def _model(**kw):
    from zoi.graph.compiled import CompiledModel
    from zoi.graph.synthetic import random_weights, synthetic_spec

    seed = kw.pop("seed", 0)
    spec = dataclasses.replace(synthetic_spec(**kw), max_positions=512)
    return CompiledModel.build(spec, random_weights(spec, seed), "fp16", 512, None, {})


def _desc(model):
    from zoi.backends.cuda.plan import plan_launches
    from zoi.backends.cuda.weights import pack_weights

    plans = [plan_launches(model)]
    wbuf, w, _ = pack_weights(model, plans, torch, "cpu")
    return mk.describe(plans[0]["launches"], w, wbuf.data_ptr()), wbuf


MINILM = dict(hidden=384, heads=12, layers=2, inter=1536)


@pytest.fixture(scope="module")
def minilm_desc():
    return _desc(_model(**MINILM))[0]


# fusions: (fuse_ln, fuse_attn); None = the builder's default for the bucket
FUSIONS = [(None, None), (False, False), (True, False), (True, True)]
FUSION_IDS = ["default", "unfused", "ln-only", "both"]


# the fusions' programs on the small buckets they serve, the default on every bucket
HAZARD_CASES = [
    (tb, fuse)
    for tb in (1, 16, 17, 128, 300, 512, 1024)
    for fuse in (FUSIONS if tb <= 300 else FUSIONS[:1])
]


@pytest.mark.parametrize("tb,fuse", HAZARD_CASES)
@pytest.mark.parametrize("blocks", [1, 7, 132])
def test_program_dependencies_and_hazards(minilm_desc, tb, blocks, fuse):
    prog = mk.build_program(minilm_desc, tb, blocks, max_seq=min(tb, 64), fuse_ln=fuse[0],
                            fuse_attn=fuse[1])  # fmt: skip
    st = mk.check_program(prog)  # every read after its write through counters, no deadlock
    assert st["instructions"] == len(prog.rows) and prog.n_blocks == blocks
    R = prog.rows
    assert (R[:, mk.F_OP] > 0).all()
    gemm = R[R[:, mk.F_OP] == mk.OP_GEMM]
    assert (gemm[:, mk.F_K] % 8 == 0).all()  # 16-byte rows for cp.async
    assert prog.scratch_bytes % 256 == 0


def test_queue_balance(minilm_desc):
    prog = mk.build_program(minilm_desc, 128, 132, max_seq=128)
    load = np.array(mk.check_program(prog)["load"])
    assert load.max() <= 1.5 * load.mean() + max(prog.cost), (load.max(), load.mean())
    assert min(len(q) for q in prog.queues) > 0  # every block has work at 128 tokens


def test_ffn2_splits():
    assert mk.ffn2_splits(1536, 24, 132) == [(0, 384), (384, 768), (768, 1152), (1152, 1536)]
    assert mk.ffn2_splits(1536, 48, 132) == [(0, 768), (768, 1536)]  # 4 x 48 > 132
    assert mk.ffn2_splits(96, 1, 132) == [(0, 64), (64, 96)]  # a partial last step
    assert mk.ffn2_splits(1536, 132, 132) == [(0, 1536)]


def test_checker_finds_a_missing_counter(minilm_desc):
    prog = mk.build_program(minilm_desc, 64, 8, fuse_ln=False, fuse_attn=False)
    k = next(i for i, r in enumerate(prog.rows) if r[mk.F_OP] == mk.OP_ATTN)
    prog.rows[k, mk.F_WAIT] = -1  # attention no longer waits for its qkv tiles
    with pytest.raises(AssertionError, match="no counter between them"):
        mk.check_program(prog)


@pytest.mark.parametrize("flag", ["FL_A_ATTN", "FL_A_LN"])
def test_checker_finds_a_missing_counter_before_a_prologue(minilm_desc, flag):
    """A fused tile's prologue reads another tile's output (qkv for the attention, the
    partials for the LayerNorm): without its wait the checker names the race."""
    prog = mk.build_program(minilm_desc, 64, 8, fuse_ln=True, fuse_attn=True)
    k = next(i for i, r in enumerate(prog.rows) if r[mk.F_FLAGS] & getattr(mk, flag))
    prog.rows[k, mk.F_WAIT] = -1
    with pytest.raises(AssertionError, match="no counter between them"):
        mk.check_program(prog)


@pytest.mark.parametrize("fuse_ln", [False, True])
def test_checker_finds_a_short_wait(minilm_desc, fuse_ln):
    prog = mk.build_program(minilm_desc, 64, 8, fuse_ln=fuse_ln)
    op = mk.OP_GEMM if fuse_ln else mk.OP_LN
    k = next(i for i, r in enumerate(prog.rows) if r[mk.F_OP] == op and r[mk.F_WAIT] >= 0)
    prog.rows[k, mk.F_WAIT_N] -= 1
    with pytest.raises(AssertionError, match="waits for"):
        mk.check_program(prog)


def test_fusions_take_phases_out(minilm_desc):
    """Fused, a program has no embedding, LayerNorm or attention instructions (their work
    runs in the GEMM / pool prologues); unfused it has them. The defaults (measured): the
    attention fused at 16 tokens, the LayerNorms never."""
    ops = lambda p: set(p.rows[:, mk.F_OP].tolist())  # noqa: E731
    fused = mk.build_program(minilm_desc, 16, 132, fuse_ln=True, fuse_attn=True)
    assert ops(fused) == {mk.OP_GEMM, mk.OP_POOL}
    plain = mk.build_program(minilm_desc, 16, 132, fuse_ln=False, fuse_attn=False)
    assert ops(plain) == {mk.OP_EMBED_LN, mk.OP_GEMM, mk.OP_LN, mk.OP_ATTN, mk.OP_POOL}
    assert ops(mk.build_program(minilm_desc, 16, 132)) == ops(plain) - {mk.OP_ATTN}
    assert ops(mk.build_program(minilm_desc, 32, 132)) == ops(plain)
    assert not mk.attn_fusable(minilm_desc, 128)  # 128 keys: the attention instructions stay
    assert mk.OP_ATTN in ops(mk.build_program(minilm_desc, 128, 132, fuse_attn=True))
    wide = _desc(_model(hidden=512, heads=8, layers=1, inter=64))[0]  # rows over 384: no LN fusion
    assert mk.OP_LN in ops(mk.build_program(wide, 16, 132, fuse_ln=True))
    with pytest.raises(mk.MegakernelUnsupported, match="bucket"):
        mk.build_program(minilm_desc, 2048, 132)


def _emulate(model, desc, wbuf, lens, tb, blocks, norm, seed, fuse=(None, None)):
    ids, pos, cu = batch(lens, int(model.spec.vocab_size), seed)
    hi = header_ints(64)
    d_in = np.zeros(hi + 2 * tb, np.int32)
    d_in[:4] = [int(norm), len(lens), len(ids), 0]
    d_in[4 : 4 + len(cu)] = cu
    d_in[hi : hi + len(ids)] = ids
    d_in[hi + tb : hi + tb + len(ids)] = pos
    out = np.full((64, desc["H"]), np.nan, np.float32)  # poisoned
    prog = mk.build_program(desc, tb, blocks, max_seq=min(tb, 64), fuse_ln=fuse[0],
                            fuse_attn=fuse[1])  # fmt: skip
    mk.emulate(prog, wbuf.numpy().view(np.uint8), d_in, hi, out)
    return out[: len(lens)], ReferenceBackend(model, dtype=np.float64).run(ids, pos, cu, norm)


EMU_MODELS = [
    (dict(), [5, 1, 9, 40], 64),
    (dict(hidden=64, heads=2, layers=1, inter=96, pooling="cls", type_vocab=0), [7], 16),
    (dict(hidden=64, heads=2, layers=1, inter=96, seed=3), [1, 30, 2, 60], 128),
    (dict(hidden=32, heads=2, layers=1, inter=40, seed=4), [300], 300),
    (dict(hidden=48, heads=3, layers=2, inter=80, seed=5), [3, 11, 1], 16),
    (dict(hidden=128, heads=2, layers=1, inter=96, seed=6), [2, 30], 32),
]
# every model with the default program; the fusions on the models whose bucket they serve
# (head dims 16 / 32 / 64 in the fused attention; hidden 48: A rows shorter than a k step)
EMU_CASES = [(*m, (None, None), "default") for m in EMU_MODELS] + [
    (*m, f, name)
    for m in EMU_MODELS
    if m[2] <= 64 or m[2] == 128
    for f, name in zip(FUSIONS[1:], FUSION_IDS[1:], strict=True)
]


@pytest.mark.parametrize("kw,lens,tb,fuse,name", EMU_CASES)
def test_emulation_matches_reference(kw, lens, tb, fuse, name):
    """The instruction fields, read as the kernel reads them, compute the model's forward,
    with and without the prologue fusions."""
    model = _model(**kw)
    desc, wbuf = _desc(model)
    # 132 blocks: ffn2 split in up to 4 k ranges (fp32 partials summed by the LN); a fusion's
    # program on 132 blocks only (the queues do not change what a prologue computes)
    runs = ((True, 5), (False, 1), (True, 132)) if name == "default" else ((False, 132),)
    for norm, blocks in runs:
        got, want = _emulate(model, desc, wbuf, lens, tb, blocks, norm, len(lens), fuse)
        assert np.isfinite(got).all()
        assert rel(got, want) < 5e-3 and min_cosine(got, want) > 0.9999, rel(got, want)


@pytest.mark.parametrize(
    "kw,match",
    [
        (dict(pooling="max"), "pooling"),
        (dict(act="relu"), "activation"),
        (dict(hidden=36, heads=2, inter=72), "hidden"),  # head_dim 18 fine, hidden % 8 != 0
        (dict(hidden=768, heads=12, inter=64), "hidden"),  # wider than a warp's 16 x 32 columns
    ],
)
def test_unsupported_models_refused(kw, match):
    with pytest.raises(mk.MegakernelUnsupported, match=match):
        _desc(_model(**kw))


def test_int8_refused():
    from zoi.backends.cuda.plan import plan_launches
    from zoi.backends.cuda.weights import pack_weights

    model = tiny_model("int8")
    plans = [plan_launches(model)]
    wbuf, w, _ = pack_weights(model, plans, torch, "cpu")
    with pytest.raises(mk.MegakernelUnsupported):
        mk.describe(plans[0]["launches"], w, wbuf.data_ptr())


def test_option_checked():
    assert CudaOptions().megakernel == "off"
    with pytest.raises(ValueError, match="megakernel"):
        CudaOptions(megakernel="yes")


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
# sm_90 (no 'a' features: another GPU's first-use build) in the slow tier: the same source,
# and scripts/gpu_check.sh mega builds the product's sm_90a with the device's nvcc
@pytest.mark.parametrize("arch", ["sm_90a", pytest.param("sm_90", marks=pytest.mark.slow)])
def test_nvcc_builds_the_kernel(tmp_path, arch):
    out = tmp_path / f"mk_{arch}.cubin"
    report = mk.compile_cubin(out, arch)
    assert out.stat().st_size > 10_000
    r = mk.ptxas_report(report)
    # one 256-thread block per SM: up to 255 registers, no local-memory spills, static
    # shared memory within the 48 KB a block gets without opting in
    assert 0 < r["registers"] <= 255, report
    assert r["spill_stores"] == 0 and r["spill_loads"] == 0, report
    assert 0 < r["smem"] <= 48 * 1024, report


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
@pytest.mark.parametrize("name", ["cluster_hop", "decode_mega"])
def test_nvcc_builds_the_lab_kernels(tmp_path, name):
    """The persistent kernel's lab measurements keep building: lab/gpu/cluster_hop.cu (a
    dependency through L2 counters vs distributed shared memory, scripts/gpu_check.sh clusterhop)
    and lab/gpu/decode_mega.cu (a persistent Llama-1B decode step, scripts/gpu_check.sh decmega)."""
    import subprocess
    from pathlib import Path

    src = Path(__file__).resolve().parents[2] / "lab" / "gpu" / f"{name}.cu"
    out = tmp_path / name
    p = subprocess.run(
        ["nvcc", "-O3", "-std=c++17", "-arch=sm_90a", "-o", str(out), str(src)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert p.returncode == 0 and out.stat().st_size > 10_000, p.stderr[-2000:]


def test_ptxas_report_parsed():
    text = (
        "ptxas info    : Function properties for zoi_megakernel\n"
        "    8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads\n"
        "ptxas info    : Used 163 registers, used 1 barriers, 37380 bytes smem\n"
    )
    assert mk.ptxas_report(text) == dict(
        registers=163, stack=8, spill_stores=4, spill_loads=12, smem=37380
    )


class _FakeDriver:
    """The driver calls MegakernelPlan makes, recorded (cuda.bindings' (err, value) returns)."""

    def __init__(self):
        import types

        self.calls = []
        rec = lambda name, ret=None: lambda *a: self.calls.append((name, a)) or (0, ret)  # noqa: E731
        self.cu = types.SimpleNamespace(
            cuModuleLoadData=rec("load", "module"),
            cuModuleGetFunction=rec("get", "function"),
            cuFuncSetAttribute=rec("attr"),
            cuLaunchKernel=rec("launch"),
            CUstream=lambda s: ("stream", s),
            CUfunction_attribute=types.SimpleNamespace(
                CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES="max_dyn_smem"
            ),
        )

    def check(self, res):
        assert res[0] == 0
        return res[1] if len(res) == 2 else None


def test_first_use_build_is_cached_by_source_and_arch(monkeypatch, tmp_path):
    """Without a packaged cubin, cubin() builds with nvcc once into the cache directory, under
    the source's hash and the arch, and reads it back afterwards."""
    builds = []

    def fake_build(out, arch="sm_90a", nvcc=None):
        builds.append(arch)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(b"cubin for " + arch.encode())
        return ""

    monkeypatch.setattr(mk, "packaged_cubins", lambda: [])
    monkeypatch.setattr(mk, "compile_cubin", fake_build)
    monkeypatch.setenv("ZOI_CACHE_DIR", str(tmp_path))
    assert mk.cubin((9, 0)) == b"cubin for sm_90a" and builds == ["sm_90a"]
    assert mk.cubin((9, 0)) == b"cubin for sm_90a" and builds == ["sm_90a"]  # cached
    assert mk.cubin((8, 9)) == b"cubin for sm_89" and builds == ["sm_90a", "sm_89"]
    (path,) = (tmp_path / "megakernel").glob("megakernel_sm_90a_*.cubin")
    assert len(path.stem.split("_")[-1]) == 16  # the source's hash


def test_plan_packs_parameters_and_launches(monkeypatch, tmp_path):
    """The host side of a launch without a GPU: the parameter block matches the kernel's
    Params layout (static_assert there), dynamic shared memory is raised and passed."""
    import ctypes
    import struct
    import types

    from zoi.backends.cuda.plan import plan_launches
    from zoi.backends.cuda.weights import pack_weights

    model = _model(hidden=64, heads=2, layers=1, inter=96)
    plans = [plan_launches(model)]
    wbuf, w, _ = pack_weights(model, plans, torch, "cpu")
    hi = header_ints(64)
    fake_torch = types.SimpleNamespace(
        from_numpy=torch.from_numpy, zeros=torch.zeros, int64=torch.int64, uint8=torch.uint8,
        cuda=types.SimpleNamespace(current_stream=lambda dev: types.SimpleNamespace(cuda_stream=7)),
    )  # fmt: skip
    be = types.SimpleNamespace(
        torch=fake_torch, eager=False, max_tokens=512, max_batch=64, plan=plans[0],
        w=w, wbuf=wbuf, sm=8, drv=_FakeDriver(), device_index=0, capability=(9, 0), dev="cpu",
        d_in=torch.zeros(hi + 2 * 128, dtype=torch.int32), hdr_ints=hi,
        d_out=torch.zeros(64, 64, dtype=torch.float32),
    )  # fmt: skip
    monkeypatch.setattr(mk.MegakernelPlan, "_modules", {})
    # the fake driver never reads the module: any bytes stand for the cubin (no nvcc build)
    monkeypatch.setattr(mk, "cubin", lambda capability: b"cubin")
    plan = mk.MegakernelPlan(be, 128)
    f = struct.unpack("<8Q3i4xqQ", plan.params)
    assert f[:8] == (
        plan.instr.data_ptr(), plan.qoff.data_ptr(), plan.queue.data_ptr(), plan.bar.data_ptr(),
        wbuf.data_ptr(), plan.scratch.data_ptr(), be.d_in.data_ptr(), be.d_out.data_ptr(),
    )  # fmt: skip
    assert f[8:] == (hi, 128, 8, mk.POLL_LIMIT, 0)  # no profile buffer
    assert plan.bar.numel() == mk.STATE_CTR + len(plan.prog.per_call)
    mk.check_program(plan.prog)
    plan.steps()[0]()
    name, args = be.drv.calls[-1]
    assert name == "launch" and args[1:8] == (8, 1, 1, mk.THREADS, 1, 1, mk.SMEM_BYTES)
    assert args[8] == ("stream", 7)
    pp = ctypes.cast(args[9], ctypes.POINTER(ctypes.c_void_p))[0]  # kernelParams[0]
    assert ctypes.string_at(pp, len(plan.params)) == plan.params
    assert ("attr", ("function", "max_dyn_smem", mk.SMEM_BYTES)) in be.drv.calls
    assert not plan.barrier_timed_out()
    plan.bar[mk.STATE_ERR] = 1
    assert plan.barrier_timed_out() and "gave up waiting" in plan.error_message()
