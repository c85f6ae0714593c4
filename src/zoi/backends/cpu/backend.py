"""The native CPU backend: the whole plan runs inside zoi._cpu (C++), one call per batch.

At construction the op list of the CompiledModel is translated into a native Engine: linear
weights are packed into the micro-kernel layout of the ISA picked at import (AVX-512 VNNI,
AVX-512BW, AVX2 or scalar; ``CpuOptions.isa``, from ``ZOI_CPU_ISA``, forces one), activations live in the planner's
arena (one allocation, at construction), and a call runs every op in C++ on the shared pinned
thread pool with the GIL released. INT8 linears reproduce ``zoi.numerics.primitives`` (integer
accumulation exactly); fp32 linears (precision "fp32", or ``quant[p].scheme == "fp32"``) run
the FP32 GEMM.
"""

from __future__ import annotations

import mmap

import numpy as np

from zoi import _cpu
from zoi.backends.base import KvPool, SyncSubmit
from zoi.backends.cpu.options import CpuOptions, apply_cpu_options
from zoi.graph.compiled import CompiledModel
from zoi.graph.fusion import FusionPolicy, annotate
from zoi.graph.quantmode import QuantMode

__all__ = ["CpuBackend", "KvPool"]  # KvPool: zoi.backends.base, the paged cache of either device


def _f32(a) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32)


