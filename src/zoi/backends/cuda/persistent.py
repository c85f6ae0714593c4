"""Host side of the persistent megakernel (kernels/persistent.py): one launch per forward.

``build_persistent_steps(backend, tb)`` returns zero-arg callables that launch on the current
torch stream (capturable into the bucket's CUDA graph, like ``CudaBackend._steps_for``):
on a GPU one callable (all stages in one launch, grid barrier between them); in the
interpreter (``backend.eager``) or with ``split=True`` / ``CudaOptions(persistent_split=True)``
one launch per stage (no barrier executed: the debugging / CI path).

It reads the backend's call staging (``d_in``: header + cu_seqlens, ids at ``hdr_ints``,
positions at ``hdr_ints + tb``), its packed weights (``backend.w``) and writes
``backend.d_out``. Scratch activations live in the arena's activation region when they fit
(they are dead between calls); the offset table and the barrier counters live in a small
tensor of their own (they must survive other buckets' launches, which overwrite the arena).

Supports fp16 weights (``precision`` fp16 / fp32) on the BERT layer structure the CUDA
backend plans (embed, L x [qkv, attention, o, add+LN, ffn1+act, ffn2, add+LN], pool);
anything else raises ``PersistentUnsupported`` (the caller keeps the per-op kernels).

Tiles per bucket: ``default_cfg(tb, spec)`` (override with ``cfg=`` or
``CudaOptions(persistent_cfg={"KSPLIT_F2": 2})``). The GPU tools (per-op vs persistent, config
sweeps, per-stage times) are lab code: ``python lab/gpu/persistent_tools.py --help``.
"""

from __future__ import annotations

import logging

import numpy as np

from zoi.errors import BackendUnavailableError

log = logging.getLogger("zoi")


class PersistentUnsupported(BackendUnavailableError):
    pass


def _layers(backend):
    """Validate the launch list; return (embed launch, [per-layer 7 launches], pool)."""
    la = backend.plan["launches"]
    if any(x.extra.get("first_row") for x in la):  # its term is in the per-op linear only
        raise PersistentUnsupported("persistent kernel: INT8 linears with a first-row term")
    if not la or la[0].kind != "embed" or la[-1].kind != "pool" or (len(la) - 2) % 7:
        raise PersistentUnsupported("persistent kernel: unexpected launch list")
    kinds = ["linear", "attention", "linear", "add_layernorm", "linear", "linear", "add_layernorm"]
    if "pos" not in la[0].op.weights:
        raise PersistentUnsupported("persistent kernel: embeddings without a position table")
    layers = [la[1 + 7 * i : 8 + 7 * i] for i in range((len(la) - 2) // 7)]
    prev = la[0].out
    for ly in layers:
        if [x.kind for x in ly] != kinds:
            raise PersistentUnsupported("persistent kernel: layer is not BERT post-LN")
        qkv, att, o, ln1, f1, f2, ln2 = ly
        if att.op.weights or att.op.attrs.get("window", 0):  # MPNet / ModernBERT
            raise PersistentUnsupported("persistent kernel: attention with a bias, RoPE or window")
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
                if x.mode.is_int8 or f"{x.extra['prefix']}.w" not in w:
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
        c.update(backend.opts.persistent_cfg or {})  # e.g. {"BK": 128, "num_stages": 3}
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
            POLLS=kp.POLL_LIMIT,
            **c,
        )
        for k, v in k_stages(c, H, I).items():  # unless the cfg sets them
            self.meta.setdefault(k, v)
        # programs: at most one per SM (co-residency for the barrier), no more than the
        # largest stage has work items at a full bucket
        items = max(stage_items(tb, H, I, NH, nseq, c).values())
        self.grid = max(1, min(int(backend.sm), items))
        if split is None:
            split = backend.opts.persistent_split
        if split is None:
            split = backend.eager
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


def build_persistent_steps(backend, tb: int, cfg: dict | None = None, split: bool | None = None):
    """Zero-arg callables running bucket tb's whole forward (see the module docstring)."""
    return PersistentPlan(backend, tb, cfg, split).steps()
