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
"""

from __future__ import annotations

import gc
import json
import logging
import os

import numpy as np

from zoi.errors import BackendUnavailableError

log = logging.getLogger("zoi")

MAX_TOKENS = 256  # buckets above this keep the per-op kernels


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
        self.n_stages = kp.STAGES_PER_LAYER * L + 1

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

        # scratch: X [tb,H] fp16, BIG [tb,max(3H,I)] fp16, CTX [tb,H] fp16, S [tb,H] fp32
        BIGC = max(3 * H, I)
        sizes = [tb * H * 2, tb * BIGC * 2, tb * H * 2, tb * H * 4]
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
        c = pick_config(tb, H, I, int(backend.sm))
        env_cfg = os.environ.get("ZOI_PERSISTENT_CFG")  # e.g. '{"BK": 128, "num_stages": 3}'
        c.update(json.loads(env_cfg) if env_cfg else {})
        c.update(cfg or {})
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
        # programs: at most one per SM (co-residency for the barrier), no more than the
        # largest stage has work items at a full bucket
        bm, cdiv = c["BM"], lambda a, b: -(-a // b)
        items = max(
            cdiv(tb, bm) * cdiv(3 * H, c["BN_WIDE"]),
            cdiv(tb, bm) * cdiv(I, c["BN_WIDE"]),
            cdiv(tb, bm) * cdiv(H, c["BN_NARROW"]),
            cdiv(tb, c["ATT_BM"]) * NH,
            nseq,
        )
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
            self.meta["num_stages"] = 1
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


def pick_config(tb: int, H: int, I: int, sm: int) -> dict:
    """Tiles per bucket (unmeasured guesses, to be swept on the GPU: ``python -m
    zoi.backends.cuda.persistent --sweep``). Each stage is latency bound (weights in L2, a
    few k-steps per item), so: 16-row tiles, and the narrowest N tile that still needs only
    one round of work items over the grid (a second round doubles the stage's latency)."""
    bm, cdiv = 16, lambda a, b: -(-a // b)
    m = cdiv(tb, bm)

    def bn(n, opts):
        return next((b for b in opts if m * cdiv(n, b) <= sm), opts[-1])

    return dict(
        BM=bm,
        BN_WIDE=bn(max(3 * H, I), (64, 128, 256)),
        BN_NARROW=bn(H, (32, 64, 128)),
        BK=64,
        ATT_BM=16,
        ATT_BN=64,
        POOL_BR=16,
        num_warps=4,
        num_stages=2,
    )


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
    opts = {k: meta[k] for k in ("num_warps", "num_stages")}
    const = {(names.index(k),): v for k, v in meta.items() if k not in opts}
    sig = {n: ARG_TYPES.get(n, "constexpr") for n in names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names) if n.endswith("_ptr")}
    src = ASTSource(fn=kp.persistent_kernel, signature=sig, constexprs=const, attrs=attrs)
    k = compile(src, target=GPUTarget("cuda", arch, 32), options=opts)
    ptx = k.asm["ptx"]
    sync = [ln.strip() for ln in ptx.splitlines() if "atom." in ln or ".acquire." in ln]
    return {
        "l1_activation_loads": kp.l1_loads_of_activations(ptx),
        "sync_ops": sync,
        "shared": int(k.metadata.shared),
        "cubin_bytes": len(k.asm["cubin"]),
    }


def build_persistent_steps(backend, tb: int, cfg: dict | None = None, split: bool | None = None):
    """Zero-arg callables running bucket tb's whole forward (see the module docstring)."""
    return PersistentPlan(backend, tb, cfg, split).steps()


def _stage_one(backend, tb: int, seed: int = 0):
    """Stage one sequence of tb random tokens into d_in (device), as run() would."""
    rng = np.random.default_rng(seed)
    V = int(backend.spec.vocab_size)
    P = int(backend.w["embed.pos"].shape[0])
    ids = rng.integers(0, V, tb).astype(np.int32)
    pos = (np.arange(tb) % P).astype(np.int32)
    n, _ = backend._stage(ids, pos, np.array([0, tb], np.int32), True, tb)
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


def compare(
    model_kw: dict | None = None, tb: int = 128, iters: int = 500, cfgs: list | None = None
) -> dict:
    """GPU: µs/forward of the persistent kernel vs the per-op graph on a minilm-shaped random
    fp16 model, plus the max abs difference of their outputs (one sequence of tb tokens)."""
    from tests.cuda_backend.cuda_helpers import tiny_model  # noqa: PLC0415

    from zoi.backends.cuda.backend import CudaBackend

    kw = dict(hidden=384, heads=12, layers=6, inter=1536, max_tokens=512, max_batch=64)
    kw.update(model_kw or {})
    be = CudaBackend(tiny_model("fp16", **kw), buckets=[tb])
    torch = be.torch

    def once(steps):
        _stage_one(be, tb)
        be.d_out.fill_(float("nan"))
        torch.cuda.synchronize()
        with torch.cuda.stream(be.tstream):
            for st in steps:
                st()
        torch.cuda.synchronize()
        return be.d_out[:1].clone()

    per_op = be._steps_for(tb)
    want = once(per_op)
    out = {"tb": tb, "layers": kw["layers"], "per_op_us": time_steps(be, per_op, tb, iters)}
    for cfg in cfgs or [None]:
        key = json.dumps(cfg) if cfg else "default"
        try:
            plan = PersistentPlan(be, tb, cfg)
            pers = plan.steps()
            got = once(pers)
        except Exception as e:  # noqa: BLE001 - one bad config must not end the sweep
            out[key] = {"error": f"{type(e).__name__}: {e}"[:300]}
            continue
        if plan.barrier_timed_out():
            out[key] = {"error": "grid barrier timed out"}
            continue
        out[key] = {
            "us": round(time_steps(be, pers, tb, iters), 2),
            "max_abs_diff": float((got - want).abs().max()),
            "grid": plan.grid,
            "cfg": {k: plan.meta[k] for k in ("BN_WIDE", "BN_NARROW", "BK", "num_stages")},
        }
    return out


SWEEP = [
    None,
    {"BK": 128},
    {"num_stages": 3},
    {"BN_WIDE": 64, "BN_NARROW": 32},
    {"BN_WIDE": 128, "BN_NARROW": 64},
    {"num_warps": 8},
    {"BK": 128, "num_stages": 3},
    {"BM": 32, "BN_WIDE": 64, "BN_NARROW": 32},
    {"BM": 32, "BN_WIDE": 128, "BN_NARROW": 64, "BK": 128},
    {"ATT_BM": 32},
]


if __name__ == "__main__":  # python -m zoi.backends.cuda.persistent [--sweep] [tb ...]
    import sys

    args = sys.argv[1:]
    sweep = "--sweep" in args
    for tb in [int(a) for a in args if a != "--sweep"] or [16, 128]:
        print(json.dumps(compare(tb=tb, cfgs=SWEEP if sweep else None)), flush=True)
