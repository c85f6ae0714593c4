"""GenerateRuntime: generation on the GPU from the one runtime's IR. The graph of one step is
zoi.graph.build_decoder.build_generate's (the decoder stack over the paged KV cache, the LM head on
the last token of each sequence, the sampler), as the CPU engine runs it; here its ops are realised
with the decode kernels of zoi.backends.cuda.kernels: ``linear_decode`` (GEMV / mma / dot tiles of
one config table, linear_table.py, with the preceding RMSNorm, the bias, SwiGLU and the residual
fused), ``attention_paged`` (flash-decoding over the block tables with q / k norm, RoPE and the K / V
write fused; causal varlen attention for the packed prefill) and ``sample`` (the embedding gather
and the sampler), on a KvPool (zoi.backends.base) as the CPU engine takes it.

Construction (torch and triton are tools here, as in the encoders' CudaBackend, whose device set-up
it shares: zoi.backends.cuda.device.init_device): the IR's weights are packed once (each RMSNorm's
gain folded into the columns of the linear it feeds, INT8 per output channel ("w8", "int8") through
zoi.numerics.primitives.quantize_weight, FP16 or FP32), the static paged KV pool
[layers, num_blocks + 1, KVH, block_size, D] (block ``num_blocks``: the trash block padded decode
rows write to) and every activation buffer are allocated, and one decode step per batch bucket
(1, 2, 4, 8, 16, 32 up to max_batch) is warmed up and captured into a CUDA graph with the driver
API on our own stream.

Per step (``run_step``): the new prompts are prefilled packed, without padding (eager launches on
our stream, the LM head over the last token of each prompt only, then the sampler); the running
sequences take one decode step: numpy fills one pinned int32 staging block (ids, positions, cache
slots, context lengths, block-table rows, sampling params), one cuMemcpyHtoDAsync, cuGraphLaunch of
the bucket, cuMemcpyDtoHAsync of the tokens, cuStreamSynchronize. Block-table rows marked dirty
are copied to the device table first. Nothing is allocated on the device while generating.
``launch_ahead`` / ``wait_ahead``: a decode step launched before the previous one's tokens are
read (the decoder's pipelined steps).

``interpret=True`` (or TRITON_INTERPRET=1 without a GPU) runs the same launch lists eagerly on torch
CPU tensors through the Triton interpreter: the CI test of everything but the graphs.
"""

from __future__ import annotations

import numpy as np

from zoi.backends.base import KvPool
from zoi.backends.cuda.arena import carve
from zoi.backends.cuda.device import init_device
from zoi.backends.cuda.generate_host import GenerateHost
from zoi.backends.cuda.generate_steps import _FIELDS, GenerateSteps
from zoi.backends.cuda.kernels import attention_paged as ka
from zoi.backends.cuda.kernels import linear_decode as kl
from zoi.backends.cuda.kernels import sample as ks
from zoi.errors import BackendUnavailableError, InputError
from zoi.numerics.primitives import quantize_weight

BUCKETS = (1, 2, 4, 8, 16, 32)
# the precision words: "w8" weight-only INT8, "int8" W8A8 (INT8 weights; x INT8 per (row, K tile)
# in the dot / mma kernels, the gemv for <= 4 rows stays weight-only), "fp16", "fp32"
PRECISIONS = ("w8", "int8", "fp16", "fp32")
BLOCK_SIZES = (16, 32, 64)

__all__ = ["BUCKETS", "PRECISIONS", "GenerateRuntime", "check_shape", "generate_layers"]


