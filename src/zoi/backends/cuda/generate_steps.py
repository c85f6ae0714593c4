"""The launch lists of GenerateRuntime (a mixin): one layer's kernels over M rows, the decode
step of a batch bucket and its CUDA graph capture, and the packed prefill of new prompts.

They read the buffers and device state GenerateRuntime sets up (zoi.backends.cuda.generate);
kept apart so that each file reads as one concern: the IR's weights, buffers and staging there,
what runs on the device here.
"""

from __future__ import annotations

import gc

import numpy as np

from zoi.backends.cuda.kernels import attention_paged as ka
from zoi.backends.cuda.kernels import linear_decode as kl
from zoi.backends.cuda.kernels import sample as ks

# the fields of the pinned int32 staging block, in order
_FIELDS = ("ids", "pos", "slot", "ctx", "rix", "seed", "step", "topk", "temp", "topp", "fb")
PREFILL_BLOCK = 64  # prefill attention tile (query rows and key block)


class GenerateSteps:
    def _linear(self, *args, **kw):
        """kl.linear with the runtime's split-K workspace, precision and launch switches."""
        return kl.linear(
            *args, ws=self.ws, cnt=self.cnt, ieee=self.ieee, pdl=self.pdl,
            prefetch=self.prefetch, a8=self.a8, **kw,
        )  # fmt: skip

    def _sites(self) -> dict:
        sp = self.ir_spec
        Hd, I, HD = sp.hidden, sp.intermediate, sp.heads * sp.head_dim
        return {
            "qkv": (self.qkv_n, Hd, False),
            "o": (Hd, HD, False),
            "gu": (I, Hd, True),
            "down": (Hd, I, False),
            "lm": (sp.vocab_size, Hd, False),
        }

    def _field(self, name: str, B: int, base: int = 0):
        i = _FIELDS.index(name)
        v = self.d_stage[base + i * self.max_batch : base + i * self.max_batch + B]
        return v.view(self.torch.float32) if name in ("temp", "topp") else v

    # ------------------------------------------------------------------ forward
    def _layer_calls(self, L, l, x_rows, M, cfg, attn, rope_in_attn=False):
        """The launches of one layer over M rows (decode bucket or packed prefill);
        rope_in_attn: no rope_kv launch, attn(qkv, kc, vc, att, L) ropes and writes the cache."""
        sp = self.ir_spec
        h, qkv, att, mlp = self.h[:M], self.qkv[:M], self.att[:M], self.mlp[:M]
        Hd, I, HD = sp.hidden, sp.intermediate, sp.heads * sp.head_dim
        eps = sp.eps
        kc, vc = self.kc[l], self.vc[l]
        pos, slot = x_rows
        rope = (
            []
            if rope_in_attn
            else [
                lambda: ka.rope_kv(
                    qkv,
                    pos,
                    slot,
                    self.cos,
                    self.sin,
                    kc,
                    vc,
                    M,
                    sp.heads,
                    sp.num_kv_heads,
                    sp.head_dim,
                    self.block_size,
                    L["qn"],
                    L["kn"],
                    eps,
                    pdl=self.pdl,
                ),
            ]
        )
        calls = [
            lambda: self._linear(
                h,
                L["qkv"][0],
                qkv,
                M,
                self.qkv_n,
                Hd,
                cfg("qkv"),
                scale=L["qkv"][1],
                bias=L["qkv_b"],
                rms_eps=eps,
            ),
            lambda: attn(qkv, kc, vc, att, L),
            lambda: self._linear(
                att,
                L["o"][0],
                h,
                M,
                Hd,
                HD,
                cfg("o"),
                scale=L["o"][1],
                bias=L["o_b"],
                res=h,
            ),
            lambda: self._linear(
                h,
                L["gu"][0],
                mlp,
                M,
                I,
                Hd,
                cfg("gu"),
                scale=L["gu"][1],
                rms_eps=eps,
                swiglu=True,
            ),
            lambda: self._linear(
                mlp,
                L["down"][0],
                h,
                M,
                Hd,
                I,
                cfg("down"),
                scale=L["down"][1],
                res=h,
            ),
        ]
        return calls[:1] + rope + calls[1:]

    def _decode_steps(self, B: int) -> list:
        sp = self.ir_spec
        f = {n: self._field(n, B) for n in _FIELDS}
        splits = self.cfg[B, "splits"]

        def cfg(site):
            return self.cfg[B, site]

        def attn(qkv, kc, vc, att, L):
            rope = None
            if self.fuse_rope:
                rope = (f["pos"], f["slot"], self.cos, self.sin, L["qn"], L["kn"])
                rope += (sp.eps,)
            ka.decode_attention(
                qkv,
                kc,
                vc,
                self.tab,
                f["rix"],
                f["ctx"],
                att,
                B,
                sp.heads,
                sp.num_kv_heads,
                sp.head_dim,
                self.block_size,
                splits,
                self.aws,
                self.acnt,
                self.ieee,
                pdl=self.pdl,
                min_per=self.attn_min_per,
                rope=rope,
            )

        steps = [
            lambda: ks.embed(
                f["ids"], self.emb, self.h[:B], B, pdl=self.pdl, fb=f["fb"], prev=self.tok
            )
        ]
        for l, L in enumerate(self.layers):
            steps += self._layer_calls(
                L, l, (f["pos"], f["slot"]), B, cfg, attn, rope_in_attn=self.fuse_rope
            )
        steps.append(
            lambda: self._linear(
                self.h[:B],
                self.lm[0],
                self.logits[:B],
                B,
                sp.vocab_size,
                sp.hidden,
                cfg("lm"),
                scale=self.lm[1],
                rms_eps=sp.eps,
            )
        )
        steps.append(
            lambda: ks.sample(
                self.logits[:B],
                sp.vocab_size,
                B,
                f["temp"],
                f["topk"],
                f["topp"],
                f["seed"],
                f["step"],
                self.tok[:B],
                pdl=self.pdl,
                ws=self.sws,
            )
        )
        return steps

    def _capture(self, B: int):
        if not self.use_graphs:
            return None
        torch, drv, cu = self.torch, self.drv, self.cu
        self._stage_pad(B, 0)
        self._h2d(self.n_dec)
        with torch.cuda.stream(self.tstream):
            for s in self._steps[B]:  # compile + warm up outside the capture
                s()
        drv.check(cu.cuStreamSynchronize(self.stream))
        gc.collect()
        was = gc.isenabled()
        gc.disable()
        drv.begin_capture(self.stream)
        try:
            with torch.cuda.stream(self.tstream):
                for s in self._steps[B]:
                    s()
        finally:
            graph = drv.end_capture(self.stream)
            if was:
                gc.enable()
        return graph

    # ------------------------------------------------------------------ per step

    def _prefill(self, group, rows, counts, ids, offs, samp, seeds, out):
        sp, PT, MB, h = self.ir_spec, self.max_prefill, self.max_batch, self.h_stage
        idx = np.asarray(group)
        lens = counts[idx].astype(np.int64)
        T, n = int(lens.sum()), len(group)
        cu_ = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
        tok = np.concatenate([ids[offs[i] : offs[i] + counts[i]] for i in group])
        pos = np.concatenate([np.arange(L) for L in lens])
        slot = np.concatenate([self._slots(int(rows[i]), np.arange(counts[i])) for i in group])
        pb = 16 if self.eager else PREFILL_BLOCK
        tiles = ka.prefill_tiles(cu_, pb)
        nt = tiles.shape[1]
        b0 = self.n_dec
        h[b0 : b0 + T] = tok
        h[b0 + PT : b0 + PT + T] = pos
        h[b0 + 2 * PT : b0 + 2 * PT + T] = slot
        for j in range(3):
            h[b0 + (3 + j) * PT : b0 + (3 + j) * PT + nt] = tiles[j]
        sb = b0 + 6 * PT  # last rows, then the sampling fields at their decode offsets - 5 MB
        h[sb : sb + n] = cu_[1:] - 1
        base = sb + MB - _FIELDS.index("seed") * MB
        self._stage_sampling(base, idx, samp, seeds)
        self._h2d(self.n_pre, b0)
        d = self.d_stage
        d_ids, d_pos, d_slot = (
            d[b0 : b0 + T],
            d[b0 + PT : b0 + PT + T],
            d[b0 + 2 * PT : b0 + 2 * PT + T],
        )
        d_tiles = d[b0 + 3 * PT : b0 + 6 * PT].view(3, PT)
        d_rows = d[sb : sb + n]
        fld = {k: self._field(k, n, base) for k in ("seed", "step", "topk", "temp", "topp")}
        M = T

        def cfg(site):
            n_, k_, sw = self._sites()[site]
            if (M, site) in self.cfg:
                return self.cfg[M, site]
            return kl.pick_config(M, n_, k_, self.sm, self.eager, self.wbytes, sw, site)

        def attn(qkv, kc, vc, att, L):
            ka.prefill_attention(
                qkv,
                d_tiles,
                nt,
                att,
                sp.heads,
                sp.num_kv_heads,
                sp.head_dim,
                pb,
                pb,
                self.ieee,
                pdl=self.pdl,
            )

        steps = [lambda: ks.embed(d_ids, self.emb, self.h[:T], T, pdl=self.pdl)]
        for l, L in enumerate(self.layers):
            steps += self._layer_calls(L, l, (d_pos, d_slot), T, cfg, attn)
        lm_cfg = kl.pick_config(
            n, sp.vocab_size, sp.hidden, self.sm, self.eager, self.wbytes, site="lm"
        )
        steps.append(
            lambda: self._linear(
                self.h[:T],
                self.lm[0],
                self.logits[:n],
                n,
                sp.vocab_size,
                sp.hidden,
                lm_cfg,
                scale=self.lm[1],
                rows=d_rows,
                rms_eps=sp.eps,
            )
        )
        steps.append(
            lambda: ks.sample(
                self.logits[:n],
                sp.vocab_size,
                n,
                fld["temp"],
                fld["topk"],
                fld["topp"],
                fld["seed"],
                fld["step"],
                self.tok_pre[:n],
                pdl=self.pdl,
                ws=self.sws,
            )
        )
        self._eager(steps)
        out[idx] = self._tokens(n, self.tok_pre)

    # ------------------------------------------------------------------ info
