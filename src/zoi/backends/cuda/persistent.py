"""Host side of the persistent megakernel (kernels/persistent.py): one launch per forward.

``build_persistent_steps(backend, tb)`` returns zero-arg callables that launch on the current
torch stream (capturable into the bucket's CUDA graph, like ``CudaBackend._steps_for``):
on a GPU one callable (all stages in one launch, grid barrier between them); in the
interpreter (``backend.eager``) or with ``split=True`` / ``ZOI_PERSISTENT_SPLIT=1`` one
launch per stage (no barrier executed: the debugging / CI path).

It reads the backend's call staging (``d_in``: header + cu_seqlens, ids at ``hdr_ints``,
positions at ``hdr_ints + tb``), its packed weights (``backend.w``) and writes
``backend.d_out``. Scratch activations live in the arena's activation region when they fit
(they are dead between calls); the offset table and the barrier counters live in a small
tensor of their own (they must survive other buckets' launches, which overwrite the arena).

Supports fp16 weights (``precision`` fp16 / fp32) on the BERT layer structure the CUDA
backend plans (embed, L x [qkv, attention, o, add+LN, ffn1+act, ffn2, add+LN], pool);
anything else raises ``PersistentUnsupported`` (the caller keeps the per-op kernels).

Tiles per bucket: ``default_cfg(tb, spec)`` (override with ``cfg=`` or the env
``ZOI_PERSISTENT_CFG='{"KSPLIT_F2": 2}'``). GPU tools (random MiniLM-shaped fp16 model):

* ``python -m zoi.backends.cuda.persistent 16 128``: per-op graph (a ``persistent_max=0``
  backend) vs the persistent forward, µs per forward and max abs difference;
* ``... --sweep 128``: a few configs around the default (difference vs the default's output);
* ``... --stages 128``: each stage timed alone (a graph of 10 launches of that stage, minus
  an empty launch), the one-launch total and the implied cost per barrier.
"""

from __future__ import annotations

import gc
import json
import logging
import os

import numpy as np

from zoi.errors import BackendUnavailableError

log = logging.getLogger("zoi")


class PersistentUnsupported(BackendUnavailableError):
    pass


