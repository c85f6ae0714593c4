"""CudaDecoderBackend: an api.DecoderBackend on the GPU built from the Triton kernels of
this package, on zoi.decoder.paged.PagedBackend's bookkeeping (admission, block tables, finishing).

Construction (torch and triton are tools here, as in the encoder's CUDA backend): the weights are
packed once (q|k|v and gate|up fused, the RMSNorm gains folded into the following linear's
columns, INT8 per output channel ("w8", "int8") / FP16 / FP32), the static paged KV pool
[layers, num_blocks + 1, KVH, block_size, D] (block ``num_blocks``: the trash block padded decode
rows write to) and every activation buffer are allocated, and one decode step per batch bucket
(1, 2, 4, 8, 16, 32 up to max_batch) is warmed up and captured into a CUDA graph with the driver
API on our own stream (cuStreamBeginCapture / cuGraphInstantiate, zoi.backends.cuda.driver).

Per step (``_run``): the new prompts are prefilled packed, without padding (eager launches on our
stream, lm_head over the last token of each prompt only, then the sampler); the running sequences
take one decode step: numpy fills one pinned int32 staging block (ids, positions, cache slots,
context lengths, block-table rows, sampling params), one cuMemcpyHtoDAsync, cuGraphLaunch of the
bucket, cuMemcpyDtoHAsync of the tokens, cuStreamSynchronize. Block-table rows that changed since
the last step are copied to the device table first. Nothing is allocated on the device while
generating.

Seam (gap, docs/DECODERS_GPU.md): torch allocates the device buffers and gives Triton its stream
(as in zoi.backends.cuda); the per-step path itself is the CUDA driver API only.

``interpret=True`` (or TRITON_INTERPRET=1 without a GPU) runs the same launch lists eagerly on torch
CPU tensors through the Triton interpreter: the CI test of everything but the graphs.
"""

from __future__ import annotations

import os

import numpy as np

from zoi.decoder.api import PRECISION_ALIASES as ALIASES
from zoi.decoder.api import DecoderSpec
from zoi.decoder.cuda import kernels_attn as ka
from zoi.decoder.cuda import kernels_linear as kl
from zoi.decoder.cuda import kernels_sample as ks
from zoi.decoder.cuda.launches import _FIELDS, LaunchLists
from zoi.decoder.cuda.rope import cos_sin
from zoi.decoder.memory import Part, check_fits
from zoi.decoder.paged import PagedBackend, kv_block_bytes
from zoi.errors import BackendUnavailableError, InputError
from zoi.numerics.primitives import quantize_weight

BUCKETS = (1, 2, 4, 8, 16, 32)
# zoi's precision words (zoi.decoder.compile.PRECISIONS): "w8" weight-only INT8, "int8" W8A8
# (INT8 weights; x INT8 per (row, K tile) in the dot / mma kernels, the gemv for <= 4 rows stays
# weight-only), "fp16", "fp32"; "w8a8" is accepted as "int8"
PRECISIONS = ("w8", "int8", "fp16", "fp32")


