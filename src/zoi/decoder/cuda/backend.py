"""CudaDecoderBackend: an api.DecoderBackend on the GPU. The checkpoint becomes the one runtime's
IR (zoi.decoder.ir.generate_model: build_generate's graph, as on the CPU), run by the GPU's
generation runtime (zoi.backends.cuda.generate.GenerateRuntime: the decode kernels, the paged KV
pool, one CUDA graph per batch bucket) behind zoi.decoder.paged.PagedBackend's bookkeeping
(admission, block tables, finishing).

What stays here is the host's side of a step: the runtime's block-table rows marked dirty when a
sequence is admitted or released, and the pipelined steps (``pipeline``): the next decode step of
the sequences that continue is launched before this one's tokens are read.

Seam (gap, docs/DECODERS_GPU.md): torch allocates the device buffers and gives Triton its stream
(as in zoi.backends.cuda); the per-step path itself is the CUDA driver API only.
"""

from __future__ import annotations

import numpy as np

from zoi.backends.base import KvPool
from zoi.backends.cuda.generate import BUCKETS, PRECISIONS, GenerateRuntime, check_shape
from zoi.decoder.api import PRECISION_ALIASES as ALIASES
from zoi.decoder.api import DecoderSpec
from zoi.decoder.ir import generate_model
from zoi.decoder.memory import Part, check_fits
from zoi.decoder.paged import PagedBackend
from zoi.errors import InputError

__all__ = ["CudaDecoderBackend", "CudaBackend", "BUCKETS", "PRECISIONS"]


class CudaDecoderBackend(GenerateRuntime, PagedBackend):
    name = "cuda"
    kv_on_host = False  # the pool is on the GPU: _fits_device counts it there

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
        pdl: programmatic dependent launch between the kernels (zoi.backends.cuda.kernels.pdl;
        sm_90+); prefetch: with pdl, each linear brings its W slice into L2 before it waits for
        the previous kernel; pipeline: launch the next decode step before the host has read this
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
        # before the IR's weights are built (a copy of every tensor)
        check_shape(block_size, max_batch, spec.head_dim, spec.num_heads, spec.num_kv_heads)
        max_seq_len = int(max_seq_len or min(spec.max_position_embeddings, 4096))
        num_blocks = int(num_blocks or max_batch * -(-max_seq_len // block_size))
        PagedBackend.__init__(self, spec, num_blocks, block_size, max_batch, max_seq_len)
        max_prefill = int(
            max_prefill_tokens or max(max_seq_len, min(2048, max_batch * max_seq_len))
        )
        # float32 weights in the IR: the runtime folds the norms' gains, then quantises
        compiled = generate_model(
            spec, weights, self.max_seq_len, precision, max_prefill, max_batch, quantize=False
        )
        pool = KvPool(num_blocks, block_size, self.max_blocks_per_seq, max_batch, self.max_seq_len)
        self.pipeline = bool(pipeline)
        self._inflight: dict | None = None
        self._init_runtime(
            compiled, pool, self.block_tables, max_prefill, interpret, graphs, pdl, prefetch,
            fuse_rope, attn_min_per,
        )  # fmt: skip

    def _fits_device(self, parts: list[tuple[str, str, int]], free: int) -> None:
        """The runtime's device-memory check, in the words of the decoder's options."""
        check_fits(
            [Part(*p) for p in parts],
            "the GPU decoder's KV pool and buffers",
            (free, "free"),
            "GPU memory",
            self.device_name,
        )

    def add(self, seq_id, prompt_ids, params) -> None:
        n = int(np.asarray(prompt_ids).size)
        if n > self.max_prefill:
            raise InputError(
                f"prompt of {n} tokens is over this backend's max_prefill_tokens "
                f"({self.max_prefill}); compile with a larger max_prefill_tokens"
            )
        super().add(seq_id, prompt_ids, params)
        self.mark_dirty(self._seqs[seq_id].row)

    def _release(self, s) -> None:
        super()._release(s)
        self.mark_dirty(s.row)

    def _run(self, rows, starts, counts, ids, samp, seeds) -> np.ndarray:
        return self.run_step(rows, starts, counts, ids, samp, seeds)

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
                self.wait_ahead(infl)
            return []
        cont = []  # (row in the step launched ahead, sequence) still running
        if infl is not None:
            cont = [(i, s) for i, s in enumerate(infl["seqs"]) if self._seqs.get(s.seq_id) is s]
        held = {id(s) for _, s in cont}
        rest = [s for s in self._seqs.values() if id(s) not in held]
        events = []
        if infl is not None and (not cont or any(s.cached > 0 for s in rest)):
            # a decode row the step launched ahead does not cover (or none left): book it first
            toks = self.wait_ahead(infl)
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
            toks = self.wait_ahead(infl)
            events += self._advance([s for _, s in cont], toks[[i for i, _ in cont]])
        return events

    def _launch_ahead(self, seqs, fb_rows: dict) -> dict:
        """Launch the decode step of seqs; a sequence in fb_rows (id -> row of the step in flight)
        is one token further than its host state says and takes that row's token."""
        n = len(seqs)
        ahead = np.fromiter((id(s) in fb_rows for s in seqs), bool, n)
        fb = np.fromiter((fb_rows.get(id(s), -1) for s in seqs), np.int32, n)
        # every row is a decode row (one pending token): ids of rows launched ahead are stale but
        # unused (fb takes the token on the device)
        rows, starts, _, ids, samp, seeds = self._inputs(seqs)
        pos = starts.astype(np.int64) + ahead
        samp[:, 3] += ahead  # the draw index of the token after the one in flight
        return {"seqs": seqs, **self.launch_ahead(ids, pos, rows, fb, samp, seeds)}

    def drain(self) -> None:
        """Wait for and drop a step launched ahead: nothing of it was booked on the host, so the
        next step() recomputes the same rows (their K/V writes land on the same slots)."""
        infl, self._inflight = self._inflight, None
        if infl is not None:
            self.wait_ahead(infl)


CudaBackend = CudaDecoderBackend  # the name zoi.decoder.compile imports