def _layers(backend):
    """Validate the unfused launch list; return (embed launch, [per-layer 7 launches], pool)."""
    la = backend.plans[False]["launches"]
    if not la or la[0].kind != "embed" or la[-1].kind != "pool" or (len(la) - 2) % 7:
        raise PersistentUnsupported("persistent kernel: unexpected launch list")
    kinds = ["linear", "attention", "linear", "add_layernorm", "linear", "linear", "add_layernorm"]
    layers = [la[1 + 7 * i : 8 + 7 * i] for i in range((len(la) - 2) // 7)]
    prev = la[0].out
    for ly in layers:
        if [x.kind for x in ly] != kinds:
            raise PersistentUnsupported("persistent kernel: layer is not BERT post-LN")
        qkv, att, o, ln1, f1, f2, ln2 = ly
        ok = (
            qkv.ins == [prev]
            and att.ins == [qkv.out]
            and o.ins == [att.out]
            and o.res is None
            and ln1.ins == [o.out]
            and ln1.res == prev
            and f1.ins == [ln1.out]
            and f2.ins == [f1.out]
            and f2.res is None
            and ln2.ins == [f2.out]
            and ln2.res == ln1.out
            and qkv.op.attrs.get("act", "none") == "none"
            and o.op.attrs.get("act", "none") == "none"
            and f2.op.attrs.get("act", "none") == "none"
        )
        if not ok:
            raise PersistentUnsupported("persistent kernel: unexpected layer wiring")
        prev = ln2.out
    if la[-1].ins != [prev]:
        raise PersistentUnsupported("persistent kernel: pool does not read the last layer")
    return la[0], layers, la[-1]


class PersistentPlan:
    """Everything one bucket's launch needs, fixed at build time."""

    def __init__(self, backend, tb: int, cfg: dict | None = None, split: bool | None = None):
        from zoi.backends.cuda.kernels import persistent as kp
        from zoi.backends.cuda.kernels.linear import ACTS
        from zoi.backends.cuda.kernels.pool import MODES

        torch = backend.torch
        if tb > backend.max_tokens:
            raise PersistentUnsupported(f"bucket {tb} > max_tokens {backend.max_tokens}")
        emb, layers, pool = _layers(backend)
        w = backend.w
        sp = backend.spec
        H, I = int(sp.hidden), int(layers[0][4].n)
        att = layers[0][1].op.attrs
        NH, D = int(att["heads"]), int(att["head_dim"])
        if NH * D != H or layers[0][0].n != 3 * H:
            raise PersistentUnsupported("persistent kernel: heads x head_dim != hidden")
        if "embed.word" not in w:
            raise PersistentUnsupported("persistent kernel: int8 embedding table (fp16 only)")
        for ly in layers:
            for x in (ly[0], ly[2], ly[4], ly[5]):
                if x.quant != 0 or f"{x.extra['prefix']}.w" not in w:
                    raise PersistentUnsupported("persistent kernel: fp16 weights only")
            if ly[1].op.attrs != att or ly[4].op.attrs.get("act") != layers[0][4].op.attrs.get(
                "act"
            ):
                raise PersistentUnsupported("persistent kernel: layers differ")
        eps = {float(emb.op.attrs["eps"])}
        for ly in layers:
            eps |= {float(ly[3].op.attrs["eps"]), float(ly[6].op.attrs["eps"])}
        if len(eps) != 1:
            raise PersistentUnsupported("persistent kernel: LayerNorm eps differ")
        self.eps = eps.pop()
        self.qk_scale = float(att["scale"]) * 1.4426950408889634
        L = len(layers)
        self.n_layers = L
        self.n_stages = kp.STAGES_PER_LAYER * L + kp.EXTRA_STAGES

        # offset table: fp16 / fp32 element offsets into the one weight buffer
        base = backend.wbuf.data_ptr()

        def off(key, size):
            b = w[key].data_ptr() - base
            if b % 256:  # the kernel tells the compiler so (tl.multiple_of): vector loads
                raise PersistentUnsupported(f"persistent kernel: {key} not 256-byte aligned")
            return b // size

        if base % 256 and not backend.eager:
            raise PersistentUnsupported("persistent kernel: weight buffer not 256-byte aligned")

        tab = np.zeros((L + 1, kp.TAB_COLS), np.int64)
        for i, ly in enumerate(layers):
            qkv, _, o, ln1, f1, f2, ln2 = ly
            row = {
                kp.QKV_W: off(f"{qkv.extra['prefix']}.w", 2),
                kp.QKV_B: off(f"{qkv.extra['prefix']}.b", 4),
                kp.O_W: off(f"{o.extra['prefix']}.w", 2),
                kp.O_B: off(f"{o.extra['prefix']}.b", 4),
                kp.LN1_W: off(f"{ln1.out}.ln.w", 4),
                kp.LN1_B: off(f"{ln1.out}.ln.b", 4),
                kp.F1_W: off(f"{f1.extra['prefix']}.w", 2),
                kp.F1_B: off(f"{f1.extra['prefix']}.b", 4),
                kp.F2_W: off(f"{f2.extra['prefix']}.w", 2),
                kp.F2_B: off(f"{f2.extra['prefix']}.b", 4),
                kp.LN2_W: off(f"{ln2.out}.ln.w", 4),
                kp.LN2_B: off(f"{ln2.out}.ln.b", 4),
            }
            for c, v in row.items():
                tab[i, c] = v
        self.has_type = "embed.type0" in w
        tab[L, kp.E_WORD] = off("embed.word", 2)
        tab[L, kp.E_POS] = off("embed.pos", 2)
        tab[L, kp.E_TYPE] = off("embed.type0", 2) if self.has_type else 0
        tab[L, kp.E_LNW] = off("embed.ln.w", 4)
        tab[L, kp.E_LNB] = off("embed.ln.b", 4)
        # own state: [table (int64) | barrier: arrival counter, timed-out flag (int64)]
        state = torch.zeros(tab.size * 8 + 64, dtype=torch.uint8, device=backend.dev)
        self.tab = state[: tab.size * 8].view(torch.int64)
        self.tab.copy_(torch.from_numpy(tab.reshape(-1)).to(backend.dev))
        self.bar = state[tab.size * 8 : tab.size * 8 + 16].view(torch.int64)  # [arrivals, err]
        self.state = state

        c = default_cfg(tb, sp, int(backend.sm), H=H, I=I, heads=NH)
        env_cfg = os.environ.get("ZOI_PERSISTENT_CFG")  # e.g. '{"BK": 128, "num_stages": 3}'
        c.update(json.loads(env_cfg) if env_cfg else {})
        c.update(cfg or {})
        # scratch: X [tb,H] fp16, BIG [tb,max(3H,I)] fp16, CTX [tb,H] fp16,
        # S [P,tb,H] fp32 (P = the largest split-K factor: one partial slice per split)
        BIGC = max(3 * H, I)
        nsl = max(int(c["KSPLIT_O"]), int(c["KSPLIT_F2"]))
        sizes = [tb * H * 2, tb * BIGC * 2, tb * H * 2, nsl * ((tb * H + 63) // 64 * 64) * 4]
        self.s_stride = (tb * H + 63) // 64 * 64  # elements; a multiple of 64 (aligned)
        al = [(s + 255) // 256 * 256 for s in sizes]
        need = sum(al)
        if need <= backend.act_bytes:
            region = backend.arena[:need]
        else:
            region = torch.zeros(need, dtype=torch.uint8, device=backend.dev)
            self.own_scratch = region
        o0 = np.cumsum([0] + al)
        self.x = region[o0[0] : o0[0] + sizes[0]].view(torch.float16)
        self.big = region[o0[1] : o0[1] + sizes[1]].view(torch.float16)
        self.ctx = region[o0[2] : o0[2] + sizes[2]].view(torch.float16)
        self.s = region[o0[3] : o0[3] + sizes[3]].view(torch.float32)
        self.scratch_bytes = need

        d_in, hi = backend.d_in, backend.hdr_ints
        self.hdr = d_in[:hi]
        self.ids = d_in[hi : hi + tb]
        self.pos = d_in[hi + tb : hi + 2 * tb]
        self.w16 = backend.wbuf.view(torch.float16)
        self.w32 = backend.wbuf.view(torch.float32)
        self.out = backend.d_out
        nseq = min(backend.max_batch, tb)
        self.meta = dict(
            H=H,
            HP=kp.next_pow2(H),
            I=I,
            NHEAD=NH,
            D=D,
            BLOCK_D=max(16, kp.next_pow2(D)),
            BLOCK_B=max(16, kp.next_pow2(nseq)),
            HAS_TYPE=self.has_type,
            ACT=ACTS[layers[0][4].op.attrs.get("act", "none")],
            POOL=MODES[pool.op.attrs["mode"]],
            SPL=kp.STAGES_PER_LAYER,
            **c,
        )
        for k, v in k_stages(c, H, I).items():  # unless the cfg sets them
            self.meta.setdefault(k, v)
        # programs: at most one per SM (co-residency for the barrier), no more than the
        # largest stage has work items at a full bucket
        items = max(stage_items(tb, H, I, NH, nseq, c).values())
        self.grid = max(1, min(int(backend.sm), items))
        if split is None:
            split = backend.eager or os.environ.get("ZOI_PERSISTENT_SPLIT") == "1"
        self.split = bool(split)
        self.tb = tb
        if not backend.eager:
            self._check_compiled()

    def _check_compiled(self):
        """Compile now and read the PTX: activations written by other programs of the same
        launch must never be read through L1. Loads carry .cg, but the software pipeliner
        turns a load into cp.async, whose .ca form (copies < 16 bytes) allocates in L1: then
        recompile without pipelining (num_stages 1), and refuse if it is still there."""
        from zoi.backends.cuda.kernels.persistent import l1_loads_of_activations, persistent_kernel

        for _ in range(2):
            k = persistent_kernel.warmup(
                *self._args(0, self.n_stages), grid=(self.grid,), **self.meta
            )
            self.ptx = k.asm["ptx"]
            bad = l1_loads_of_activations(self.ptx)
            if not bad:
                return
            if self.meta["num_stages"] == 1:
                break
            log.warning(
                "zoi: persistent kernel reads activations via L1 (%s): num_stages=1", bad[:3]
            )
            self.meta.update(num_stages=1, KST_H=1, KST_F2=1, KST_POOL=1)
        raise PersistentUnsupported(f"persistent kernel: L1-caching loads in the PTX ({bad[:3]})")

    def _args(self, lo: int, hi: int) -> tuple:
        return (
            self.hdr,
            self.ids,
            self.pos,
            self.w16,
            self.w32,
            self.tab,
            self.x,
            self.big,
            self.ctx,
            self.s,
            self.out,
            self.bar,
            self.s_stride,
            self.n_layers,
            lo,
            hi,
            self.eps,
            self.qk_scale,
        )

    def barrier_timed_out(self) -> bool:
        """True when a grid barrier gave up waiting (then that forward's output is void)."""
        return bool(int(self.bar[1].item()) != 0)

    def launch(self, lo: int, hi: int):
        from zoi.backends.cuda.kernels.persistent import persistent_kernel

        persistent_kernel[(self.grid,)](*self._args(lo, hi), **self.meta)

    def steps(self) -> list:
        if self.split:
            return [lambda s=s: self.launch(s, s + 1) for s in range(self.n_stages)]
        return [lambda: self.launch(0, self.n_stages)]


def stage_items(tb: int, H: int, I: int, NH: int, nseq: int, c: dict) -> dict:
    """Work items per stage kind at a full bucket (the grid never exceeds the largest)."""
    m = -(-tb // c["BM"])
    cd = lambda a, b: -(-a // b)  # noqa: E731
    m_ln = cd(tb, c["BM_LN"])
    return {
        "qkv": m * cd(3 * H, c["BN_WIDE"]),
        "attention": cd(tb, c["ATT_BM"]) * NH,
        "o": m * cd(H, c["BN_NARROW"]) * c["KSPLIT_O"],
        "ffn1": m * cd(I, c["BN_WIDE"]),
        "ffn2": m * cd(H, c["BN_NARROW"]) * c["KSPLIT_F2"],
        "final_ln": m_ln,
        "pool": nseq,
    }


def default_cfg(
    tb: int,
    spec=None,
    sm: int = 132,
    *,
    H: int | None = None,
    I: int | None = None,
    heads: int | None = None,
):
    """Tiles per bucket (reasoned, not measured; ``python -m zoi.backends.cuda.persistent
    --sweep 16 128`` checks them on the GPU). Every stage is latency bound (weights live in
    L2; a dependent L2 round trip is ~0.6 us), so the aim is ONE round of work items over the
    grid and as few dependent round trips per item as possible:

    * K = H stages (qkv, o, ffn1): BK = next_pow2(H) (<= 512): the whole [BM, H] row block
      (its LN statistics on registers) and the [H, BN] weight tile are requested at once;
    * ffn2 (K = I): deterministic split-K (fp32 partial slices of S, summed in a fixed order
      by the next LN-on-load / the pool) so that each item runs 3-4 pipelined k-steps of 128
      and the grid has work at small buckets;
    * BM 16 up to 64 tokens, 32 above (halves the weight re-reads; items stay <= one round);
      BN the narrowest that keeps the stage within one round (within two for ffn1 at 256).
    """
    import triton

    H = int(H if H is not None else spec.hidden)
    I = int(I if I is not None else spec.intermediate)
    nhead = int(heads if heads is not None else getattr(spec, "heads", 0) or H // 32)
    cd = lambda a, b: -(-a // b)  # noqa: E731
    bm = 16 if tb <= 64 else 32
    m = cd(tb, bm)
    hp = triton.next_power_of_2(H)
    bk = hp if hp <= 512 else 128
    wide = 32 if m * cd(I, 32) <= sm else 64
    narrow = 32 if tb <= 32 else 64
    bk2 = 128
    # split-K trades ffn2's k-steps for partial slices that every qkv item (and the final
    # LN) re-reads in fp32: at BM 32 the [32, H] x P reads dominate qkv's bytes, so cap P
    # at 2 there (model, H200 MiniLM tb 128: P 2 ~5.9 us / layer for qkv + ffn2, P 4 ~6.3,
    # P 1 ~7.5); at BM 16 P 4 (tb 16: ffn2 ~1.2 us instead of ~2.4 with P 2)
    ks_max = 4 if bm == 16 else 2
    ks = next(
        (
            k
            for k in (4, 3, 2)
            if k <= ks_max and I % k == 0 and (I // k) % bk2 == 0 and m * cd(H, narrow) * k <= sm
        ),
        1,
    )
    return dict(
        BM=bm,
        BN_WIDE=wide,
        BN_NARROW=narrow,
        BK=bk,
        BK_F2=bk2,
        KSPLIT_O=1,
        KSPLIT_F2=ks,
        ATT_BM=16 if cd(tb, 16) * nhead <= sm else 32,  # one round of (query block, head)
        # >= 64 keys: each thread's slice of a [ATT_BN, 32] fp16 tile stays one 16-byte
        # cp.async.cg (narrower copies become cp.async.ca, which may read a stale L1 line)
        ATT_BN=min(128, max(64, triton.next_power_of_2(tb))),
        BM_LN=16,  # the final LN2: one row tile per item, every partial loaded at once
        POOL_BR=64,  # the pool walks fp16 rows: [64, HP] x 2 stages in shared memory
        num_warps=8 if bk >= 512 else 4,
        num_stages=3,
    )


def k_stages(c: dict, H: int, I: int) -> dict:
    """k-loop software-pipeline depths: every k-step of an item in flight at once
    (iterations + 1, at most 4); a single step gets 1 (plain loads, no cp.async staging
    buffers: the one-shot o tile would otherwise hold num_stages copies in shared memory)."""
    cd = lambda a, b: -(-a // b)  # noqa: E731
    it_h = cd(H, c["BK"])
    it_f2 = cd(cd(I, c["KSPLIT_F2"]), c["BK_F2"])
    one = int(c.get("num_stages", 3)) == 1
    return {
        "KST_H": 1 if one or it_h == 1 else min(it_h + 1, 4),
        "KST_F2": 1 if one or it_f2 == 1 else min(it_f2 + 1, 4),
        "KST_POOL": 1 if one else 2,
    }


ARG_TYPES = {
    "hdr_ptr": "*i32",
    "ids_ptr": "*i32",
    "pos_ptr": "*i32",
    "w16_ptr": "*fp16",
    "w32_ptr": "*fp32",
    "tab_ptr": "*i64",
    "x_ptr": "*fp16",
    "big_ptr": "*fp16",
    "ctx_ptr": "*fp16",
    "s_ptr": "*fp32",
    "out_ptr": "*fp32",
    "bar_ptr": "*i64",
    "s_stride": "i32",
    "n_layers": "i32",
    "stage_lo": "i32",
    "stage_hi": "i32",
    "eps": "fp32",
    "qk_scale": "fp32",
}


def compile_ahead(meta: dict, arch: int = 90) -> dict:
    """Compile the kernel for a CUDA target without a GPU (needs TRITON_INTERPRET unset;
    ptxas runs): the CPU check of what the interpreter cannot see (codegen errors, the PTX
    of the barrier and of the activation loads). Pointers assumed 16-byte aligned, as the
    launcher specialises them."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, compile

    from zoi.backends.cuda.kernels import persistent as kp

    names = kp.persistent_kernel.arg_names
    meta = {**k_stages(meta, meta["H"], meta["I"]), **meta}
    opts = {k: meta[k] for k in ("num_warps", "num_stages")}
    const = {(names.index(k),): v for k, v in meta.items() if k not in opts}
    sig = {n: ARG_TYPES.get(n, "constexpr") for n in names}
    attrs = {  # as the launcher specialises them: 16-aligned pointers, s_stride % 16 == 0
        (i,): [["tt.divisibility", 16]]
        for i, n in enumerate(names)
        if n.endswith("_ptr") or n == "s_stride"
    }
    src = ASTSource(fn=kp.persistent_kernel, signature=sig, constexprs=const, attrs=attrs)
    k = compile(src, target=GPUTarget("cuda", arch, 32), options=opts)
    ptx = k.asm["ptx"]
    sync = [ln.strip() for ln in ptx.splitlines() if "atom." in ln or ".acquire." in ln]
    return {
        "l1_activation_loads": kp.l1_loads_of_activations(ptx),
        "sync_ops": sync,
        "shared": int(k.metadata.shared),
        "cubin_bytes": len(k.asm["cubin"]),
        "cp_async_cg": ptx.count("cp.async.cg"),
        "cp_async_ca": ptx.count("cp.async.ca"),
        **_resource_usage(k.asm["cubin"]),
    }


def _resource_usage(cubin: bytes) -> dict:
    """Registers and spill bytes of the compiled kernel (cuobjdump; {} when unavailable)."""
    import re
    import shutil
    import subprocess
    import tempfile

    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/cuobjdump")
    tool = tool if os.path.exists(tool) else shutil.which("cuobjdump")
    if not tool:
        return {}
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        r = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True)
    m = re.search(r"REG:(\d+)", r.stdout)
    sp = re.search(r"STACK:(\d+)", r.stdout)
    ls = re.search(r"LOCAL:(\d+)", r.stdout)
    return {
        "regs": int(m.group(1)) if m else None,
        "stack": int(sp.group(1)) if sp else None,
        "local": int(ls.group(1)) if ls else None,
    }


def build_persistent_steps(backend, tb: int, cfg: dict | None = None, split: bool | None = None):
    """Zero-arg callables running bucket tb's whole forward (see the module docstring)."""
    return PersistentPlan(backend, tb, cfg, split).steps()


def _stage_one(backend, tb: int, seed: int = 0):
    """Stage one sequence of tb random tokens into d_in (device), as run() would."""
    n = backend._stage_random(tb, seed, normalize=True)
    backend.d_in[:n].copy_(backend.torch.from_numpy(backend.h_in[:n].copy()))
    if not backend.eager:  # the backend's stream does not sync with the legacy default one
        backend.torch.cuda.synchronize()


def time_steps(backend, steps, tb: int, iters: int = 200) -> float:
    """Device µs per forward of a list of steps, captured in one torch CUDA graph and replayed
    back to back (CUDA events). The same measure for the persistent and the per-op steps."""
    torch = backend.torch
    _stage_one(backend, tb)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            for st in steps:
                st()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    gc.collect()
    was = gc.isenabled()
    gc.disable()
    try:
        with torch.cuda.graph(g):
            for st in steps:
                st()
    finally:
        if was:
            gc.enable()
    for _ in range(10):
        g.replay()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(iters):
        g.replay()
    e1.record()
    torch.cuda.synchronize()
    return e0.elapsed_time(e1) * 1000.0 / iters


def time_persistent(backend, tb: int, iters: int = 200, **kw) -> float:
    """Device µs per forward of the persistent kernel at bucket tb (captured graph)."""
    return time_steps(backend, build_persistent_steps(backend, tb, **kw), tb, iters)


def _minilm_backend(tb: int, model_kw: dict | None = None, persistent_max: int = 0):
    """A random MiniLM-shaped fp16 model on the GPU; the backend itself keeps the per-op
    kernels (persistent_max 0), so its _steps_for(tb) IS the per-op path."""
    from zoi.backends.cuda.backend import CudaBackend
    from zoi.graph.synthetic import random_model

    kw = dict(hidden=384, heads=12, layers=6, inter=1536, max_tokens=512, max_batch=64)
    kw.update(model_kw or {})
    be = CudaBackend(random_model("fp16", **kw), buckets=[tb], persistent_max=persistent_max)
    return be, kw


def _once(be, tb, steps):
    torch = be.torch
    _stage_one(be, tb)
    be.d_out.fill_(float("nan"))
    torch.cuda.synchronize()
    with torch.cuda.stream(be.tstream):
        for st in steps:
            st()
    torch.cuda.synchronize()
    return be.d_out[:1].clone()


def compare(
    model_kw: dict | None = None,
    tb: int = 128,
    iters: int = 500,
    cfgs: list | None = None,
    per_op: bool = True,
    budget_s: float | None = None,
) -> dict:
    """GPU: µs/forward of the persistent kernel (each cfg) vs the per-op graph on a
    minilm-shaped random fp16 model, plus the max abs difference of the outputs (one
    sequence of tb tokens) against the per-op path (per_op=False: against the first cfg)."""
    import time

    t0 = time.monotonic()
    be, kw = _minilm_backend(tb, model_kw)
    out = {"tb": tb, "layers": kw["layers"], "sm": int(be.sm)}
    want = None
    if per_op:
        steps = be._steps_for(tb)  # persistent_max=0: the 44-node per-op launch list
        want = _once(be, tb, steps)
        out["per_op_us"] = round(time_steps(be, steps, tb, iters), 2)
        out["per_op_launches"] = len(steps)
    best = None
    for cfg in cfgs or [None]:
        key = json.dumps(cfg) if cfg else "default"
        if budget_s is not None and time.monotonic() - t0 > budget_s:  # each cfg compiles ~5 s
            out.setdefault("skipped_for_time", []).append(key)
            continue
        try:
            plan = PersistentPlan(be, tb, cfg)
            pers = plan.steps()
            got = _once(be, tb, pers)
        except Exception as e:  # noqa: BLE001 - one bad config must not end the sweep
            out[key] = {"error": f"{type(e).__name__}: {e}"[:300]}
            continue
        if plan.barrier_timed_out():
            out[key] = {"error": "grid barrier timed out"}
            continue
        if want is None:
            want = got
        us = round(time_steps(be, pers, tb, iters), 2)
        out[key] = {
            "us": us,
            "max_abs_diff": float((got - want).abs().max()),
            "grid": plan.grid,
            "cfg": {k: plan.meta[k] for k in CFG_KEYS},
        }
        if best is None or us < out[best]["us"]:
            best = key
    out["best"] = best
    out["wall_s"] = round(time.monotonic() - t0, 1)
    return out


CFG_KEYS = (
    "BM", "BN_WIDE", "BN_NARROW", "BK", "BK_F2", "KSPLIT_O", "KSPLIT_F2", "ATT_BN", "POOL_BR", "BM_LN", "KST_H", "KST_F2", "KST_POOL",
    "num_warps", "num_stages",
)  # fmt: skip


def stage_times(tb: int = 128, iters: int = 100, reps: int = 10, cfg: dict | None = None) -> dict:
    """GPU: the stage-time breakdown of the default plan at bucket tb. Each stage alone
    (launch(s, s + 1), no barrier) ``reps`` times in one captured graph, replayed; minus the
    same for an empty launch (launch(0, 0): the per-launch cost). The one-launch total minus
    the stage sum is what the barriers (and the lost overlap) cost."""
    import time

    t0 = time.monotonic()
    be, kw = _minilm_backend(tb)
    plan = PersistentPlan(be, tb, cfg, split=False)
    _once(be, tb, plan.steps())  # valid activations in every buffer
    total = time_steps(be, plan.steps(), tb, iters)
    empty = time_steps(be, [lambda: plan.launch(0, 0)] * reps, tb, iters) / reps
    kinds = ["qkv", "attention", "o", "ffn1", "ffn2"]
    per, by_kind = [], {k: 0.0 for k in kinds + ["final_ln", "pool"]}
    for s in range(plan.n_stages):
        t = time_steps(be, [lambda s=s: plan.launch(s, s + 1)] * reps, tb, iters) / reps - empty
        kind = {plan.n_stages - 1: "pool", plan.n_stages - 2: "final_ln"}.get(s) or kinds[s % 5]
        per.append({"stage": s, "kind": kind, "us": round(t, 2)})
        by_kind[kind] += t
    ssum = sum(x["us"] for x in per)
    n_bar = plan.n_stages - 1
    return {
        "tb": tb,
        "layers": kw["layers"],
        "grid": plan.grid,
        "cfg": {k: plan.meta[k] for k in CFG_KEYS},
        "one_launch_us": round(total, 2),
        "empty_launch_us": round(empty, 2),
        "stage_sum_us": round(ssum, 2),
        "per_barrier_us": round((total - ssum - empty) / n_bar, 2),
        "by_kind_us": {k: round(v, 2) for k, v in by_kind.items()},
        "stages": per,
        "wall_s": round(time.monotonic() - t0, 1),
        "items": stage_items(tb, plan.meta["H"], plan.meta["I"], plan.meta["NHEAD"],
                             min(be.max_batch, tb), plan.meta),
    }  # fmt: skip


def sweep_cfgs(tb: int) -> list:
    """A handful of alternatives around default_cfg(tb) (each compiles in ~5 s; num_warps 4
    with the one-shot BK 512 spills hundreds of bytes at BM 32: not worth a slot)."""
    c = default_cfg(tb, None, H=384, I=1536, heads=12)
    alts = [
        None,
        {"KSPLIT_F2": 1},  # no split-K
        {"KSPLIT_F2": 4 if c["KSPLIT_F2"] == 2 else 2},
        {"BK": 128, "num_warps": 4},  # the chunked LN path (k loop over 128, pipelined)
        {"num_stages": 2},
    ]
    if tb <= 64:
        alts.append({"BN_WIDE": 64 if c["BN_WIDE"] == 32 else 32})
    else:
        alts.append({"BM": 16})
    if tb >= 256:  # ffn1 / qkv in one round: wider N tiles through the chunked-K path
        alts.append({"BN_WIDE": 128, "BK": 128})
    return alts


if __name__ == "__main__":
    # python -m zoi.backends.cuda.persistent [tb ...]          per-op vs persistent (default cfg)
    # python -m zoi.backends.cuda.persistent --sweep [tb ...]  a few cfgs (vs the default's output)
    # python -m zoi.backends.cuda.persistent --stages [tb ...] per-stage breakdown
    import sys

    args = sys.argv[1:]
    tbs = [int(a) for a in args if not a.startswith("--")] or [16, 128]
    for tb in tbs:
        if "--stages" in args:
            r = stage_times(tb)
        elif "--sweep" in args:
            r = compare(tb=tb, cfgs=sweep_cfgs(tb), per_op=False, iters=200, budget_s=45)
        else:
            r = compare(tb=tb)
        print(json.dumps(r), flush=True)
