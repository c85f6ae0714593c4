"""A numpy run of a megakernel instruction list, reading every field as the kernel does: the
CPU check of the builder against the reference forward, and the GPU tests' diagnosis
(``compare_scratch``: the first scratch buffer where the GPU and the emulation differ)."""

from __future__ import annotations

import numpy as np

from zoi.backends.cuda.megakernel_program import (
    F_A,
    F_AUX,
    F_BIAS,
    F_BM,
    F_BN,
    F_EPOS,
    F_ETYPE,
    F_FAUX,
    F_FLAGS,
    F_K,
    F_LN_B,
    F_LN_G,
    F_LN_NP,
    F_LN_OUT,
    F_LN_PSTRIDE,
    F_M0,
    F_N,
    F_N0,
    F_OP,
    F_OUT,
    F_PSRC,
    F_RES,
    F_SIGNAL,
    F_W,
    F_WAIT,
    F_WAIT_N,
    F_X1,
    F_X2,
    FL_A_ATTN,
    FL_A_EMBED,
    FL_A_LN,
    FL_ACT_MASK,
    FL_HAS_RES,
    FL_HAS_TYPE,
    FL_LN_STORE,
    FL_OUT_F32,
    FL_POOL_CLS,
    OP_ATTN,
    OP_EMBED_LN,
    OP_GEMM,
    OP_LN,
    OP_NOP,
    OP_POOL,
    Program,
)