class CudaDecoderBackend(LaunchLists, PagedBackend):
    name = "cuda"
    kv_on_host = False  # the pool is on the GPU: _check_device_memory counts it there

    def __init__(
        self,
        spec: DecoderSpec,
        weights: dict,
        precision: str = "w8",
        num_blocks: int | None = None,
        block_size: int = 16,
        max_batch: int = 32,
        max_seq_len: int | None = None,
        max_prefill_tokens: int | None = None,
        interpret: bool | None = None,
        graphs: bool = True,
        pdl: bool = False,
        prefetch: bool = False,
        pipeline: bool = True,
        fuse_rope: bool = True,
        attn_min_per: int = 1,
    ):
        """precision: "w8" (the default: weight-only INT8, the fastest here), "int8" (W8A8; slower
        at 32 rows: x32 graph 1215 vs 1110 us on the Qwen2.5-0.5B shape), "fp16" or "fp32".
        pdl: programmatic dependent launch between the kernels (zoi.decoder.cuda.pdl; sm_90+);
        prefetch: with pdl, each linear brings its W slice into L2 before it waits for the
        previous kernel; pipeline: launch the next decode step before the host has read this
        one's tokens (``step``); fuse_rope: decode steps rope q and the new k (and write k / v
        into the cache) in the attention kernel instead of a rope_kv launch per layer (on: Llama
        b1 0.700 -> 0.681 ms, Qwen x32 23.5k -> 25.7k tokens/s,
        bench/results/gpu_decode_ab_fuse_rope_*_20261202T2055Z.json); attn_min_per: the fewest
        KV blocks one slice of split decode attention takes (2 equal, 4 lost 2%: 1).
        pdl / prefetch / pipeline: off / off / on by default, as measured on the H200
        (lab/gpu/decode_ab.py, bench/results/gpu_decode_ab_20261202T1530Z.json): pipeline took
        Llama-3.2-1B INT8 b1 from 0.995 to 0.788 ms per token and Qwen2.5-0.5B x32 from 20.7k to
        22.6k tokens/s; pdl gained 2% at b1 (graph 780 -> 762 us) and lost 5% at 32 streams
        (1181 -> 1240 us: the kernels, not the gaps, fill that step); prefetch lost at both."""
        if spec.arch not in ("llama", "qwen2", "qwen3"):
            raise InputError(f"the GPU decoder runs llama / qwen2 / qwen3, not {spec.arch!r}")
        if spec.hidden_act != "silu":
            raise InputError(f"hidden_act {spec.hidden_act!r}: the GPU decoder runs SwiGLU (silu)")
        precision = ALIASES.get(precision, precision)
        if precision not in PRECISIONS:
            raise InputError(
                f"precision {precision!r}: use one of {PRECISIONS} ('w8': weight-only INT8, "
                "'int8': W8A8, 'w8a8' is accepted as 'int8')"
            )
        if block_size not in (16, 32, 64):
            raise InputError(f"block_size {block_size}: the GPU decoder takes 16, 32 or 64")
        if max_batch > BUCKETS[-1]:
            raise InputError(
                f"max_batch {max_batch} is over {BUCKETS[-1]} (the largest decode bucket)"
            )
        D = spec.head_dim
        if D % 2 or spec.num_heads % spec.num_kv_heads:
            raise InputError(
                f"head_dim {D} (odd) or GQA {spec.num_heads}/"
                f"{spec.num_kv_heads} not supported on the GPU decoder"
            )
        max_seq_len = int(max_seq_len or min(spec.max_position_embeddings, 4096))
        num_blocks = int(num_blocks or max_batch * -(-max_seq_len // block_size))
        super().__init__(spec, num_blocks, block_size, max_batch, max_seq_len)
        self.precision = precision
        self.ieee = precision == "fp32"
        self.wbytes = {"w8": 1, "int8": 1, "fp16": 2, "fp32": 4}[precision]
        self.a8 = precision == "int8"  # INT8 x too, in the dot / mma kernels (not the gemv)
        self.max_prefill = int(
            max_prefill_tokens or max(max_seq_len, min(2048, max_batch * max_seq_len))
        )
        self.buckets = [b for b in BUCKETS if b < max_batch] + [max_batch]
        self.buckets = sorted(set(self.buckets))
        self._init_device(interpret)
        if pdl and (self.eager or self.capability < (9, 0)):
            raise BackendUnavailableError(
                "pdl=True needs an sm_90+ GPU (programmatic dependent launch); "
                f"this is {self.device_name}: leave pdl off"
            )
        self.pdl = bool(pdl)
        self.prefetch = bool(prefetch) and self.pdl
        self.pipeline = bool(pipeline)
        self.fuse_rope = bool(fuse_rope)
        self.attn_min_per = max(1, int(attn_min_per))
        self._inflight: dict | None = None
        self.n_ahead = 0  # decode steps launched ahead (pipeline)
        self.use_graphs = bool(graphs) and not self.eager
        self._upload(weights)
        self._alloc()
        if not self.eager:  # the buffers were filled on torch's stream; ours does not wait for it
            self.torch.cuda.synchronize()
        self._graphs: dict[int, tuple] = {}
        self._steps = {b: self._decode_steps(b) for b in self.buckets}
        for b in self.buckets:
            self._graphs[b] = self._capture(b)

    # ------------------------------------------------------------------ device
    def _init_device(self, interpret):
        try:
            import torch
        except ImportError as e:  # pragma: no cover - depends on the machine
            raise BackendUnavailableError(
                f"the GPU decoder needs torch and triton at compile time: {e}"
            ) from e
        self.torch = torch
        env_interp = os.environ.get("TRITON_INTERPRET") == "1"
        self.eager = (
            bool(interpret)
            if interpret is not None
            else (env_interp and not torch.cuda.is_available())
        )
        if self.eager:
            if not env_interp:
                raise BackendUnavailableError(
                    "interpret=True needs TRITON_INTERPRET=1 set before triton is imported"
                )
            self.dev, self.sm, self.device_name = "cpu", 8, "triton interpreter (CPU)"
            self.capability = (0, 0)
            return
        if env_interp:
            raise BackendUnavailableError("TRITON_INTERPRET=1 is set: unset it to run on the GPU")
        from zoi.backends.cuda import driver as drv

        drv.require()
        if not torch.cuda.is_available():
            raise BackendUnavailableError(
                "device='cuda': torch sees no CUDA device (driver missing or no GPU)"
            )
        self.drv, self.cu = drv, drv.cu
        torch.cuda.init()
        torch.empty(1, device="cuda")
        self.cu_dev, self.ctx = drv.primary_context(torch.cuda.current_device())
        self.capability = drv.capability(self.cu_dev)
        if self.capability < (8, 0):
            raise BackendUnavailableError("the GPU decoder needs compute capability >= 8.0")
        self.sm = drv.sm_count(self.cu_dev)
        self.device_name = drv.device_name(self.cu_dev)
        self.dev = "cuda"
        self.stream = drv.new_stream()
        self.tstream = torch.cuda.ExternalStream(int(self.stream))

    def _t(self, a, dtype=None):
        t = self.torch.from_numpy(np.array(a, copy=True, order="C"))
        return (t.to(dtype) if dtype is not None else t).to(self.dev)

    def _empty(self, shape, dtype, fill=0):
        t = self.torch.empty(shape, dtype=dtype, device=self.dev)
        t.fill_(fill)
        return t

    # ------------------------------------------------------------------ weights
    def _lin(self, w: np.ndarray) -> tuple:
        torch = self.torch
        if self.precision in ("w8", "int8"):
            q, s = quantize_weight(w)  # the quantiser of every zoi INT8 weight
            return self._t(q), self._t(s)
        return self._t(w, torch.float32 if self.ieee else torch.float16), None

    def _upload(self, W: dict):
        sp, torch = self.spec, self.torch
        self.act = torch.float32 if self.ieee else torch.float16

        def g(name):
            if name not in W:
                raise InputError(f"weights: {name} is missing")
            return np.asarray(W[name], np.float32)

        self.layers = []
        for i in range(sp.num_layers):
            p = f"model.layers.{i}."
            a, m = p + "self_attn.", p + "mlp."
            g1, g2 = g(p + "input_layernorm.weight"), g(p + "post_attention_layernorm.weight")
            qkv = np.concatenate(
                [g(a + "q_proj.weight"), g(a + "k_proj.weight"), g(a + "v_proj.weight")]
            )
            gu = np.concatenate([g(m + "gate_proj.weight"), g(m + "up_proj.weight")])
            L = {
                "qkv": self._lin(qkv * g1[None, :]),
                "o": self._lin(g(a + "o_proj.weight")),
                "gu": self._lin(gu * g2[None, :]),
                "down": self._lin(g(m + "down_proj.weight")),
                "qkv_b": None,
                "o_b": None,
                "qn": None,
                "kn": None,
            }
            if sp.attention_bias or (a + "q_proj.bias") in W:
                L["qkv_b"] = self._t(
                    np.concatenate(
                        [g(a + "q_proj.bias"), g(a + "k_proj.bias"), g(a + "v_proj.bias")]
                    )
                )
            if (a + "o_proj.bias") in W:
                L["o_b"] = self._t(g(a + "o_proj.bias"))
            if sp.qk_norm:
                L["qn"], L["kn"] = self._t(g(a + "q_norm.weight")), self._t(g(a + "k_norm.weight"))
            self.layers.append(L)
        self.lm = self._lin(g("lm_head.weight") * g("model.norm.weight")[None, :])
        self.emb = self._t(g("model.embed_tokens.weight"), self.act)
        c, s = cos_sin(sp, self.max_seq_len)
        self.cos, self.sin = self._t(c), self._t(s)

    # ------------------------------------------------------------------ buffers
    def _check_device_memory(self) -> None:
        """The pool and the step buffers _alloc makes must fit the GPU's free memory (the
        weights are there already): named options, not a torch OutOfMemoryError part-way."""
        if self.eager:
            return
        sp = self.spec
        e = self.act.itemsize
        T = max(self.max_batch, self.max_prefill)
        per_block = kv_block_bytes(sp, self.block_size, e)
        act = T * (4 * sp.hidden_size + e * (self.qkv_n + sp.num_heads * sp.head_dim))
        act += T * e * sp.intermediate_size
        free, _ = self.torch.cuda.mem_get_info()
        check_fits(
            [
                Part(
                    f"KV pool (kv_blocks={self.num_blocks} x block_size={self.block_size} "
                    f"tokens, {per_block} bytes a block)",
                    "kv_blocks",
                    (self.num_blocks + 1) * per_block,
                ),
                Part(f"prefill buffers (max_tokens={self.max_prefill} tokens)", "max_tokens", act),
                Part(
                    f"logits (max_batch={self.max_batch} x vocab {sp.vocab_size})",
                    "max_batch",
                    4 * self.max_batch * sp.vocab_size,
                ),
            ],
            "the GPU decoder's KV pool and buffers",
            (free, "free"),
            "GPU memory",
            self.device_name,
        )

    def _alloc(self):
        sp, torch = self.spec, self.torch
        H, KVH, D, Hd, V = sp.num_heads, sp.num_kv_heads, sp.head_dim, sp.hidden_size, sp.vocab_size
        I, MB, PT = sp.intermediate_size, self.max_batch, self.max_prefill
        self.qkv_n = (H + 2 * KVH) * D
        self._check_device_memory()
        self.trash_slot = self.num_blocks * self.block_size
        shape = (sp.num_layers, self.num_blocks + 1, KVH, self.block_size, D)
        self.kc, self.vc = self._empty(shape, self.act), self._empty(shape, self.act)
        T = max(MB, PT)
        self.h = self._empty((T, Hd), torch.float32)
        self.qkv = self._empty((T, self.qkv_n), self.act)
        self.att = self._empty((T, H * D), self.act)
        self.mlp = self._empty((T, I), self.act)
        self.logits = self._empty((MB, V), torch.float32)
        self.tok = self._empty((MB,), torch.int32)  # the decode graphs' tokens (fed back)
        self.tok_pre = self._empty((MB,), torch.int32)  # the prefill's first tokens
        S, _ = ks.sample_splits(V)  # the sampler's split argmax: S programs per row
        self.sws = (
            self._empty((MB * S,), torch.float32),
            self._empty((MB * S,), torch.int32),
            self._empty((MB,), torch.int32),
        )
        # block tables: row max_batch is the trash row (padded decode entries)
        self.tab_host = np.full((MB + 1, self.max_blocks_per_seq), self.num_blocks, np.int32)
        self._dirty: set[int] = set()  # block-table rows changed since the last upload
        self.tab = self._t(self.tab_host)
        # split-K / split-attention workspaces, sized for the largest site of any bucket (M <= 32)
        ws = cnt = aws = acnt = 1
        self.cfg = {}
        for b in sorted(set(self.buckets) | set(BUCKETS[: BUCKETS.index(32) + 1])):
            for site, (n, k, sw) in self._sites().items():
                c = kl.pick_config(b, n, k, self.sm, self.eager, self.wbytes, sw, site)
                self.cfg[b, site] = c
                ws = max(ws, kl.workspace_floats(b, n, c, sw))
                cnt = max(cnt, kl.counters(b, n, c))
            splits = (
                ka.decode_splits(b, KVH, self.max_blocks_per_seq, self.sm) if not self.eager else 2
            )
            self.cfg[b, "splits"] = splits
            aws = max(aws, ka.decode_ws_floats(b, KVH, H // KVH, D, splits))
            acnt = max(acnt, b * KVH)
        self.ws, self.cnt = self._empty((ws,), torch.float32), self._empty((cnt,), torch.int32)
        self.aws, self.acnt = self._empty((aws,), torch.float32), self._empty((acnt,), torch.int32)
        # staging: decode fields at fixed offsets (MB each); prefill: ids|pos|slot (PT each),
        # tiles (3 PT), last rows + sampling fields (MB each)
        self.n_dec = len(_FIELDS) * MB
        self.n_pre = 6 * PT + 6 * MB
        self.d_stage = self._empty((self.n_dec + self.n_pre,), torch.int32)
        if self.eager:
            self.h_stage = np.zeros(self.n_dec + self.n_pre, np.int32)
            self.h_tok = np.zeros(MB, np.int32)
            self.h_ahead = [np.zeros(self.n_dec, np.int32) for _ in range(2)]
        else:
            drv = self.drv
            self.p_stage = drv.Pinned((self.n_dec + self.n_pre) * 4)
            self.h_stage = self.p_stage.view(np.int32, 0, self.n_dec + self.n_pre)
            self.p_tok = drv.Pinned(MB * 4)
            self.h_tok = self.p_tok.view(np.int32, 0, MB)
            self.p_tab = drv.Pinned(self.tab_host.nbytes)
            self.h_tab = self.p_tab.view(np.int32, 0, self.tab_host.size).reshape(
                self.tab_host.shape
            )
            self.h_tab[:] = self.tab_host
            # the steps launched ahead (step): two staging blocks and token buffers, used in turn
            self.p_ahead = [drv.Pinned((self.n_dec + MB) * 4) for _ in range(2)]
            self.h_ahead = [p.view(np.int32, 0, self.n_dec) for p in self.p_ahead]
            self.ev_ahead = [drv.new_event() for _ in range(2)]
        self._parity = 0
        self.h_stage[:] = 0

    def _h2d(self, n_ints: int, offset: int = 0):
        if self.eager:
            self.d_stage[offset : offset + n_ints] = self.torch.from_numpy(
                self.h_stage[offset : offset + n_ints].copy()
            )
            return
        dst = self.cu.CUdeviceptr(self.d_stage.data_ptr() + offset * 4)
        self.drv.check(
            self.cu.cuMemcpyHtoDAsync(dst, self.p_stage.ptr + offset * 4, n_ints * 4, self.stream)
        )

    def _sync_tables(self):
        """Copy the block-table rows add() / _release() changed to the device table."""
        if not self._dirty:
            return
        dirty = sorted(self._dirty)
        self._dirty.clear()
        bt = self.block_tables
        if self.eager:
            self.tab[: self.max_batch] = self.torch.from_numpy(bt.copy())
            return
        self.h_tab[dirty] = bt[dirty]
        row = self.tab_host.shape[1] * 4
        for r in dirty:
            dst = self.cu.CUdeviceptr(self.tab.data_ptr() + int(r) * row)
            self.drv.check(
                self.cu.cuMemcpyHtoDAsync(dst, self.p_tab.ptr + int(r) * row, row, self.stream)
            )

    def _release(self, s) -> None:
        super()._release(s)
        self._dirty.add(int(s.row))

    def _stage_pad(self, B: int, n: int, base: int = 0, h=None):
        """Padding entries n..B of the decode fields: token 0 at position 0 in the trash block."""
        MB = self.max_batch
        h = self.h_stage if h is None else h
        for name, val in (
            ("ids", 0),
            ("pos", 0),
            ("slot", self.trash_slot),
            ("ctx", 1),
            ("rix", MB),
            ("seed", 0),
            ("step", 0),
            ("topk", 0),
            ("temp", 0),
            ("topp", 0),
            ("fb", -1),
        ):
            i = _FIELDS.index(name)
            h[base + i * MB + n : base + i * MB + B] = val

    def _stage_sampling(self, base: int, idx, samp, seeds, h=None):
        MB = self.max_batch
        h = self.h_stage if h is None else h
        n = len(idx)

        def put(name, arr):
            i = _FIELDS.index(name)
            h[base + i * MB : base + i * MB + n] = arr

        put("seed", (seeds[idx] ^ (seeds[idx] >> np.uint64(32))).astype(np.uint32).view(np.int32))
        put("step", samp[idx, 3].astype(np.int32))
        put("topk", samp[idx, 1].astype(np.int32))
        put("temp", samp[idx, 0].astype(np.float32).view(np.int32))
        put("topp", samp[idx, 2].astype(np.float32).view(np.int32))

    def _run(self, rows, starts, counts, ids, samp, seeds) -> np.ndarray:
        out = np.empty(len(rows), np.int32)
        offs = np.concatenate([[0], np.cumsum(counts)])
        pre = [i for i in range(len(rows)) if starts[i] == 0]
        dec = [i for i in range(len(rows)) if starts[i] > 0]
        if not self.eager:
            self.drv.check(self.cu.cuCtxSetCurrent(self.ctx))
        self._sync_tables()
        group, tokens = [], 0
        for i in pre:  # packed prefill, in groups of max_prefill tokens
            if group and tokens + counts[i] > self.max_prefill:
                self._prefill(group, rows, counts, ids, offs, samp, seeds, out)
                group, tokens = [], 0
            group.append(i)
            tokens += int(counts[i])
        if group:
            self._prefill(group, rows, counts, ids, offs, samp, seeds, out)
        if dec:
            self._decode(dec, rows, starts, ids, offs, samp, seeds, out)
        return out

    def add(self, seq_id, prompt_ids, params) -> None:
        n = int(np.asarray(prompt_ids).size)
        if n > self.max_prefill:
            raise InputError(
                f"prompt of {n} tokens is over this backend's max_prefill_tokens "
                f"({self.max_prefill}); compile with a larger max_prefill_tokens"
            )
        super().add(seq_id, prompt_ids, params)
        self._dirty.add(int(self._seqs[seq_id].row))

    def _slots(self, row, pos: np.ndarray) -> np.ndarray:
        """Pool slots of positions pos of block-table row(s) row (an int, or an array beside pos)."""
        bs = self.block_size
        return self.block_tables[row, pos // bs] * bs + pos % bs

    def _decode(self, dec, rows, starts, ids, offs, samp, seeds, out):
        idx = np.asarray(dec)
        pos = starts[idx].astype(np.int64)
        fb = np.full(len(idx), -1, np.int32)
        B = self._stage_decode(self.h_stage, ids[offs[idx]], pos, rows[idx], fb, idx, samp, seeds)
        self._h2d(self.n_dec)
        self._launch(B)
        out[idx] = self._tokens(len(idx))

    def _stage_decode(self, h, ids, pos, rows, fb, idx, samp, seeds) -> int:
        """Fill the decode fields of staging block h for n = len(pos) rows; returns the bucket."""
        n = len(pos)
        B = next(b for b in self.buckets if b >= n)
        MB = self.max_batch
        # one gather for all rows, not a call per row
        slot = self._slots(rows, pos).astype(np.int32)
        for name, arr in (
            ("ids", ids),
            ("pos", pos),
            ("slot", slot),
            ("ctx", pos + 1),
            ("rix", rows),
            ("fb", fb),
        ):
            i = _FIELDS.index(name)
            h[i * MB : i * MB + n] = arr
        self._stage_sampling(0, idx, samp, seeds, h)
        self._stage_pad(B, n, 0, h)
        return B

    def _launch(self, B: int):
        if self.eager or not self.use_graphs:
            self._eager(self._steps[B])
        else:
            self.drv.check(self.cu.cuGraphLaunch(self._graphs[B][1], self.stream))

    # ------------------------------------------------------------------ pipelined steps
    def step(self):
        """One step, as PagedBackend.step; with ``pipeline`` the next decode step of the sequences
        that can continue is launched before this one's tokens are read (each decode row's id
        comes from the previous graph's token buffer on the device: the ``fb`` field), so the
        host's bookkeeping of step t overlaps the GPU's step t + 1. A row launched ahead for a
        sequence that then stops (eos, stop id, cancel) is dropped at the next call; its K/V
        write lands in blocks it still held, before any later launch (one stream)."""
        if not self.pipeline:
            return super().step()
        infl, self._inflight = self._inflight, None
        if not self._seqs:
            if infl is not None:
                self._wait(infl)
            return []
        cont = []  # (row in the step launched ahead, sequence) still running
        if infl is not None:
            cont = [(i, s) for i, s in enumerate(infl["seqs"]) if self._seqs.get(s.seq_id) is s]
        held = {id(s) for _, s in cont}
        rest = [s for s in self._seqs.values() if id(s) not in held]
        events = []
        if infl is not None and (not cont or any(s.cached > 0 for s in rest)):
            # a decode row the step launched ahead does not cover (or none left): book it first
            toks = self._wait(infl)
            events += self._advance([s for _, s in cont], toks[[i for i, _ in cont]])
            infl, cont = None, []
            rest = list(self._seqs.values())
        if rest:  # new prompts (and, after the above, every decode row)
            events += self._advance(rest, self._run(*self._inputs(rest)))
        nxt = [s for _, s in cont if not self._ends_by_length(s)]
        nxt += [s for s in rest if self._seqs.get(s.seq_id) is s]
        if nxt:
            self._inflight = self._launch_ahead(nxt, {id(s): i for i, s in cont})
        if cont:
            toks = self._wait(infl)
            events += self._advance([s for _, s in cont], toks[[i for i, _ in cont]])
        return events

    def _launch_ahead(self, seqs, fb_rows: dict) -> dict:
        """Stage and launch the decode step of seqs; a sequence in fb_rows (id -> row of the step
        in flight) is one token further than its host state says and takes that row's token."""
        n = len(seqs)
        self.n_ahead += 1
        ahead = np.fromiter((id(s) in fb_rows for s in seqs), bool, n)
        fb = np.fromiter((fb_rows.get(id(s), -1) for s in seqs), np.int32, n)
        # every row is a decode row (one pending token): ids of rows launched ahead are stale but
        # unused (fb takes the token on the device)
        rows, starts, _, ids, samp, seeds = self._inputs(seqs)
        pos = starts.astype(np.int64) + ahead
        samp[:, 3] += ahead  # the draw index of the token after the one in flight
        p = self._parity
        self._parity ^= 1
        h = self.h_ahead[p]
        B = self._stage_decode(h, ids, pos, rows, fb, np.arange(n), samp, seeds)
        if self.eager:
            self.d_stage[: self.n_dec] = self.torch.from_numpy(h.copy())
            self._launch(B)
            return {"seqs": seqs, "toks": self.tok[:n].numpy().copy()}
        cu, chk, buf = self.cu, self.drv.check, self.p_ahead[p]
        chk(cu.cuCtxSetCurrent(self.ctx))
        dst = cu.CUdeviceptr(self.d_stage.data_ptr())
        chk(cu.cuMemcpyHtoDAsync(dst, buf.ptr, self.n_dec * 4, self.stream))
        self._launch(B)
        src = cu.CUdeviceptr(self.tok.data_ptr())
        chk(cu.cuMemcpyDtoHAsync(buf.ptr + self.n_dec * 4, src, n * 4, self.stream))
        chk(cu.cuEventRecord(self.ev_ahead[p], self.stream))
        return {"seqs": seqs, "p": p, "n": n}

    def _wait(self, infl: dict) -> np.ndarray:
        """The tokens of a step launched ahead (waits for it)."""
        if "toks" in infl:
            return infl["toks"]
        p, n = infl["p"], infl["n"]
        self.drv.check(self.cu.cuEventSynchronize(self.ev_ahead[p]))
        return self.p_ahead[p].view(np.int32, self.n_dec * 4, n).copy()

    def drain(self) -> None:
        """Wait for and drop a step launched ahead: nothing of it was booked on the host, so the
        next step() recomputes the same rows (their K/V writes land on the same slots)."""
        infl, self._inflight = self._inflight, None
        if infl is not None:
            self._wait(infl)

    def _eager(self, steps):
        if self.eager:
            for s in steps:
                s()
            return
        with self.torch.cuda.stream(self.tstream):
            for s in steps:
                s()

    def _tokens(self, n: int, buf=None) -> np.ndarray:
        buf = self.tok if buf is None else buf
        if self.eager:
            return buf[:n].numpy().copy()
        cu = self.cu
        src = cu.CUdeviceptr(buf.data_ptr())
        self.drv.check(cu.cuMemcpyDtoHAsync(self.p_tok.ptr, src, n * 4, self.stream))
        self.drv.check(cu.cuStreamSynchronize(self.stream))
        return self.h_tok[:n].copy()

    def time_decode_graph(self, B: int, ctx: int = 1, n: int = 50) -> float:
        """us per replay of bucket B's decode graph, n back-to-back launches (device-bound), on
        padding rows that attend over ctx tokens of the trash row. Only between steps."""
        import time

        if not self.use_graphs:
            raise BackendUnavailableError(
                "time_decode_graph needs CUDA graphs (a GPU, graphs=True)"
            )
        self.drain()
        B = next(b for b in self.buckets if b >= B)
        self._stage_pad(B, 0)
        i = _FIELDS.index("ctx")
        self.h_stage[i * self.max_batch : i * self.max_batch + B] = max(
            1, min(ctx, self.max_seq_len)
        )
        cu, chk = self.cu, self.drv.check
        self._h2d(self.n_dec)
        gexec = self._graphs[B][1]
        chk(cu.cuGraphLaunch(gexec, self.stream))
        chk(cu.cuStreamSynchronize(self.stream))
        t0 = time.perf_counter()
        for _ in range(n):
            chk(cu.cuGraphLaunch(gexec, self.stream))
        chk(cu.cuStreamSynchronize(self.stream))
        return (time.perf_counter() - t0) / n * 1e6

    def memory(self) -> dict:
        t = [self.kc, self.vc, self.h, self.qkv, self.att, self.mlp, self.logits, self.ws, self.aws]
        w = [
            x
            for L in self.layers
            for v in L.values()
            if v is not None
            for x in (v if isinstance(v, tuple) else (v,))
            if x is not None
        ]
        w += [x for x in self.lm if x is not None] + [self.emb]
        nb = lambda ts: int(sum(x.numel() * x.element_size() for x in ts))  # noqa: E731
        return {
            "weights_bytes": nb(w),
            "kv_pool_bytes": nb([self.kc, self.vc]),
            "activation_bytes": nb(t[2:]),
            "buckets": list(self.buckets),
            "graphs": self.use_graphs,
            "pdl": self.pdl,
            "prefetch": self.prefetch,
            "device": self.device_name,
        }


CudaBackend = CudaDecoderBackend  # the name zoi.decoder.compile imports

__all__ = ["CudaDecoderBackend", "CudaBackend"]