def generate_layers(graph) -> dict:
    """The IR graph of one generation step (build_generate) read as the decode kernels run it:
    per layer the weight names of the RMSNorm -> q|k|v -> paged attention -> o (+ residual) ->
    RMSNorm -> gate|up -> SwiGLU -> down (+ residual) chain, then the final RMSNorm, the pool of the
    last tokens, the LM head and the sampler. Any other graph is refused, naming the op."""
    ops = list(graph.ops)
    want = (
        ["embed"]
        + ["add_layernorm", "linear", "attention", "linear", "add_layernorm", "linear", "glu", "linear"]
        * ((len(ops) - 5) // 8)
        + ["add_layernorm", "pool", "linear", "sample"]
    )  # fmt: skip
    kinds = [o.kind for o in ops]
    if kinds != want:
        k = next(
            (i for i, (a, b) in enumerate(zip(kinds, want, strict=False)) if a != b),
            min(len(kinds), len(want)),
        )
        got = kinds[k] if k < len(kinds) else "the end"
        raise BackendUnavailableError(
            f"the GPU generation runtime runs pre-norm SwiGLU decoders (Llama, Mistral, Qwen2, "
            f"Qwen3): op {k} of the graph is {got!r} where {want[k] if k < len(want) else 'the end'!r} "
            "was expected; run this model with device='cpu'"
        )
    layers = []
    for i in range(1, len(ops) - 4, 8):
        n1, qkv, att, o, n2, gu, glu, down = ops[i : i + 8]
        a = att.attrs
        bad = [
            why
            for cond, why in (
                (not (n1.attrs.get("rms") and n2.attrs.get("rms")), "LayerNorm (RMSNorm only)"),
                (n1.attrs.get("residual") or n2.attrs.get("residual"), "post-norm residuals"),
                (not a.get("paged") or not a.get("causal"), "attention not causal over the cache"),
                (a.get("window"), "a sliding window"),
                (glu.attrs.get("act") != "silu", f"{glu.attrs.get('act')!r} gating (SwiGLU only)"),
                (len(o.inputs) < 2 or len(down.inputs) < 2, "no residual on o / down"),
            )
            if cond
        ]
        if bad:
            raise BackendUnavailableError(
                f"the GPU generation runtime does not run {', '.join(bad)} (layer {len(layers)}); "
                "run this model with device='cpu'"
            )
        layers.append(
            dict(
                ln1=n1.weights["w"],
                qkv=qkv.weights["w"],
                qkv_b=qkv.weights.get("b"),
                q_norm=att.weights.get("q_norm"),
                k_norm=att.weights.get("k_norm"),
                rope=(att.weights["rope_cos"], att.weights["rope_sin"]),
                o=o.weights["w"],
                o_b=o.weights.get("b"),
                ln2=n2.weights["w"],
                gu=gu.weights["w"],
                down=down.weights["w"],
            )
        )
    return dict(
        embed=ops[0].weights["word"],
        layers=layers,
        final_ln=ops[-4].weights["w"],
        lm=ops[-2].weights["w"],
        eps=float(ops[1].attrs["eps"]),
    )


def check_shape(block_size: int, max_batch: int, head_dim: int, heads: int, kv_heads: int) -> None:
    """What the decode kernels take (InputError naming the option otherwise): a caller checks it
    before it builds anything large."""
    if block_size not in BLOCK_SIZES:
        raise InputError(f"block_size {block_size}: the GPU decoder takes 16, 32 or 64")
    if max_batch > BUCKETS[-1]:
        raise InputError(f"max_batch {max_batch} is over {BUCKETS[-1]} (the largest decode bucket)")
    if head_dim % 2 or heads % kv_heads:
        raise InputError(
            f"head_dim {head_dim} (odd) or GQA {heads}/{kv_heads} not supported on the GPU decoder"
        )


class GenerateRuntime(GenerateHost, GenerateSteps):
    """The device half of GPU generation (module doc); a paged decoder backend mixes it in."""

    def _init_runtime(
        self,
        compiled,
        pool: KvPool,
        block_tables: np.ndarray,
        max_prefill: int,
        interpret: bool | None = None,
        graphs: bool = True,
        pdl: bool = False,
        prefetch: bool = False,
        fuse_rope: bool = True,
        attn_min_per: int = 1,
        device_index: int | None = None,
    ):
        """compiled: the CompiledModel of build_generate with float32 weights (packed here);
        compiled.precision one of PRECISIONS. pool: the KV pool (table_rows = max_batch <= 32);
        block_tables: the host's [table_rows, max_blocks] int32 tables, read when rows are
        marked dirty (mark_dirty) and when steps are staged."""
        precision = compiled.precision
        if precision not in PRECISIONS:
            raise InputError(
                f"precision {precision!r}: use one of {PRECISIONS} ('w8': weight-only INT8, "
                "'int8': W8A8)"
            )
        sp = compiled.spec
        check_shape(pool.block_size, pool.table_rows, sp.head_dim, sp.heads, sp.num_kv_heads)
        self.ir_spec = sp
        self.graph_weights = generate_layers(compiled.graph)
        self.num_blocks, self.block_size = int(pool.num_blocks), int(pool.block_size)
        self.max_blocks_per_seq, self.max_batch = int(pool.max_blocks), int(pool.table_rows)
        self.max_seq_len = int(pool.max_pos)
        self.block_tables = block_tables
        self.precision = precision
        self.ieee = precision == "fp32"
        self.wbytes = {"w8": 1, "int8": 1, "fp16": 2, "fp32": 4}[precision]
        self.a8 = precision == "int8"  # INT8 x too, in the dot / mma kernels (not the gemv)
        self.max_prefill = int(max_prefill)
        self.buckets = sorted({b for b in BUCKETS if b < self.max_batch} | {self.max_batch})
        init_device(self, interpret, device_index, "the GPU decoder")
        if pdl and (self.eager or self.capability < (9, 0)):
            raise BackendUnavailableError(
                "pdl=True needs an sm_90+ GPU (programmatic dependent launch); "
                f"this is {self.device_name}: leave pdl off"
            )
        self.pdl = bool(pdl)
        self.prefetch = bool(prefetch) and self.pdl
        self.fuse_rope = bool(fuse_rope)
        self.attn_min_per = max(1, int(attn_min_per))
        self.n_ahead = 0  # decode steps launched ahead (launch_ahead)
        self.use_graphs = bool(graphs) and not self.eager
        self._upload(compiled.weights)
        self._alloc()
        if not self.eager:  # the buffers were filled on torch's stream; ours does not wait for it
            self.torch.cuda.synchronize()
        self._graphs: dict[int, tuple] = {}
        self._steps = {b: self._decode_steps(b) for b in self.buckets}
        for b in self.buckets:
            self._graphs[b] = self._capture(b)

    # ------------------------------------------------------------------ weights
    def _t(self, a, dtype=None):
        t = self.torch.from_numpy(np.array(a, copy=True, order="C"))
        return (t.to(dtype) if dtype is not None else t).to(self.dev)

    def _lin(self, w: np.ndarray) -> tuple:
        torch = self.torch
        if self.precision in ("w8", "int8"):
            q, s = quantize_weight(w)  # the quantiser of every zoi INT8 weight
            return self._t(q), self._t(s)
        return self._t(w, torch.float32 if self.ieee else torch.float16), None

    def _upload(self, W: dict):
        """The IR's float32 weights packed for the decode kernels: q|k|v and gate|up as the IR
        holds them, each RMSNorm's gain folded into the columns of the linear it feeds (the
        kernels compute the norm's 1 / rms in their prologue), biases only where non-zero."""
        torch, g = self.torch, self.graph_weights
        self.act = torch.float32 if self.ieee else torch.float16
        self.eps = g["eps"]

        def w(name):
            if name not in W:
                raise InputError(f"weights: {name} is missing")
            return np.asarray(W[name], np.float32)

        def bias(name):
            b = None if name is None or name not in W else w(name)
            return None if b is None or not b.any() else self._t(b)

        self.layers = []
        for L in g["layers"]:
            self.layers.append(
                {
                    "qkv": self._lin(w(L["qkv"]) * w(L["ln1"])[None, :]),
                    "o": self._lin(w(L["o"])),
                    "gu": self._lin(w(L["gu"]) * w(L["ln2"])[None, :]),
                    "down": self._lin(w(L["down"])),
                    "qkv_b": bias(L["qkv_b"]),
                    "o_b": bias(L["o_b"]),
                    "qn": self._t(w(L["q_norm"])) if L["q_norm"] else None,
                    "kn": self._t(w(L["k_norm"])) if L["k_norm"] else None,
                }
            )
        self.lm = self._lin(w(g["lm"]) * w(g["final_ln"])[None, :])
        self.emb = self._t(w(g["embed"]), self.act)
        cos, sin = g["layers"][0]["rope"]
        self.cos, self.sin = self._t(w(cos)), self._t(w(sin))  # max_seq_len rows (the IR's)

    # ------------------------------------------------------------------ buffers
    def _check_device_memory(self) -> None:
        """The pool and the step buffers _alloc makes must fit the GPU's free memory (the
        weights are there already): refused before any of them is allocated, not a torch
        OutOfMemoryError part-way."""
        if self.eager:
            return
        sp, e = self.ir_spec, self.act.itemsize
        T = max(self.max_batch, self.max_prefill)
        per_block = 2 * sp.layers * sp.num_kv_heads * self.block_size * sp.head_dim * e
        act = T * (4 * sp.hidden + e * (self.qkv_n + sp.heads * sp.head_dim))
        act += T * e * sp.intermediate
        free, _ = self.torch.cuda.mem_get_info()
        parts = [
            (
                f"KV pool (kv_blocks={self.num_blocks} x block_size={self.block_size} "
                f"tokens, {per_block} bytes a block)",
                "kv_blocks",
                (self.num_blocks + 1) * per_block,
            ),
            (f"prefill buffers (max_tokens={self.max_prefill} tokens)", "max_tokens", act),
            (
                f"logits (max_batch={self.max_batch} x vocab {sp.vocab_size})",
                "max_batch",
                4 * self.max_batch * sp.vocab_size,
            ),
        ]
        self._fits_device(parts, free)

    def _fits_device(self, parts: list[tuple[str, str, int]], free: int) -> None:
        """Refuses parts [(what, option, bytes)] over the free GPU memory (the decoder's
        backend names its serve flags instead)."""
        need = sum(p[2] for p in parts)
        if need > free:
            big = max(parts, key=lambda p: p[2])
            raise BackendUnavailableError(
                f"the generation buffers need {need} bytes of GPU memory, {free} are free on "
                f"{self.device_name}; the largest: {big[0]}: lower {big[1]}"
            )

    def _alloc(self):
        sp, torch = self.ir_spec, self.torch
        H, KVH, D, Hd, V = sp.heads, sp.num_kv_heads, sp.head_dim, sp.hidden, sp.vocab_size
        I, MB, PT = sp.intermediate, self.max_batch, self.max_prefill
        self.qkv_n = (H + 2 * KVH) * D
        self._check_device_memory()
        self.trash_slot = self.num_blocks * self.block_size
        T = max(MB, PT)
        S, _ = ks.sample_splits(V)  # the sampler's split argmax: S programs per row
        # block tables: row max_batch is the trash row (padded decode entries)
        self.tab_host = np.full((MB + 1, self.max_blocks_per_seq), self.num_blocks, np.int32)
        self._dirty: set[int] = set()  # block-table rows changed since the last upload
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
        # staging: decode fields at fixed offsets (MB each); prefill: ids|pos|slot (PT each),
        # tiles (3 PT), last rows + sampling fields (MB each)
        self.n_dec = len(_FIELDS) * MB
        self.n_pre = 6 * PT + 6 * MB
        # every device buffer in one arena placed by the graph's planner, by the phases of a
        # layer's launches: 0 embed, 1 q|k|v (+ RoPE / K, V write), 2 attention, 3 o, 4 gate|up,
        # 5 down, 6 LM head, 7 sampler. The pool, the residual, workspaces, tables and staging
        # live throughout; q|k|v and the attention output are dead by gate|up, whose output is
        # dead by the next layer's q|k|v, and the logits are written after the last layer: they
        # share bytes (no two layers overlap in time: one stream, launched in order).
        i32, f32, act, ALL = torch.int32, torch.float32, self.act, (0, 7)
        kv = (sp.layers, self.num_blocks + 1, KVH, self.block_size, D)
        bufs = {
            "kc": (kv, act, ALL),
            "vc": (kv, act, ALL),
            "h": ((T, Hd), f32, ALL),
            "qkv": ((T, self.qkv_n), act, (1, 2)),
            "att": ((T, H * D), act, (2, 3)),
            "mlp": ((T, I), act, (4, 5)),
            "logits": ((MB, V), f32, (6, 7)),
            "tok": ((MB,), i32, ALL),  # the decode graphs' tokens (fed back)
            "tok_pre": ((MB,), i32, ALL),  # the prefill's first tokens
            "sws0": ((MB * S,), f32, ALL),
            "sws1": ((MB * S,), i32, ALL),
            "sws2": ((MB,), i32, ALL),
            "tab": (self.tab_host.shape, i32, ALL),
            "ws": ((ws,), f32, ALL),
            "cnt": ((cnt,), i32, ALL),
            "aws": ((aws,), f32, ALL),
            "acnt": ((acnt,), i32, ALL),
            "d_stage": ((self.n_dec + self.n_pre,), i32, ALL),
        }
        v, self.arena, self.arena_bytes = carve(torch, self.dev, bufs)
        self.kc, self.vc, self.h = v["kc"], v["vc"], v["h"]
        self.qkv, self.att, self.mlp, self.logits = v["qkv"], v["att"], v["mlp"], v["logits"]
        self.tok, self.tok_pre, self.tab, self.d_stage = (
            v["tok"],
            v["tok_pre"],
            v["tab"],
            v["d_stage"],
        )
        self.sws = (v["sws0"], v["sws1"], v["sws2"])
        self.ws, self.cnt, self.aws, self.acnt = v["ws"], v["cnt"], v["aws"], v["acnt"]
        self.tab.copy_(torch.from_numpy(self.tab_host))
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
