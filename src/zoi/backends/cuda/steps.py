"""The per-op forward of one bucket: a list of zero-argument closures, one kernel launch
each, over fixed device views (weights, arena), launched on the current torch stream: what
the graph capture records, and what the interpreter runs eagerly."""

from __future__ import annotations


def per_op_steps(plan: dict, arena, w: dict, spec, tb: int, pdl: bool) -> list:
    """The launches of `plan` for a bucket of tb tokens (pdl: programmatic dependent launch)."""
    import torch

    from zoi.backends.cuda.kernels import attention as k_attn
    from zoi.backends.cuda.kernels import embed as k_embed
    from zoi.backends.cuda.kernels import glu as k_glu
    from zoi.backends.cuda.kernels import layernorm as k_ln
    from zoi.backends.cuda.kernels import linear as k_lin
    from zoi.backends.cuda.kernels import pool as k_pool
    from zoi.backends.cuda.kernels import quantize as k_q
    from zoi.backends.cuda.kernels import sparse_pool as k_sp

    T = arena.amax_region.shape[1]
    max_batch = arena.d_out.shape[0]
    nseq = min(max_batch, tb)
    hi = arena.hdr_ints
    hdr = arena.d_in[:hi]
    cu = arena.d_in[4 : 4 + max_batch + 1]
    ids = arena.d_in[hi : hi + tb]
    pos = arena.d_in[hi + tb : hi + 2 * tb]
    hd = next((L.op.attrs["head_dim"] for L in plan["launches"] if L.kind == "attention"), 32)
    acfg = k_attn.pick_config(tb, hd)
    steps, sp = [], spec
    rows = plan["amax_row"]
    amx = lambda n: arena.amax_region[rows[n]] if n in rows else None  # noqa: E731
    act = lambda n: arena.act(plan, n, tb)  # noqa: E731
    qinfo = plan["qinfo"]

    def qrow(qname):  # (a_scale fp32 [T], zero point int32 [T] or None) of an int8 copy
        zp = rows.get(qname + "#zp")
        return arena.amax_region[rows[qname]], (
            arena.amax_region[zp].view(torch.int32) if zp is not None else None
        )

    def qout(L):  # keyword arguments of a producer that also writes an int8 copy
        qn = L.extra.get("q")
        if not qn:
            return {}
        i, (sc, zp), p = qinfo[qn], qrow(qn), qinfo[qn]["prefix"]
        return dict(
            q_mode=i["mode"],
            q_static_amax=i["static_amax"],
            q_shift=w.get(f"{p}.act_shift") if p else None,
            q_mul=w.get(f"{p}.act_mul") if p else None,
            **{
                f"{'x' if L.kind == 'embed' else 'y'}q{k}": v
                for k, v in (("", act(qn)), ("_scale", sc), ("_zp", zp))
            },
        )

    for L in plan["launches"]:
        if L.kind == "embed":
            x = act(L.out)
            nz = len(plan["atomic"])
            # the first-row residual's row map (first_row.py), from the call's cu_seqlens
            frm = arena.first_row_map(plan, tb) if L.extra.get("first_row_map") else None
            steps.append(
                lambda x=x, L=L, nz=nz, qo=qout(L), frm=frm: k_embed.launch_embed(
                    ids,
                    pos,
                    w.get("embed.word_q", w.get("embed.word")),
                    w.get("embed.word_scale"),
                    w.get("embed.pos"),
                    w.get("embed.type0"),
                    w.get("embed.ln.w"),  # None: no embedding norm (decoder architectures)
                    w.get("embed.ln.b"),
                    x,
                    amx(L.out) if L.amax_out else None,
                    arena.amax_region,
                    tb,
                    L.n,
                    nz,
                    T,
                    L.op.attrs["eps"],
                    tiles=(hdr, cu, arena.tcum, acfg["BLOCK_M"], k_attn.block_b(nseq)),
                    pdl=pdl,
                    first_row_map=frm,
                    **qo,
                )
            )
        elif L.kind == "linear" and L.extra.get("rows") == "B":
            steps.append(_rows_linear_step(L, w, arena, plan, nseq, pdl))
        elif L.kind == "linear":
            p = L.extra["prefix"]
            a = act(L.extra["qname"] if L.prequant else L.ins[0])
            a_sc, a_zp = qrow(L.extra["qname"]) if L.prequant else (amx(L.ins[0]), None)
            if L.extra.get("splade"):  # the decoder with SPLADE's pooling in its epilogue
                steps.append(_splade_step(L, a, a_sc, a_zp, w, arena, plan, cu, hdr, tb, nseq, pdl))
                continue
            y, r = act(L.out), act(L.res) if L.res else None
            # the asymmetric copy's colsum
            gk = dict(colsum=w.get(f"{p}.colsum") if a_zp is not None else None)
            fr = None
            if L.extra.get("first_row"):  # q2 of the first rows in the K loop (first_row.py)
                # QUANT 4: the fp16 rows its int8 copy came from, and this linear's transform
                fr = (arena.first_row_map(plan, tb), act(L.ins[0]) if L.quant == 4 else None)
                if L.quant == 4:
                    gk.update(in_shift=w.get(f"{p}.act_shift"), in_mul=w.get(f"{p}.act_mul"))
            cfg = k_lin.pick_config(tb, L.n, L.k, L.mode.quantized, prequant=L.prequant)
            steps.append(
                lambda a=a, y=y, r=r, L=L, p=p, cfg=cfg, a_sc=a_sc, a_zp=a_zp, gk=gk, fr=fr: (
                    k_lin.launch_linear(
                        a,
                        a_sc,
                        w[f"{p}.w_q"] if L.mode.quantized else w[f"{p}.w"],
                        w[f"{p}.w_scale"] if L.mode.quantized else None,
                        w[f"{p}.b"],
                        r,
                        y,
                        amx(L.out) if L.amax_out else None,
                        tb,
                        L.n,
                        L.k,
                        quant=L.quant,  # the kernel's code, derived from mode + prequant
                        act=L.op.attrs.get("act", "none"),
                        static_amax=L.static_amax,
                        cfg=cfg,
                        pdl=pdl,
                        a_zp=a_zp,
                        **gk,
                        first_row=fr,
                    )
                )
            )
        elif L.kind == "quantize":
            i = qinfo[L.out]
            x, q, (sc, zp), p = act(L.ins[0]), act(L.out), qrow(L.out), i["prefix"]
            steps.append(
                lambda x=x, q=q, sc=sc, zp=zp, p=p, i=i: k_q.launch_quantize(
                    x,
                    w.get(f"{p}.act_shift") if p else None,
                    w.get(f"{p}.act_mul") if p else None,
                    q,
                    sc,
                    zp,
                    tb,
                    i["k"],
                    mode=i["mode"],
                    static_amax=i["static_amax"],
                    pdl=pdl,
                )
            )
        elif L.kind == "attention":
            # the extras (relative bias, RoPE, window, causal, grouped KV heads, q/k norm):
            # constexpr switches of the one kernel (kernels/attention.py); none: the plain kernel
            qkv, o = act(L.ins[0]), act(L.out)
            at, wn = L.op.attrs, L.op.weights
            ext = dict(
                bias=w[wn["rel_bias"]] if "rel_bias" in wn else None,
                cos=w[wn["rope_cos"]] if "rope_cos" in wn else None,
                sin=w[wn["rope_sin"]] if "rope_sin" in wn else None,
                window=int(at.get("window", 0)),
                kv_heads=int(at.get("kv_heads", 0)),
                causal=bool(at.get("causal", False)),
                q_norm=w[wn["q_norm"]] if "q_norm" in wn else None,
                k_norm=w[wn["k_norm"]] if "k_norm" in wn else None,
                qk_eps=float(at.get("qk_eps", 1e-6)),
            )
            steps.append(
                lambda qkv=qkv, o=o, L=L, at=at, ext=ext: k_attn.launch_attention(
                    qkv,
                    hdr,
                    cu,
                    arena.tcum,
                    o,
                    amx(L.out) if L.amax_out else None,
                    tb,
                    nseq,
                    at["heads"],
                    at["head_dim"],
                    at["scale"],
                    cfg=acfg,
                    pdl=pdl,
                    **ext,
                )
            )
        elif L.kind == "glu":  # whole rows: the int8 copy the plan asks for (qout), or amax
            x, y = act(L.ins[0]), act(L.out)
            steps.append(
                lambda x=x, y=y, L=L, qo=qout(L): k_glu.launch_glu(
                    x,
                    y,
                    amx(L.out) if L.amax_out else None,
                    tb,
                    L.n,
                    L.op.attrs["act"],
                    pdl=pdl,
                    **qo,
                )
            )
        elif L.kind == "sparse_pool":  # the unfused SPLADE pooling of stored logits
            x, p = act(L.ins[0]), arena.f32(plan, L.out, nseq, L.n)
            steps.append(
                lambda x=x, p=p, V=L.n: k_sp.launch_sparse_pool(x, cu, hdr, p, nseq, V, pdl=pdl)
            )
        elif L.kind == "add_layernorm":
            x, r, y = act(L.ins[0]), act(L.res) if L.res else None, act(L.out)
            steps.append(
                lambda x=x, r=r, y=y, L=L, qo=qout(L): k_ln.launch_add_layernorm(
                    x,
                    r,
                    w[f"{L.out}.ln.w"],
                    w[f"{L.out}.ln.b"],
                    y,
                    amx(L.out) if L.amax_out else None,
                    tb,
                    sp.hidden,
                    L.op.attrs["eps"],
                    pdl=pdl,
                    **qo,
                    **_norm_kw(L.op),
                )
            )
        elif L.kind == "pool":
            # "rows": the Dense modules' fp32 [B, N] output into the call's output rows; a pool
            # the Dense modules read writes fp32 rows of its own, never normalised
            mode = L.extra.get("mode", L.op.attrs.get("mode"))
            x = arena.f32(plan, L.ins[0], nseq, L.n) if mode == "rows" else act(L.ins[0])
            dense = bool(L.extra.get("out_bytes"))
            p = arena.f32(plan, L.out, nseq, L.n) if dense else arena.d_out
            steps.append(
                lambda x=x, p=p, L=L, mode=mode, dense=dense: k_pool.launch_pool(
                    x, cu, hdr, p, nseq, L.n, mode, pdl=pdl, normalize=not dense
                )
            )
    return steps