def _release_file_pages(arrays: list[np.ndarray]) -> int:
    """Drop the resident pages of arrays that are read-only views of a memory-mapped file
    (an artifact's weights, once packed, are not read again): madvise(MADV_DONTNEED) on a
    read-only shared file mapping only unmaps pages, which fault back from the file if
    anything reads them. Best effort; returns the bytes advised."""
    if not hasattr(mmap, "MADV_DONTNEED"):
        return 0
    page = mmap.PAGESIZE
    done = 0
    for a in arrays:
        base, mm_arr = a, None
        while isinstance(base, np.ndarray):
            if isinstance(base, np.memmap):
                mm_arr = base
            base = base.base
        if (
            mm_arr is None
            or getattr(mm_arr, "mode", None) != "r"
            or not isinstance(base, mmap.mmap)
        ):
            continue
        try:
            root = np.frombuffer(base, dtype=np.uint8)
            start = a.__array_interface__["data"][0] - root.__array_interface__["data"][0]
            lo = -(-start // page) * page
            hi = (start + a.nbytes) // page * page
            if hi > lo:
                base.madvise(mmap.MADV_DONTNEED, lo, hi - lo)
                done += hi - lo
        except (ValueError, OSError, BufferError):
            continue
    return done


class CpuBackend(SyncSubmit):
    """The Backend interface (zoi.backends.base) over the native engine."""

    name = "cpu"

    def __init__(
        self,
        model: CompiledModel,
        isa: str | None = None,
        nthreads: int | None = None,
        fusion: FusionPolicy | None = None,
        options: CpuOptions | None = None,
        kv_pool: KvPool | None = None,
    ):
        """isa: force one kernel table (None: options.isa, else the best this CPU runs);
        nthreads: engine threads (None: the process pool's); fusion: the IR fusion pass's
        switches (zoi.graph.fusion; None: its defaults); options: the core's process-wide
        switches (zoi.backends.cpu.options; None: as the core holds them), applied before the
        engine is built; kv_pool: the paged KV cache of a generation graph (its paged
        attention ops; zoi.decoder.cpu), reserved by the engine once."""
        self.options = apply_cpu_options(options)
        self.model = model
        plan, graph, W = model.plan, model.graph, model.weights
        self._keep: list[np.ndarray] = []  # tables the engine references without copying
        eng = _cpu.Engine(
            int(plan.arena_bytes),
            int(plan.max_tokens),
            int(plan.max_batch),
            isa or "",
            int(nthreads or 0),
        )
        if kv_pool is not None:
            eng.set_kv_pool(*kv_pool)
        off = plan.offsets
        self.hidden = None
        self.linear_kinds: dict[str, str] = {}
        # weights copied into the engine's packed layout: let an artifact's pages of the
        # originals go as soon as each is packed (keeps the peak RSS down)
        self.released_bytes = 0
        # fusion and the int8 copies: the IR's decisions (zoi.graph.fusion), realised here;
        # what this core cannot do is recorded in `fallbacks` (IR buffer / copy -> reason)
        try:
            annotate(model, fusion)
        except ValueError as e:
            raise ValueError(f"the cpu backend: {e}") from None
        # the float outputs this build keeps in per-thread scratch only (y_dead): a tap of one
        # is refused (the graph's annotation is shared, so it is read here, at build time)
        self._scratch_outputs = {
            op.output for op in graph.ops if op.attrs.get("quant_out_only", False)
        }
        self.fallbacks: dict[str, str] = {}
        pooled = False  # ops after the pool run on one row per sequence
        for k, op in enumerate(graph.ops):
            pooled = pooled or op.kind == "pool"
            # a head's linear / LayerNorm after a pool runs over the B pooled rows
            eng.set_batch_rows(
                bool(op.inputs)
                and graph.buffers.get(op.inputs[0]) is not None
                and graph.buffers[op.inputs[0]].rows == "B"
            )
            if op.kind == "embed":
                ow = op.weights
                if "embed.word" in W:
                    word, word_q, word_scale = self._hold(_f32(W[ow["word"]])), None, None
                else:
                    word = None
                    word_q = self._hold(np.ascontiguousarray(W["embed.word_q"], dtype=np.int8))
                    word_scale = self._hold(_f32(W["embed.word_scale"]))
                if "pos" in ow:
                    pos, max_pos = self._hold(_f32(W[ow["pos"]])), -1
                elif kv_pool is not None:  # generation: positions up to the context
                    pos, max_pos = None, int(kv_pool.max_pos)
                else:  # no position table (ModernBERT: RoPE): none held, positions bounded
                    pos, max_pos = None, min(model.position_rows(), int(plan.max_tokens))
                type0 = _f32(W[ow["type"]][0]) if "type" in ow else None
                eng.add_embed(
                    off[op.output],
                    word,
                    word_q,
                    word_scale,
                    pos,
                    type0,
                    _f32(W[ow["ln_w"]]) if "ln_w" in ow else None,  # decoder archs: no norm
                    _f32(W[ow["ln_b"]]) if "ln_b" in ow else None,
                    float(op.attrs["eps"]),
                    max_pos,
                )
                if len(op.inputs) > 2:  # token types (pairs): the whole table
                    eng.set_embed_types(_f32(W[ow["type"]]))
                if "lora_a" in ow:  # task adapters (copied)
                    lt = ow.get("lora_type")
                    eng.set_embed_lora(
                        _f32(W[ow["lora_a"]]),
                        _f32(W[ow["lora_b"]]),
                        _f32(W[lt]) if lt is not None else None,
                    )
            elif op.kind == "linear":
                p = op.prefix
                act = op.attrs.get("act", "none")
                res = off[op.inputs[1]] if len(op.inputs) > 1 else -1
                lora = "lora_a" in op.weights
                if lora:  # the GEMM alone; the adapters' step adds their term, act, residual
                    lora_act, lora_res, act, res = act, res, "none", -1
                q = model.quant.get(p)
                b = W.get(f"{p}.b")
                b = _f32(b) if b is not None else None
                shift, mul = W.get(f"{p}.act_shift"), W.get(f"{p}.act_mul")
                shift = _f32(shift) if shift is not None else None
                mul = _f32(mul) if mul is not None else None
                scheme = op.attrs["quant"]  # the IR's (zoi.graph.fusion.linear_quant)
                if scheme.is_int8:  # the binding edge: QuantMode -> add_linear_i8's (static, asym)
                    static = float(q.amax) if scheme is QuantMode.STATIC else -1.0
                    q_from, q_min = self._copy_from(graph, k, op)
                    eng.add_linear_i8(
                        off[op.inputs[0]],
                        off[op.output],
                        np.ascontiguousarray(W[f"{p}.w_q"], dtype=np.int8),
                        _f32(W[f"{p}.w_scale"]),
                        b,
                        act,
                        res,
                        static,
                        scheme is QuantMode.DYNAMIC_ASYM,
                        shift,
                        mul,
                        q_from,
                        q_min,
                        # the IR's: nothing reads the float rows but the copy's quantisation
                        y_dead=bool(op.attrs.get("quant_out_only", False)),
                        # the quantiser's per-linear choice (zoi.quant.gptq): 7 runs AVX2's
                        # cheaper exact loop; the engine refuses a weight outside [-63, 63]
                        w_bits=int(q.info.get("weight_bits", 8)) if q is not None else 8,
                    )
                    if getattr(q, "first_row", False) and not pooled:
                        # token rows: the first row of each sequence quantised twice
                        eng.set_first_row_residual()
                    self.released_bytes += _release_file_pages([W[f"{p}.w_q"]])
                    self.linear_kinds[p] = (
                        "int8" if scheme is QuantMode.DYNAMIC else f"int8-{scheme.value}"
                    )
                else:
                    if f"{p}.w" in W:
                        w = _f32(W[f"{p}.w"])
                        self.released_bytes += _release_file_pages([W[f"{p}.w"]])
                    else:  # int8 weights kept in fp32 compute: dequantise once
                        w = W[f"{p}.w_q"].astype(np.float32) * _f32(W[f"{p}.w_scale"])[:, None]
                    if shift is not None or mul is not None:  # fold x' = (x - shift) * mul
                        from zoi.numerics.primitives import fold_act_transform

                        w64, b64 = fold_act_transform(w, b, shift, mul)
                        w, b = w64.astype(np.float32), b64.astype(np.float32)
                    eng.add_linear_f32(off[op.inputs[0]], off[op.output], w, b, act, res)
                    self.linear_kinds[p] = "fp32"
                if lora:
                    eng.add_lora(
                        off[op.inputs[0]],
                        off[op.output],
                        _f32(W[op.weights["lora_a"]]),
                        _f32(W[op.weights["lora_b"]]),
                        lora_act,
                        lora_res,
                    )
            elif op.kind == "attention" and op.attrs.get("paged"):
                a, aw = op.attrs, op.weights
                if kv_pool is None:
                    raise ValueError("a graph with paged attention needs the backend's kv_pool")
                eng.add_attention_paged(
                    off[op.inputs[0]],
                    off[op.output],
                    int(a["heads"]),
                    int(a["head_dim"]),
                    float(a["scale"]),
                    int(a.get("kv_heads") or a["heads"]),
                    _f32(W[aw["rope_cos"]]),
                    _f32(W[aw["rope_sin"]]),
                    q_norm=_f32(W[aw["q_norm"]]) if "q_norm" in aw else None,
                    k_norm=_f32(W[aw["k_norm"]]) if "k_norm" in aw else None,
                    qk_eps=float(a.get("qk_eps", 1e-6)),
                )
            elif op.kind == "sample":
                eng.add_sample(off[op.inputs[0]], graph.buffers[op.inputs[0]].cols)
            elif op.kind == "attention" and (
                op.weights or op.attrs.get("window", 0) or op.attrs.get("causal")
            ):
                a, aw = op.attrs, op.weights
                eng.add_attention_ext(
                    off[op.inputs[0]],
                    off[op.output],
                    int(a["heads"]),
                    int(a["head_dim"]),
                    float(a["scale"]),
                    _f32(W[aw["rel_bias"]]) if "rel_bias" in aw else None,
                    int(a.get("window", 0)),
                    _f32(W[aw["rope_cos"]]) if "rope_cos" in aw else None,
                    _f32(W[aw["rope_sin"]]) if "rope_sin" in aw else None,
                    kv_heads=int(a.get("kv_heads", 0)),
                    causal=bool(a.get("causal", False)),
                    q_norm=_f32(W[aw["q_norm"]]) if "q_norm" in aw else None,
                    k_norm=_f32(W[aw["k_norm"]]) if "k_norm" in aw else None,
                    qk_eps=float(a.get("qk_eps", 1e-6)),
                )
            elif op.kind == "glu":
                eng.add_glu(
                    off[op.inputs[0]],
                    off[op.output],
                    graph.buffers[op.output].cols,
                    op.attrs["act"],
                )
            elif op.kind == "attention":
                a = op.attrs
                eng.add_attention(
                    off[op.inputs[0]],
                    off[op.output],
                    int(a["heads"]),
                    int(a["head_dim"]),
                    float(a["scale"]),
                    int(a.get("kv_heads", 0)),
                )
            elif op.kind == "add_layernorm":
                res = off[op.inputs[1]] if len(op.inputs) > 1 else -1
                eng.add_layernorm(
                    off[op.inputs[0]],
                    res,
                    off[op.output],
                    _f32(W[op.weights["w"]]),
                    _f32(W[op.weights["b"]]),
                    float(op.attrs["eps"]),
                    rms=bool(op.attrs.get("rms", False)),
                    post=op.attrs.get("residual") == "post",
                )
            elif op.kind == "pool":
                self.hidden = graph.buffers[op.output].cols
                eng.add_pool(off[op.inputs[0]], off[op.output], self.hidden, op.attrs["mode"])
            else:
                raise ValueError(f"the cpu backend does not know op kind {op.kind!r}")
        if graph.ops[-1].output != graph.output:
            raise ValueError("the cpu backend expects the graph's last op to write its output")
        out = graph.output
        if graph.ops[-1].kind == "sample":  # generation: the logits are the rows kept (tests)
            out = graph.ops[-1].inputs[0]
        ob = graph.buffers[out]
        self.hidden = ob.cols
        self.out_rows = ob.rows
        eng.set_output(off[out], ob.cols, ob.rows == "T")
        eng.finalize()
        self.engine = eng

    def _copy_from(self, graph, k: int, op) -> tuple[int, int]:
        """(q_from, q_min_m) of add_linear_i8 for the INT8 linear graph.ops[k]: the IR's writer
        of its int8 input copy (quant_in_by) where this core can realise it (the previous step,
        a LayerNorm / embedding / GLU, or an INT8 GEMM from quant_out_min_tokens rows), else a
        quantise step, recorded in self.fallbacks."""
        qname, by = op.attrs["quant_in"], op.attrs["quant_in_by"]
        prev = graph.ops[k - 1] if k > 0 else None
        if by is not None:
            why = None
            if prev is None or prev.output != by:
                why = "the producer is not the previous step (the scratch holds one copy)"
            elif prev.kind == "linear" and self.linear_kinds.get(prev.prefix) == "fp32":
                why = "an FP32 GEMM has no int8 epilogue"
            elif prev.kind not in ("embed", "add_layernorm", "glu", "linear"):
                why = f"a {prev.kind} step has no int8 epilogue"
            if why is None:
                return 1, int(prev.attrs.get("quant_out_min_tokens", 0))
            self.fallbacks[qname] = f"quantise step: {why}"
        elif op.attrs.get("quant_in_loop"):
            self.fallbacks[qname] = (
                "quantise step (the CPU GEMMs read int8 rows; no quantisation while loading)"
            )
        return 0, 0

    def describe(self, tokens: int) -> list[tuple[str, str, str]]:
        """[(linear weight prefix, int8 copy, who makes it)] of every INT8 linear as the native
        plan runs a call of `tokens` tokens (the vocabulary of zoi.graph.fusion.decisions):
        read back from the engine's steps (Engine.steps_info), not from the IR."""
        steps = self.engine.steps_info()
        kinds = {"layernorm": "add_layernorm", "embed": "embed", "glu": "glu"}
        lin = [o for o in self.model.graph.ops if o.kind == "linear"]
        out, li = [], 0
        for j, s in enumerate(steps):
            if s["kind"] not in ("gemm_i8", "gemm_f32"):
                continue
            op = lin[li]
            li += 1
            if s["kind"] == "gemm_f32":
                continue
            p = steps[j - 1]
            if p["kind"] == "quantize":
                fused = p["fused"] and tokens >= p["min_m"]
                who = "linear" if fused else "quantize"
            else:
                assert p["writes_copy"], (op.output, p)
                who = kinds[p["kind"]]
            out.append((op.prefix, op.attrs["quant_in"], who))
        return out

    def _hold(self, a: np.ndarray) -> np.ndarray:
        self._keep.append(a)
        return a

    @property
    def isa(self) -> str:
        return self.engine.isa

    def run(self, ids, positions, cu_seqlens, normalize: bool) -> np.ndarray:
        ids = np.ascontiguousarray(ids, dtype=np.int32)
        positions = np.ascontiguousarray(positions, dtype=np.int32)
        cu = np.ascontiguousarray(cu_seqlens, dtype=np.int32)
        out = np.empty((len(cu) - 1, self.hidden), np.float32)
        self.engine.run(ids, positions, cu, bool(normalize), out)
        return out

    def run_into(self, ids, positions, cu_seqlens, normalize: bool, out: np.ndarray) -> np.ndarray:
        """Like run, into a caller-owned float32 [>= B, H] array (no allocation at all)."""
        self.engine.run(ids, positions, cu_seqlens, bool(normalize), out)
        return out

    def run_tasks_into(
        self, ids, positions, cu_seqlens, normalize: bool, out: np.ndarray, tasks
    ) -> np.ndarray:
        """Task adapters (zoi.backends.base.TaskRunner): run_into with each sequence's task
        (int32 [B], -1: none), one native call whatever the mix of tasks."""
        tasks = np.ascontiguousarray(tasks, dtype=np.int32)
        self.engine.run(ids, positions, cu_seqlens, bool(normalize), out, tasks)
        return out

    def run_outputs(self, ids, positions, cu_seqlens, types=None, taps=()) -> dict:
        """Heads (zoi.backends.base.HeadRunner): the graph's output (B or T rows) and the T
        rows of each buffer in taps (at most one: the last hidden state), one native call."""
        if len(taps) > 1:
            raise ValueError("the cpu backend reads at most one tap per run")
        ids = np.ascontiguousarray(ids, dtype=np.int32)
        positions = np.ascontiguousarray(positions, dtype=np.int32)
        cu = np.ascontiguousarray(cu_seqlens, dtype=np.int32)
        if types is not None:
            types = np.ascontiguousarray(types, dtype=np.int32)
        rows = len(ids) if self.out_rows == "T" else len(cu) - 1
        out = np.empty((rows, self.hidden), np.float32)
        res = {self.model.graph.output: out}
        tap_off, tap_out = -1, None
        for name in taps:
            b = self.model.graph.buffers[name]
            if name in self._scratch_outputs:
                raise ValueError(
                    f"{name} is the float output of an INT8 linear that only quantises it for the "
                    "next one (its rows are not kept in the arena); build the backend with "
                    "fusion=FusionPolicy(quant_out_only=False) (zoi.graph.fusion) to read it"
                )
            tap_off, tap_out = (
                self.model.plan.offsets[name],
                np.empty((len(ids), b.cols), np.float32),
            )
            res[name] = tap_out
        self.engine.run_ex(ids, positions, types, cu, out, tap_off, tap_out)
        return res

    def memory(self) -> dict:
        e = self.engine
        return {
            "weights_bytes": int(e.weights_bytes),
            "arena_bytes": int(e.arena_bytes),
            "scratch_bytes": int(e.scratch_bytes),
            "isa": e.isa,
            "threads": int(e.nthreads),
        }
