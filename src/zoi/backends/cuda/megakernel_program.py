"""The megakernel's instruction lists (csrc/cuda/megakernel.cu executes them; docs/MEGAKERNEL.md).

``build_program(desc, tb, n_blocks)`` turns a model description (``megakernel.describe``) into
one bucket's ``Program``: int32 instruction rows in the kernel's format, per-block queues, the
counters and the scratch layout, with what every instruction reads and writes;
``check_program`` (megakernel_check.py) proves the list sound (every read after its write
through counters or queue order, no two writers of one box, waits on earlier instructions
only). Plain numpy: the CPU tests build and check every bucket shape without a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from zoi.errors import BackendUnavailableError

# ---- the instruction format, mirrored from megakernel.cu ----
OP_NOP, OP_EMBED_LN, OP_GEMM, OP_LN, OP_ATTN, OP_POOL = range(6)
(F_OP, F_WAIT, F_WAIT_N, F_WAIT_PER_CALL, F_SIGNAL, F_M0, F_BM, F_N0, F_BN, F_N, F_K) = range(11)
(F_A, F_W, F_BIAS, F_RES, F_OUT, F_X1, F_X2, F_FLAGS, F_AUX, F_FAUX, F_FAUX2) = range(11, 22)
F_SELF = 23  # the instruction's own index (the kernel's profile rows)
# a GEMM's (or the pool's) prologue: the A rows it makes itself (LayerNorm / embedding /
# attention) instead of reading them from an earlier instruction's output
(F_PSRC, F_LN_G, F_LN_B, F_LN_OUT, F_LN_NP, F_LN_PSTRIDE, F_EPOS, F_ETYPE) = range(24, 32)
N_FIELDS = 32
FL_ACT_MASK, FL_OUT_F32, FL_HAS_RES, FL_HAS_TYPE, FL_POOL_CLS = 0xF, 16, 32, 64, 128
FL_A_LN, FL_A_EMBED, FL_A_ATTN, FL_LN_STORE = 1 << 8, 1 << 9, 1 << 10, 1 << 11
STATE_ERR, STATE_GEN, STATE_DONE, STATE_CTR = 1, 2, 3, 4
ERR_TIMEOUT, ERR_BAD_OP = 1, 2
THREADS = 256
SMEM_BYTES = 201472  # the kernel's dynamic shared memory (static_assert there)
FA_HALVES = 144 * 392  # the fused attention's Q / K / V region (halves)
GEMM_BN = 64
MAX_H = 512  # the kernel keeps a lane's 16 columns of a row in registers
MAX_D = 128
MAX_BM = 32
# polls of a dependency counter (~0.5-1 us each) before a wait gives up: far above any real
# wait of one forward (< 1 ms), far below a hung-looking call
POLL_LIMIT = 1 << 21
ALIGN = 256
ACTS = {"none": 0, "gelu": 1}
LN_ROWS = 8  # rows of a LayerNorm / embedding instruction: one per warp
# The fusions' defaults, from bench_megakernel's variants on an H100 (MiniLM shapes, device
# us per forward, unfused / LN fused / attention fused / both): 1x16 177.5 / 185.2 / 171.3 /
# 175.9, 1x32 178.2 / 183.9 / 181.0 / 190.7, 1x64 187.3 / 206.8 / 206.6 / 226.2, 1x128 284.0 /
# 350.6 / - / -. A prologue costs about what the phase it removes cost (its loads are one more
# dependent round trip after the wait, and the LN's rows are recomputed by every column tile),
# so only the attention at 16 tokens is ahead; the LN prologue stays an option (off).
FUSE_LN_MAX = 0  # buckets <= this fuse their LayerNorms by default
FUSE_ATTN_MAX = 16  # buckets <= this fuse their attention by default (where attn_fusable)
LN_PRO_MAX_H = 384  # the widest row an LN prologue makes (a lane's slices of wider rows spill)
MAX_TB = 1024  # the kernel's shared cu_seqlens hold MAX_TB + 1 entries
ATTN_DIMS = (16, 32, 64)  # head dims of the fused attention prologue (the kernel's templates)


def attn_fusable(desc: dict, tb: int) -> bool:
    """The o tiles can compute their rows' attention themselves: 16-row tiles (tb <= 64, so
    at most 64 keys), a head_dim the kernel instantiates, Q / K / V of the bucket within the
    kernel's region."""
    kp = -(-tb // 16) * 16
    return tb <= 64 and desc["D"] in ATTN_DIMS and (16 + 2 * kp) * (desc["H"] + 8) <= FA_HALVES


class MegakernelUnsupported(BackendUnavailableError):
    pass


def f32_bits(x: float) -> int:
    return int(np.array([x], np.float32).view(np.int32)[0])


# ------------------------------------------------------------------ the program
@dataclass
class Program:
    """One bucket's instruction list. rows: [n, N_FIELDS] int32 (the kernel's format);
    queues: per block, instruction indices in execution order; per_call[c]: bumps of counter c
    per call; buffers: scratch name -> (16-byte offset, rows, cols, itemsize); access[i]:
    (reads, writes) of instruction i as (buffer, r0, r1, c0, c1) boxes; cost[i]: the
    scheduler's estimate."""

    tb: int
    bm: int
    rows: np.ndarray
    queues: list
    per_call: list
    buffers: dict
    scratch_bytes: int
    access: list
    cost: list
    names: list = field(default_factory=list)

    @property
    def n_blocks(self) -> int:
        return len(self.queues)

    def queue_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        qoff = np.zeros(len(self.queues) + 1, np.int32)
        qoff[1:] = np.cumsum([len(q) for q in self.queues])
        flat = np.array([i for q in self.queues for i in q], np.int32)
        return qoff, flat


def ffn2_splits(I: int, tiles: int, n_blocks: int) -> list[tuple[int, int]]:
    """Split-K ranges of ffn2 (K = intermediate): up to 4 splits of whole 64-column steps, as
    many as keep the stage's tiles within one round over the blocks (a K = 1536 tile runs 24
    dependent k steps unsplit, 6 at 4 splits); each split writes its own fp32 partial."""
    steps = -(-I // 64)
    for ks in (4, 3, 2):
        if ks <= steps and tiles * ks <= n_blocks:
            chunk = -(-steps // ks) * 64
            r = [(k, min(I, k + chunk)) for k in range(0, I, chunk)]
            if len(r) == ks:
                return r
    return [(0, I)]


def build_program(
    desc: dict,
    tb: int,
    n_blocks: int,
    max_seq: int | None = None,
    fuse_ln: bool | None = None,
    fuse_attn: bool | None = None,
) -> Program:
    """The instruction list of bucket tb over n_blocks persistent blocks (see the module and
    docs/MEGAKERNEL.md). Every buffer is written once per call (one set per layer), so the only
    hazards are read-after-write, each covered by a counter; instructions are placed by a list
    scheduler (earliest estimated finish, dependencies respected) and every queue is in global
    instruction order, so the lowest unfinished instruction can always run (no deadlock while
    the blocks are co-resident).

    fuse_ln (default: tb <= FUSE_LN_MAX, i.e. off; hidden <= LN_PRO_MAX_H only): no embedding /
    LayerNorm instructions; the qkv and ffn1 tiles make their A rows (the embedding's or the
    previous sum's LayerNorm) in a prologue, their first column tile stores them for the
    residual, and the pool normalises the last layer's rows itself. fuse_attn (default: tb <=
    FUSE_ATTN_MAX where ``attn_fusable``): no attention instructions; the o tiles compute their
    rows' attention in a prologue. Each fusion takes one dependent phase (a counter round trip
    and its loads) out of every layer."""
    H, I, NH, D, L = desc["H"], desc["I"], desc["NH"], desc["D"], desc["L"]
    if tb < 1 or n_blocks < 1:
        raise ValueError(f"build_program: tb {tb} and n_blocks {n_blocks} must be >= 1")
    if tb > MAX_TB:
        raise MegakernelUnsupported(f"megakernel: bucket {tb} > {MAX_TB} tokens")
    fuse_ln = (tb <= FUSE_LN_MAX if fuse_ln is None else bool(fuse_ln)) and H <= LN_PRO_MAX_H
    fuse_attn = (tb <= FUSE_ATTN_MAX if fuse_attn is None else bool(fuse_attn)) and attn_fusable(
        desc, tb
    )
    bm = 16 if tb <= 64 else 32
    n_m = -(-tb // bm)
    cd = lambda a, b: -(-a // b)  # noqa: E731
    max_seq = tb if max_seq is None else max(1, min(int(max_seq), tb))

    buffers: dict[str, tuple] = {}
    top = 0

    def buf(name, cols, itemsize):
        nonlocal top
        buffers[name] = (top // 16, tb, cols, itemsize)
        top += (tb * cols * itemsize + ALIGN - 1) // ALIGN * ALIGN

    for l in range(L + (0 if fuse_ln else 1)):  # fused: the last LN's rows stay in the pool
        buf(f"x{l}", H, 2)
    splits = ffn2_splits(I, n_m * cd(H, GEMM_BN), n_blocks)
    for l in range(L):
        buf(f"qkv{l}", 3 * H, 2)
        if not fuse_attn:
            buf(f"ctx{l}", H, 2)
        buf(f"s1_{l}", H, 4)
        buf(f"x1_{l}", H, 2)
        buf(f"h{l}", I, 2)
        for p in range(len(splits)):  # consecutive, one stride apart (the LN sums them)
            buf(f"s2_{l}_{p}", H, 4)
    s2_stride = (tb * H * 4 + ALIGN - 1) // ALIGN * ALIGN // 16

    rows, access, cost, names = [], [], [], []
    counters: dict[str, int] = {}
    per_call: list[int] = []
    producers: dict[int, list[int]] = {}

    def ctr(name):
        if name not in counters:
            counters[name] = len(per_call)
            per_call.append(0)
        return counters[name]

    def add(name, op, wait, signal, reads, writes, c, **f):
        r = np.zeros(N_FIELDS, np.int32)
        r[F_OP] = op
        r[F_WAIT] = -1 if wait is None else ctr(wait[0])
        r[F_WAIT_N] = 0 if wait is None else wait[1]
        r[F_SIGNAL] = -1 if signal is None else ctr(signal)
        for k, v in f.items():
            r[globals()[f"F_{k.upper()}"]] = v
        i = len(rows)
        r[F_SELF] = i
        if signal is not None:
            per_call[r[F_SIGNAL]] += 1
            producers.setdefault(int(r[F_SIGNAL]), []).append(i)
        rows.append(r)
        access.append((reads, writes))
        cost.append(float(c))
        names.append(name)

    sb = lambda n: buffers[n][0]  # noqa: E731
    eps = f32_bits(desc["eps"])
    e = desc["emb"]

    def pieces(m, rows):
        """Row pieces of `rows` rows of GEMM row block m: row-wise instructions (LayerNorm,
        embedding: a warp per row; attention: query rows) spread over more blocks, so that
        a block's warps each own one row instead of walking four in a row."""
        m0, m1 = m * bm, min(tb, m * bm + bm)
        return [(r, min(m1, r + rows)) for r in range(m0, m1, rows)]

    # attention query rows per instruction: the fewest that keep the stage within one round
    att_rows = next(
        (r for r in (8, 16) if r < bm and n_m * NH * cd(bm, r) <= n_blocks), bm
    )  # fmt: skip
    if not fuse_ln:
        for m in range(n_m):
            for m0, m1 in pieces(m, LN_ROWS):
                add(
                    f"embed m{m} r{m0}", OP_EMBED_LN, None, f"x0.m{m}", [],
                    [("x0", m0, m1, 0, H)], (m1 - m0) * H * 4, m0=m0, bm=m1 - m0, n=H,
                    a=e["word"], w=e["pos"], res=max(e["type"], 0), x1=e["ln_w"],
                    x2=e["ln_b"], out=sb("x0"), flags=FL_HAS_TYPE if e["type"] >= 0 else 0,
                    faux=eps,
                )  # fmt: skip

    def ln_fields(srcs, g, b):
        """The fields of a LayerNorm of the fp32 partials srcs (consecutive, one stride apart)."""
        return dict(psrc=sb(srcs[0]), ln_np=len(srcs), ln_pstride=s2_stride, ln_g=g, ln_b=b,
                    faux=eps)  # fmt: skip

    def ln_pro(srcs, g, b):
        """A GEMM tile's LN prologue over srcs: (flags, fields, the rows it reads, extra cost)."""
        reads = lambda m0, m1: [(x_, m0, m1, H) for x_ in srcs]  # noqa: E731
        return FL_A_LN, ln_fields(srcs, g, b), reads, bm * H * len(srcs) / 2

    def gemm(name, l, m, a, K, Nn, wo, bo, out, wait, signal, act=0, res=None, f32=False,
             ranges=None, pro=None, store=None):  # fmt: skip
        """pro: (flags, fields, read buffers, extra cost) of an A prologue; store: the buffer
        its first column tile stores the prologue's rows in."""
        m0, m1 = m * bm, min(tb, m * bm + bm)
        for n in range(cd(Nn, GEMM_BN)):
            n0, n1 = n * GEMM_BN, min(Nn, n * GEMM_BN + GEMM_BN)
            for p, (kb, ke) in enumerate(ranges or [(0, K)]):
                r0 = res if kb == 0 else None  # bias and residual: the first split only
                if pro is None:
                    reads, pf, pfl, pc = [(a, m0, m1, kb, ke)], {"a": sb(a)}, 0, 0.0
                else:
                    pfl, pf, rb, pc = pro
                    reads = [(x, r0_, r1_, 0, c_) for x, r0_, r1_, c_ in rb(m0, m1)]
                writes = [(out if ranges is None else f"{out}_{p}", m0, m1, n0, n1)]
                st = store is not None and n == 0
                if st:
                    writes.append((store, m0, m1, 0, K))
                    pf = dict(pf, ln_out=sb(store))
                reads += [(r0, m0, m1, n0, n1)] if r0 else []
                flags = (
                    act | pfl | (FL_OUT_F32 if f32 else 0) | (FL_HAS_RES if r0 else 0)
                    | (FL_LN_STORE if st else 0)
                )  # fmt: skip
                o = out if ranges is None else f"{out}_{p}"
                add(
                    f"{name}{l} m{m} n{n}" + (f" k{p}" if ranges else ""), OP_GEMM, wait, signal,
                    reads, writes,
                    (m1 - m0) * (n1 - n0) * (ke - kb) / 64 + 2 * (n1 - n0) * (ke - kb) / 8 + pc,
                    m0=m0, bm=bm, n0=n0, bn=GEMM_BN, n=Nn, k=K, x1=kb, x2=ke, w=wo,
                    bias=bo, res=sb(r0) if r0 else 0, out=sb(o), flags=flags, **pf,
                )  # fmt: skip

    n_qkv = cd(3 * H, GEMM_BN)
    n_h = cd(H, GEMM_BN)
    n_i = cd(I, GEMM_BN)
    np2 = len(splits)
    qk = f32_bits(desc["scale"] * 1.4426950408889634)
    layers = desc["layers"]
    for l, ly in enumerate(layers):
        x, qkv, ctx, s1, x1, hh, s2 = (
            f"x{l}", f"qkv{l}", f"ctx{l}", f"s1_{l}", f"x1_{l}", f"h{l}", f"s2_{l}",
        )  # fmt: skip
        for m in range(n_m):
            if not fuse_ln:
                gemm("qkv", l, m, x, H, 3 * H, ly["qkv_w"], ly["qkv_b"], qkv,
                     (f"{x}.m{m}", len(pieces(m, LN_ROWS))), f"qkv{l}")  # fmt: skip
            elif l == 0:  # the embedding's LayerNorm, from the tables: nothing to wait for
                pf = dict(psrc=e["word"], epos=e["pos"], etype=max(e["type"], 0),
                          ln_g=e["ln_w"], ln_b=e["ln_b"], faux=eps)  # fmt: skip
                fl = FL_A_EMBED | (FL_HAS_TYPE if e["type"] >= 0 else 0)
                gemm("qkv", l, m, None, H, 3 * H, ly["qkv_w"], ly["qkv_b"], qkv, None,
                     f"qkv{l}", pro=(fl, pf, lambda m0, m1: [], bm * H / 2),
                     store=x)  # fmt: skip
            else:
                pro = ln_pro([f"s2_{l - 1}_{p}" for p in range(np2)],
                             layers[l - 1]["ln2_w"], layers[l - 1]["ln2_b"])  # fmt: skip
                gemm("qkv", l, m, None, H, 3 * H, ly["qkv_w"], ly["qkv_b"], qkv,
                     (f"f2_{l - 1}.m{m}", n_h * np2), f"qkv{l}", pro=pro, store=x)  # fmt: skip
        if not fuse_attn:
            for m in range(n_m):
                for m0, m1 in pieces(m, att_rows):
                    for h in range(NH):
                        add(
                            f"attention{l} m{m} r{m0} h{h}", OP_ATTN,
                            (f"qkv{l}", n_m * n_qkv), f"ctx{l}.m{m}", [(qkv, 0, tb, 0, 3 * H)],
                            [(ctx, m0, m1, h * D, h * D + D)],
                            (m1 - m0) * min(tb, 512) * D / 16, m0=m0, bm=m1 - m0, n0=h, bn=D,
                            n=H, k=3 * H, a=sb(qkv), out=sb(ctx), faux=qk,
                        )  # fmt: skip
        for m in range(n_m):
            if fuse_attn:
                pf = dict(psrc=sb(qkv), aux=D, faux=qk)
                gemm("o", l, m, None, H, H, ly["o_w"], ly["o_b"], s1,
                     (f"qkv{l}", n_m * n_qkv), f"o{l}.m{m}", res=x, f32=True,
                     pro=(FL_A_ATTN, pf, lambda m0, m1, q=qkv: [(q, 0, tb, 3 * H)],
                          bm * tb * H / 8))  # fmt: skip
            else:
                gemm("o", l, m, ctx, H, H, ly["o_w"], ly["o_b"], s1,
                     (f"ctx{l}.m{m}", NH * len(pieces(m, att_rows))), f"o{l}.m{m}", res=x,
                     f32=True)  # fmt: skip
        if not fuse_ln:
            for m in range(n_m):
                for m0, m1 in pieces(m, LN_ROWS):
                    add(
                        f"ln1_{l} m{m} r{m0}", OP_LN, (f"o{l}.m{m}", n_h), f"x1_{l}.m{m}",
                        [(s1, m0, m1, 0, H)], [(x1, m0, m1, 0, H)], (m1 - m0) * H * 4,
                        m0=m0, bm=m1 - m0, n=H, a=sb(s1), w=ly["ln1_w"], bias=ly["ln1_b"],
                        out=sb(x1), faux=eps, aux=1,
                    )  # fmt: skip
        for m in range(n_m):
            if fuse_ln:
                gemm("ffn1_", l, m, None, H, I, ly["f1_w"], ly["f1_b"], hh,
                     (f"o{l}.m{m}", n_h), f"h{l}.m{m}", act=desc["act"],
                     pro=ln_pro([s1], ly["ln1_w"], ly["ln1_b"]), store=x1)  # fmt: skip
            else:
                gemm("ffn1_", l, m, x1, H, I, ly["f1_w"], ly["f1_b"], hh,
                     (f"x1_{l}.m{m}", len(pieces(m, LN_ROWS))), f"h{l}.m{m}",
                     act=desc["act"])  # fmt: skip
        for m in range(n_m):
            sig = "final" if fuse_ln and l == L - 1 else f"f2_{l}.m{m}"
            gemm("ffn2_", l, m, hh, I, H, ly["f2_w"], ly["f2_b"], s2, (f"h{l}.m{m}", n_i),
                 sig, res=x1, f32=True, ranges=splits)  # fmt: skip
        if not fuse_ln:
            nxt = f"x{l + 1}"
            for m in range(n_m):
                for m0, m1 in pieces(m, LN_ROWS):
                    add(
                        f"ln2_{l} m{m} r{m0}", OP_LN, (f"f2_{l}.m{m}", n_h * np2),
                        "final" if l == L - 1 else f"{nxt}.m{m}",
                        [(f"{s2}_{p}", m0, m1, 0, H) for p in range(np2)],
                        [(nxt, m0, m1, 0, H)], (m1 - m0) * H * 4 * np2,
                        m0=m0, bm=m1 - m0, n=H, a=sb(f"{s2}_0"), w=ly["ln2_w"],
                        bias=ly["ln2_b"], out=sb(nxt), faux=eps, aux=np2, res=s2_stride,
                    )  # fmt: skip
    P = max(1, min(max_seq, n_blocks))
    cls = FL_POOL_CLS if desc["pool"] == "cls" else 0
    if fuse_ln:
        last = layers[L - 1]
        srcs = [f"s2_{L - 1}_{p}" for p in range(np2)]
        pf, cls = ln_fields(srcs, last["ln2_w"], last["ln2_b"]), cls | FL_A_LN
        wait, reads = ("final", n_m * n_h * np2), [(x_, 0, tb, 0, H) for x_ in srcs]
    else:
        n_final = sum(len(pieces(m, LN_ROWS)) for m in range(n_m))
        wait, reads, pf = ("final", n_final), [(f"x{L}", 0, tb, 0, H)], {"a": sb(f"x{L}")}
    for p in range(P):
        add(
            f"pool {p}", OP_POOL, wait, None, reads,
            [("out", b, b + 1, 0, H) for b in range(p, max_seq, P)], tb * H / P, m0=p, bm=P,
            n=H, flags=cls, **pf,
        )  # fmt: skip
    R = np.stack(rows)
    for r in R:  # every wait covers all the bumps of its counter in a call
        if r[F_WAIT] >= 0:
            r[F_WAIT_PER_CALL] = per_call[r[F_WAIT]]
    queues = _schedule(R, cost, producers, n_blocks)
    return Program(tb, bm, R, queues, per_call, buffers, top, access, cost, names)


def _schedule(R: np.ndarray, cost: list, producers: dict, n_blocks: int) -> list:
    """List scheduling in global order: each instruction goes to the block where it would
    finish first (its dependencies' estimated finish respected), among those the block idle
    longest."""
    free = np.zeros(n_blocks)
    done = np.zeros(len(R))
    queues = [[] for _ in range(n_blocks)]
    for i, r in enumerate(R):
        ready = 0.0
        if r[F_WAIT] >= 0:
            ready = max((done[j] for j in producers[int(r[F_WAIT])]), default=0.0)
        fin = np.maximum(free, ready) + cost[i]
        # ties (every block idle before the dependencies are ready): the block idle longest
        b = int(np.argmin(np.where(fin <= fin.min(), free, np.inf)))
        start = np.maximum(free, ready)
        done[i] = start[b] + cost[i] + 1.0  # + a counter round trip
        free[b] = done[i]
        queues[b].append(i)
    return queues