def _norm_kw(op) -> dict:
    """The kernel switches of an add_layernorm op: RMSNorm, the residual after the norm."""
    return dict(rms=bool(op.attrs.get("rms")), post=op.attrs.get("residual") == "post")


def _rows_linear_step(L, w, arena, plan, nseq, pdl):
    """A linear over the pooled rows (the Dense modules): fp32 [nseq, K] -> fp32 [nseq, N] in
    the arena, fp16 weights (plan._rows_linear); rows past the call's B are computed and unread."""
    from zoi.backends.cuda.kernels import linear as k_lin

    p = L.extra["prefix"]
    a, y = arena.f32(plan, L.ins[0], nseq, L.k), arena.f32(plan, L.out, nseq, L.n)
    cfg = k_lin.pick_config(nseq, L.n, L.k, False)
    return lambda: k_lin.launch_linear(
        a, None, w[f"{p}.w"], None, w[f"{p}.b"], None, y, None, nseq, L.n, L.k,
        quant=0, act=L.op.attrs.get("act", "none"), cfg=cfg, pdl=pdl,
    )  # fmt: skip


def _splade_step(L, a, a_sc, a_zp, w, arena, plan, cu, hdr, tb, nseq, pdl):
    """The launch of a decoder linear fused with SPLADE's pooling (kernels/sparse_pool.py):
    fp32 [nseq, V] into its arena buffer, no [T, V] logits."""
    from zoi.backends.cuda.kernels import sparse_pool as k_sp

    p, q = L.extra["prefix"], L.mode.quantized
    out = arena.f32(plan, L.out, nseq, L.n)
    return lambda: k_sp.launch_splade_linear(
        a,
        a_sc,
        w[f"{p}.w_q"] if q else w[f"{p}.w"],
        w[f"{p}.w_scale"] if q else None,
        w[f"{p}.b"],
        cu,
        hdr,
        out,
        tb,
        nseq,
        L.n,
        L.k,
        quant=L.quant,
        act=L.op.attrs.get("act", "none"),
        static_amax=L.static_amax,
        a_zp=a_zp,
        colsum=w.get(f"{p}.colsum") if a_zp is not None else None,
        pdl=pdl,
    )