def emulate(prog: Program, wbuf: np.ndarray, d_in: np.ndarray, hdr_ints: int, out: np.ndarray,
            scratch: bool = False):  # fmt: skip
    """Run the program on the CPU reading every field as the kernel does (fp16 stores, fp32
    math): wbuf the weight buffer's bytes, d_in the call's int32 input, out the pooled
    [max_batch, H] fp32 (written). Order: the queues round robin, one instruction of each
    block whose wait is satisfied at a time. scratch: return (out, scratch bytes) instead."""
    sc = np.zeros(prog.scratch_bytes + 16, np.uint8)
    ctr = np.zeros(len(prog.per_call), np.int64)
    tb = prog.tb
    norm, B, T = int(d_in[0]), int(d_in[1]), int(d_in[2])
    cu = d_in[4 : 4 + B + 1].astype(np.int64)
    ids = d_in[hdr_ints : hdr_ints + tb]
    posn = d_in[hdr_ints + tb : hdr_ints + 2 * tb]

    def wv(off16, dt, count):
        return np.frombuffer(wbuf, dt, count, off16 * 16)

    def sv(off16, dt, shape):
        n = int(np.prod(shape))
        return np.frombuffer(sc, dt, n, off16 * 16).reshape(shape)

    def ln(x, g, b, eps):
        mu = x.mean(1, keepdims=True)
        d = x - mu
        return d / np.sqrt((d * d).mean(1, keepdims=True) + eps) * g + b

    def erf(x):
        from math import erf as e

        return np.vectorize(e)(x.astype(np.float64)).astype(np.float32)

    def f16(x):
        return np.asarray(x, np.float32).astype(np.float16).astype(np.float32)

    def embed_rows(r, rr, word, H):
        x = wv(word, np.float16, (int(ids[rr].max()) + 1 if len(rr) else 1) * H)
        x = x.reshape(-1, H)[ids[rr]].astype(np.float32)
        p = wv(r[F_EPOS], np.float16, (int(posn[rr].max()) + 1 if len(rr) else 1) * H)
        x = x + p.reshape(-1, H)[posn[rr]].astype(np.float32)
        if r[F_FLAGS] & FL_HAS_TYPE:
            x = x + wv(r[F_ETYPE], np.float16, H).astype(np.float32)
        return x

    def partial_rows(src, np_, stride, rr, H):
        a = sv(src, np.float32, (tb, H))[rr].copy()
        for q in range(1, max(1, np_)):  # split-K partials, in the kernel's order
            a += sv(int(src) + q * int(stride), np.float32, (tb, H))[rr]
        return a

    def prologue_ln(r, rr, H, eps):
        """The LN rows of an FL_A_LN / FL_A_EMBED prologue (fp16 values as float32)."""
        g, b = wv(r[F_LN_G], np.float32, H), wv(r[F_LN_B], np.float32, H)
        if r[F_FLAGS] & FL_A_EMBED:
            x = embed_rows(r, rr, r[F_PSRC], H)
        else:
            x = partial_rows(r[F_PSRC], int(r[F_LN_NP]), r[F_LN_PSTRIDE], rr, H)
        return f16(ln(x, g, b, eps))

    def attn_rows(qkv, rows, h, D, H, scale, tensor_cores):
        """Attention of query rows over their sequences' keys, head h. tensor_cores: as the
        fused prologue computes it (q.k unscaled then scaled, P rounded to fp16 for P V, the
        row sum of the fp32 P); else as the attention instruction (q scaled first, fp32)."""
        out = np.zeros((len(rows), D), np.float32)
        for i, row in enumerate(rows):
            s = int(np.searchsorted(cu[1:], row, side="right"))
            ks = np.arange(cu[s], cu[s + 1])
            q = qkv[row, h * D : h * D + D]
            kk = qkv[ks, H + h * D : H + h * D + D]
            v = qkv[ks, 2 * H + h * D : 2 * H + h * D + D]
            if tensor_cores:
                sc_ = (kk @ q) * scale
                p = np.exp2(sc_ - sc_.max())
                out[i] = (f16(p) @ v) / p.sum()
            else:
                sc_ = kk @ (q * scale)
                p = np.exp2(sc_ - sc_.max())
                out[i] = (p @ v) / p.sum()
        return out

    def run(r):
        op = int(r[F_OP])
        m0, bm, n0, N, K = int(r[F_M0]), int(r[F_BM]), int(r[F_N0]), int(r[F_N]), int(r[F_K])
        eps = float(np.array([r[F_FAUX]], np.int32).view(np.float32)[0])
        if op == OP_EMBED_LN:
            H = N
            rr = np.arange(m0, m0 + bm)
            o = sv(r[F_OUT], np.float16, (tb, H))
            ok = rr[rr < T]
            er = r.copy()
            er[F_EPOS], er[F_ETYPE] = r[F_W], r[F_RES]
            x = embed_rows(er, ok, r[F_A], H)
            g, b = wv(r[F_X1], np.float32, H), wv(r[F_X2], np.float32, H)
            o[rr[rr >= T]] = 0
            o[ok] = ln(x, g, b, eps).astype(np.float16)
        elif op == OP_LN:
            H = N
            rr = np.arange(m0, m0 + bm)
            ok = rr[rr < T]
            a = partial_rows(r[F_A], int(r[F_AUX]), r[F_RES], ok, H)
            o = sv(r[F_OUT], np.float16, (tb, H))
            g, b = wv(r[F_W], np.float32, H), wv(r[F_BIAS], np.float32, H)
            o[rr[rr >= T]] = 0
            o[ok] = ln(a, g, b, eps).astype(np.float16)
        elif op == OP_GEMM:
            if m0 >= T:
                return
            m1 = min(m0 + bm, tb)
            n1 = min(n0 + int(r[F_BN]), N)
            kb, ke = int(r[F_X1]), int(r[F_X2])
            fl = int(r[F_FLAGS])
            if fl & (FL_A_LN | FL_A_EMBED):
                rr = np.arange(m0, m1)
                A = np.zeros((m1 - m0, K), np.float32)  # padding rows: zeros
                A[rr < T] = prologue_ln(r, rr[rr < T], K, eps)
                if fl & FL_LN_STORE:
                    sv(r[F_LN_OUT], np.float16, (tb, K))[m0:m1] = A
            elif fl & FL_A_ATTN:
                D = int(r[F_AUX])
                qkv = sv(r[F_PSRC], np.float16, (tb, 3 * K)).astype(np.float32)
                rows_ = np.arange(m0, min(m1, T))
                A = np.zeros((m1 - m0, K), np.float32)
                for h in range(K // D):
                    A[: len(rows_), h * D : h * D + D] = attn_rows(qkv, rows_, h, D, K, eps, True)
                A = f16(A)
            else:
                A = sv(r[F_A], np.float16, (tb, K)).astype(np.float32)
            A = A[:, kb:ke] if fl & (FL_A_LN | FL_A_EMBED | FL_A_ATTN) else A[m0:m1, kb:ke]
            W = wv(r[F_W], np.float16, N * K).reshape(N, K)[n0:n1, kb:ke].astype(np.float32)
            y = A @ W.T
            if kb == 0:
                y = y + wv(r[F_BIAS], np.float32, N)[n0:n1]
            if (r[F_FLAGS] & FL_ACT_MASK) == 1:
                y = 0.5 * y * (1.0 + erf(y * 0.7071067811865476))
            if r[F_FLAGS] & FL_HAS_RES and kb == 0:
                y = y + sv(r[F_RES], np.float16, (tb, N))[m0:m1, n0:n1].astype(np.float32)
            if r[F_FLAGS] & FL_OUT_F32:
                sv(r[F_OUT], np.float32, (tb, N))[m0:m1, n0:n1] = y
            else:
                sv(r[F_OUT], np.float16, (tb, N))[m0:m1, n0:n1] = y.astype(np.float16)
        elif op == OP_ATTN:
            h, D, H3, H = n0, int(r[F_BN]), K, N
            qkv = sv(r[F_A], np.float16, (tb, H3)).astype(np.float32)
            o = sv(r[F_OUT], np.float16, (tb, H))
            rows_ = np.arange(m0, min(m0 + bm, T))
            if len(rows_):  # F_FAUX: the softmax scale times log2(e)
                got = attn_rows(qkv, rows_, h, D, H, eps, False)
                o[rows_, h * D : h * D + D] = got.astype(np.float16)
        elif op == OP_POOL:
            H = N
            lnp = bool(r[F_FLAGS] & FL_A_LN)
            x = None if lnp else sv(r[F_A], np.float16, (tb, H)).astype(np.float32)
            for b in range(m0, B, bm):
                s, e = int(cu[b]), int(cu[b + 1])
                if r[F_FLAGS] & FL_POOL_CLS:
                    e = min(e, s + 1)
                v = np.zeros(H, np.float32)
                if e > s:
                    v = (prologue_ln(r, np.arange(s, e), H, eps) if lnp else x[s:e]).mean(0)
                if norm:
                    v = v / max(float(np.sqrt((v * v).sum())), 1e-12)
                out[b] = v
        elif op != OP_NOP:
            raise ValueError(f"unknown opcode {op}")

    R = prog.rows
    heads = [0] * prog.n_blocks
    left = len(R)
    while left:
        moved = False
        for b, q in enumerate(prog.queues):
            if heads[b] >= len(q):
                continue
            i = q[heads[b]]
            r = R[i]
            if r[F_WAIT] >= 0 and ctr[r[F_WAIT]] < r[F_WAIT_N]:
                continue
            run(r)
            if r[F_SIGNAL] >= 0:
                ctr[r[F_SIGNAL]] += 1
            heads[b] += 1
            left -= 1
            moved = True
        if not moved:
            raise RuntimeError("megakernel program deadlocks: every block waits")
    return (out, sc) if scratch else out


def compare_scratch(prog: Program, got: np.ndarray, want: np.ndarray, T: int, tol=2e-2) -> list:
    """Per scratch buffer in the order the forward writes them, over the T real rows: the max
    abs difference between two runs' scratch bytes (the GPU's, the emulator's) and the first
    element beyond tol (relative to the buffer's scale). The first bad buffer names the
    opcode to look at."""
    rep = []
    for name, (off, rows, cols, size) in sorted(prog.buffers.items(), key=lambda kv: kv[1][0]):
        dt = np.float16 if size == 2 else np.float32
        n = rows * cols
        a = np.frombuffer(got, dt, n, off * 16).reshape(rows, cols)[:T].astype(np.float64)
        b = np.frombuffer(want, dt, n, off * 16).reshape(rows, cols)[:T].astype(np.float64)
        d = np.abs(a - b)
        d[~np.isfinite(a)] = np.inf
        scale = max(float(np.abs(b).max(initial=0)), 1e-6)
        bad = np.argwhere(d > tol * scale)
        first = None
        if len(bad):
            r, c = map(int, bad[0])
            first = dict(row=r, col=c, got=float(a[r, c]), want=float(b[r, c]))
        rep.append(dict(buffer=name, max_abs=float(d.max(initial=0)), scale=scale, first_bad=first))
    return rep
