"""CudaBackend: Triton kernels, one weight buffer, one activation arena, one CUDA graph per
token-count bucket, and a per-call path through the CUDA driver API only.

Compile time (``__init__``), torch and triton are tools: torch allocates the two device
buffers (and gives Triton its stream), triton compiles the kernels, the forward of each
bucket is run once (warm-up) and captured with ``cuStreamBeginCapture`` on our own stream
into a graph, instantiated with ``cuGraphInstantiate``.

Per call (``run``): numpy writes ids / positions / cu_seqlens and a 4-int header into
pinned staging; ``cuMemcpyHtoDAsync``; ``cuGraphLaunch``; ``cuMemcpyDtoHAsync`` of the
pooled [B, H] fp32; ``cuStreamSynchronize``. Nothing else, no allocation; a lock makes
concurrent callers safe.

Fusion (decided once, from the IR): a ``linear`` whose only reader is the next op, an
``add_layernorm``, becomes one kernel (bias + residual + LayerNorm in the epilogue) when the
row fits one program (N <= MAX_FUSED_N, 512) and the bucket holds at least fuse_min_tokens
(FUSE_MIN_TOKENS, 2048) tokens. Per BERT layer: qkv, attention, o+LN, ffn1+act, ffn2+LN.
Activations are fp16 in the arena. INT8 linears (every scheme of zoi.quant: dynamic, static,
dynamic_asym, with SmoothQuant act_mul / act_shift) mostly read an int8 copy of their input
with a per-row a_scale (and zero point), written by the producer when it sees whole rows
(embed, add_layernorm, linear + LN: the consumer's act_shift / act_mul applied first) or by
a ``quantize`` launch of its own (after attention / ffn1, when asymmetric or transformed);
symmetric / static linears without a transform after such a producer quantise while loading
their fp16 input (row amax by float atomic max, from a buffer the embed kernel zeroed).
Details: docs/GPU.md, Numerics.

``interpret=True`` (or no GPU with TRITON_INTERPRET=1) runs the same launch list eagerly on
torch CPU tensors through the Triton interpreter: the CI test of everything but the graph.
"""

from __future__ import annotations

import gc
import logging
import os
import threading
from dataclasses import dataclass, field

import numpy as np

from zoi.backends.base import SyncSubmit
from zoi.errors import BackendUnavailableError, InputError
from zoi.numerics.primitives import dequantize_weight, fold_act_transform, weight_colsum

log = logging.getLogger("zoi")

ALIGN = 256
MAX_FUSED_N = 512  # LN fused into a linear's epilogue only when a row fits one program
# LN fused into o / ffn2: off, since the sweep (lab/gpu/sweep_linear.py, H200, gpu_sweep_
# 20261201T0959Z) found the fused launch slower than linear + add_layernorm at every bucket
# (minilm INT8 ffn2 at 32768 tokens: 181.8 us fused vs 46.7 + 30.6; at 4096: 41.3 vs 8.4 + 5.6)
FUSE_LN = False
FUSE_MIN_TOKENS = 2048  # the "fused" plan (LN fused / ROWQ where switched on) from this bucket
# ROWQ: ffn1 writes the int8 copy ffn2 reads (its programs own whole rows, loop over N), no
# quantize launch. Off: measured slower on the H200 (gpu_sweep_rowq_20261201T1023Z: minilm
# ffn1+copy 44.2 us at 4096 tokens vs 18.8 + 9.6 for ffn1 + quantize; 245.7 vs 191.6 at 32768;
# end to end 256x128 INT8 3243 vs 2927 us): a program walks its 12 N tiles one after another.
ROWQ = False
PDL_MAX_TOKENS = 64  # programmatic dependent launch: measured faster at 16 tokens, slower at 128+
# buckets up to this many tokens run the whole forward as ONE persistent launch (fp16 weights;
# kernels/persistent.py): at a few sequences the per-op graph is bound by ~44 kernel nodes
PERSISTENT_MAX_TOKENS = 256


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def default_buckets(max_tokens: int) -> list[int]:
    b, out = 16, []
    while b < max_tokens:
        out.append(b)
        b *= 2
    out.append(max_tokens)
    return out


@dataclass
class _Launch:
    kind: str  # embed | linear | attention | add_layernorm | quantize | pool
    op: object
    out: str
    ins: list[str]
    ln: object = None  # fused add_layernorm op (linear)
    res: str | None = None  # residual buffer
    quant: int = 0  # linear: 0 fp16, 1 int8 dynamic (in-loop), 2 static (in-loop), 4 int8 A
    static_amax: float = 0.0
    amax_out: int = 0  # 0 none, 1 atomic, 2 direct
    n: int = 0  # output cols
    k: int = 0  # input cols (linear)
    extra: dict = field(default_factory=dict)


class CudaBackend(SyncSubmit):  # async submit: issue 19 (gpusplit)
    name = "cuda"

    def __init__(
        self,
        model,
        buckets: list[int] | None = None,
        interpret: bool | None = None,
        fuse_min_tokens: int | None = None,
        pdl: bool | None = None,
        persistent_max: int | None = None,
    ):
        self.model = model
        self.spec = model.spec
        self.precision = model.precision
        if self.precision not in ("int8", "fp16", "fp32"):
            raise InputError(f"unknown precision {self.precision!r}")
        if self.precision == "fp32":
            log.warning(
                "zoi: device='cuda' computes precision='fp32' models in fp16 (fp16 weights and "
                "activations, fp32 accumulation); use precision='fp16' or 'int8' to say so"
            )
        self.max_tokens = int(model.plan.max_tokens)
        self.max_batch = int(min(model.plan.max_batch, self.max_tokens))
        self._lock = threading.Lock()
        self._init_device(interpret)
        self.fuse_min_tokens = FUSE_MIN_TOKENS if fuse_min_tokens is None else int(fuse_min_tokens)
        self.pdl = (
            (not self.eager and self.capability >= (9, 0))
            if pdl is None
            else bool(pdl and not self.eager)
        )
        self.plans = {f: self._plan_launches(f) for f in (False, True)}
        # the one-launch forward needs co-resident programs and a spinning grid barrier: GPU
        # only (the interpreter runs programs one after another); tests may force it
        self.persistent_max = (
            (0 if self.eager else PERSISTENT_MAX_TOKENS)
            if persistent_max is None
            else int(persistent_max)
        )
        # small buckets: "time" both forwards at compile time and keep the faster (default),
        # "force" the persistent one; ZOI_PERSISTENT=0 / 1 override
        self.persistent_choice = "time"
        if os.environ.get("ZOI_PERSISTENT") == "0":
            self.persistent_max = 0
        elif os.environ.get("ZOI_PERSISTENT") == "1":
            self.persistent_choice = "force"
        self.bucket_paths: dict[int, dict] = {}
        self._pplans: dict[int, object] = {}  # bucket -> PersistentPlan (its barrier flag)
        self.launches = self.plans[True]["launches"]
        self._pack_weights()
        self._alloc_arena()
        self.buckets = sorted(
            {min(int(b), self.max_tokens) for b in (buckets or default_buckets(self.max_tokens))}
        )
        self._graphs: dict[int, tuple] = {}
        self._layouts: dict[int, tuple[int, int, int, int]] = {}
        self._steps: dict[int, list] = {}
        for tb in self.buckets:
            try:
                self._build_bucket(tb)
            except Exception as e:  # noqa: BLE001 - PDL in graph capture needs a recent driver
                if not (self.pdl and tb <= PDL_MAX_TOKENS):
                    raise
                log.warning(
                    "zoi: programmatic dependent launch failed in capture (%s); without it", e
                )
                self.pdl = False
                self._build_bucket(tb)

    # ------------------------------------------------------------------ device
    def _init_device(self, interpret):
        try:
            import torch
            import triton  # noqa: F401
        except ImportError as e:
            raise BackendUnavailableError(
                f"device='cuda' needs torch and triton at compile time: {e}"
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
            self.dev = "cpu"
            self.sm = 8
            self.device_name = "triton interpreter (CPU)"
            return
        if env_interp:
            raise BackendUnavailableError("TRITON_INTERPRET=1 is set: unset it to run on the GPU")
        from zoi.backends.cuda import driver as drv

        drv.require()
        if not torch.cuda.is_available():
            raise BackendUnavailableError(
                "device='cuda': torch sees no CUDA device (driver missing or no GPU)"
            )
        self.drv = drv
        torch.cuda.init()
        torch.empty(1, device="cuda")  # the runtime's primary context exists from here
        self.cu_dev, self.ctx = drv.primary_context(torch.cuda.current_device())
        cap = drv.capability(self.cu_dev)
        if cap < (8, 0):
            raise BackendUnavailableError(
                f"device='cuda' needs compute capability >= 8.0, found {cap}"
            )
        self.capability = cap
        self.sm = drv.sm_count(self.cu_dev)
        self.device_name = drv.device_name(self.cu_dev)
        self.dev = "cuda"
        self._free0 = drv.mem_info()[0]
        self._reserved0 = torch.cuda.memory_reserved()
        self.stream = drv.new_stream()
        self.tstream = torch.cuda.ExternalStream(int(self.stream))

    # ------------------------------------------------------------------ plan
    def _linear_mode(self, prefix: str) -> tuple[int, float, str]:
        """(quant, static amax, scheme) of one linear: quant 0 float (FP16, or weight-only INT8
        dequantised at pack time), 1 per-token dynamic, 2 static; the plan may turn 1 / 2
        into 4 (A pre-quantised), which is what dynamic_asym and act_shift / act_mul need."""
        W, q = self.model.weights, self.model.quant.get(prefix)
        if self.precision == "int8" and f"{prefix}.w_q" in W and (q is None or q.scheme != "fp32"):
            scheme = "dynamic" if q is None else q.scheme
            if scheme == "static":
                return 2, float(q.amax), scheme
            if scheme not in ("dynamic", "dynamic_asym"):
                raise BackendUnavailableError(f"{prefix}: unknown INT8 scheme {scheme!r}")
            return 1, 0.0, scheme
        return 0, 0.0, "fp32"

    def _plan_launches(self, fuse: bool) -> dict:
        g = self.model.graph
        ops = g.ops
        readers: dict[str, list[int]] = {}
        for i, op in enumerate(ops):
            for n in op.inputs:
                readers.setdefault(n, []).append(i)
        out: list[_Launch] = []
        i = 0
        while i < len(ops):
            op = ops[i]
            if op.kind == "embed":
                cols = g.buffers[op.output].cols  # embed_size (Electra / ALBERT)
                out.append(_Launch("embed", op, op.output, list(op.inputs), n=cols))
            elif op.kind == "linear":
                prefix = op.weights["w"].rsplit(".", 1)[0]
                quant, samax, scheme = self._linear_mode(prefix)
                wq = self.model.weights.get(f"{prefix}.w_q")
                N, K = wq.shape if wq is not None else self.model.weights[f"{prefix}.w"].shape
                L = _Launch(
                    "linear",
                    op,
                    op.output,
                    [op.inputs[0]],
                    quant=quant,
                    static_amax=samax,
                    n=int(N),
                    k=int(K),
                    res=op.inputs[1] if len(op.inputs) > 1 else None,
                )
                L.extra["prefix"] = prefix
                L.extra["scheme"] = scheme
                L.extra["transform"] = any(
                    f"{prefix}.{t}" in self.model.weights for t in ("act_shift", "act_mul")
                )
                nxt = ops[i + 1] if i + 1 < len(ops) else None
                if (
                    fuse
                    and nxt is not None
                    and nxt.kind == "add_layernorm"
                    and nxt.inputs[0] == op.output
                    and readers.get(op.output) == [i + 1]
                    and L.res is None
                    and nxt.inputs[1] != op.output
                    and int(N) <= MAX_FUSED_N
                    and FUSE_LN
                ):
                    L.ln, L.res, L.out = nxt, nxt.inputs[1], nxt.output
                    i += 1
                out.append(L)
            elif op.kind == "attention":
                out.append(
                    _Launch(
                        "attention",
                        op,
                        op.output,
                        [op.inputs[0]],
                        n=op.attrs["heads"] * op.attrs["head_dim"],
                    )
                )
            elif op.kind == "add_layernorm":
                out.append(
                    _Launch(
                        "add_layernorm",
                        op,
                        op.output,
                        [op.inputs[0]],
                        res=op.inputs[1],
                        n=self.spec.hidden,
                    )
                )
            elif op.kind == "pool":
                out.append(_Launch("pool", op, op.output, [op.inputs[0]], n=self.spec.hidden))
            else:
                raise BackendUnavailableError(f"device='cuda' has no kernel for op {op.kind!r}")
            i += 1
        if not out or out[0].kind != "embed" or out[-1].kind != "pool":
            raise BackendUnavailableError(
                "device='cuda' expects a graph that starts with embed and ends with pool"
            )
        # INT8 linears that read a pre-quantised int8 copy of their input (QUANT 4): all those
        # whose producer sees whole rows (embed, add_layernorm, linear + LN: the producer writes
        # the copy in its epilogue), and those that need what the in-loop conversion cannot do
        # (dynamic_asym, act_shift / act_mul: a quantize launch of their own before them).
        # The copy is named per activation and quantisation ("X@tag#q"); one with the
        # consumer's own act_shift / act_mul is that consumer's alone.
        producer = {L.out: L for L in out}

        def whole(P):
            return P.kind in ("embed", "add_layernorm") or (P.kind == "linear" and P.ln is not None)

        def writes_q(P):  # whole rows, or a linear that can own whole rows (ROWQ)
            rowq = fuse and ROWQ and P.kind == "linear" and P.res is None and P.quant in (0, 4)
            return whole(P) or rowq

        qinfo: dict[str, dict] = {}
        final: list[_Launch] = []
        for L in out:
            if L.kind != "linear" or not L.quant:
                final.append(L)
                continue
            X, P, sch, p = L.ins[0], producer[L.ins[0]], L.extra["scheme"], L.extra["prefix"]
            tr = L.extra["transform"]
            if not tr and sch != "dynamic_asym" and not writes_q(P):
                final.append(L)  # QUANT 1 / 2: fp16 A, quantised while loading
                continue
            tag = p if tr else (f"static{L.static_amax!r}" if sch == "static" else sch)
            qname = f"{X}@{tag}#q"
            if qname not in qinfo:
                qinfo[qname] = dict(
                    mode=sch, static_amax=L.static_amax, prefix=p if tr else None, k=L.k
                )
                if writes_q(P) and "q" not in P.extra:
                    P.extra["q"] = qname
                else:
                    final.append(_Launch("quantize", L.op, qname, [X], n=L.k, k=L.k))
                    final[-1].extra["q"] = qname
            L.quant = 4
            L.extra["qname"] = qname
            final.append(L)
        out = final
        # fp16 inputs quantised in the loop (QUANT 1) need a per-row amax from their producer
        need = {L.ins[0] for L in out if L.kind == "linear" and L.quant == 1}
        atomic, direct = [], []
        for L in out:
            if L.out in need:
                if whole(L):
                    L.amax_out = 2
                    direct.append(L.out)
                else:
                    L.amax_out = 1
                    atomic.append(L.out)
        # per-row a_scale (and zero point) of every int8 copy
        scales = [n for n in qinfo] + [
            n + "#zp" for n, i in qinfo.items() if i["mode"] == "dynamic_asym"
        ]
        return {
            "launches": out,
            "atomic": atomic,
            "direct": direct,
            "qinfo": qinfo,
            "scales": scales,
        }

    # ------------------------------------------------------------------ weights
    def _pack_weights(self):
        torch, W = self.torch, self.model.weights
        items: dict[str, np.ndarray] = {}  # packed name -> array (both plans share weights)

        def add(key, arr):
            if key not in items:
                items[key] = np.ascontiguousarray(arr)

        def f16(a):
            a = np.asarray(a, np.float32)
            if np.abs(a).max(initial=0) > 65504:
                raise InputError("a weight exceeds the fp16 range; use precision='int8'")
            return a.astype(np.float16)

        f32 = lambda a: np.asarray(a, np.float32)  # noqa: E731
        for L in self.plans[False]["launches"] + self.plans[True]["launches"]:
            op = L.op
            if L.kind == "embed":
                w = op.weights
                if "embed.word_q" in W and "embed.word" not in W:
                    add("embed.word_q", W["embed.word_q"])
                    add("embed.word_scale", f32(W["embed.word_scale"]))
                else:
                    add("embed.word", f16(W[w["word"]]))
                add("embed.pos", f16(W[w["pos"]]))
                if "type" in w:
                    add("embed.type0", f16(W[w["type"]][0]))
                add("embed.ln.w", f32(W[w["ln_w"]]))
                add("embed.ln.b", f32(W[w["ln_b"]]))
            elif L.kind == "linear":
                p = L.extra["prefix"]
                shift, mul = W.get(f"{p}.act_shift"), W.get(f"{p}.act_mul")
                if L.quant:
                    add(f"{p}.w_q", np.asarray(W[f"{p}.w_q"], np.int8))
                    add(f"{p}.w_scale", f32(W[f"{p}.w_scale"]))
                    if L.extra["scheme"] == "dynamic_asym":  # sum_k w_q[n, k], exact in int32
                        add(f"{p}.colsum", weight_colsum(W[f"{p}.w_q"]).astype(np.int32))
                    for t, v in (("act_shift", shift), ("act_mul", mul)):
                        if v is not None:  # applied by whoever writes the int8 copy
                            add(f"{p}.{t}", f32(v))
                    add(f"{p}.b", f32(W[f"{p}.b"]))
                elif f"{p}.w" not in items:
                    # float linear (FP16, or weight-only INT8 dequantised here), with its
                    # act_shift / act_mul folded in (exact in real arithmetic)
                    w = (
                        W[f"{p}.w"]
                        if f"{p}.w" in W
                        else dequantize_weight(W[f"{p}.w_q"], W[f"{p}.w_scale"])
                    )
                    w, b = fold_act_transform(w, W[f"{p}.b"], shift, mul)
                    add(f"{p}.w", f16(w))
                    add(f"{p}.b", f32(b))
                if L.ln is not None:  # fused LN: params under the add_layernorm's output name
                    add(f"{L.out}.ln.w", f32(W[L.ln.weights["w"]]))
                    add(f"{L.out}.ln.b", f32(W[L.ln.weights["b"]]))
            elif L.kind == "add_layernorm":
                add(f"{op.output}.ln.w", f32(W[op.weights["w"]]))
                add(f"{op.output}.ln.b", f32(W[op.weights["b"]]))
        offs, total = {}, 0
        for key, a in items.items():
            offs[key] = (total, a)
            total = _align(total + a.nbytes)
        blob = np.zeros(total, np.uint8)
        for o, a in offs.values():
            blob[o : o + a.nbytes] = a.reshape(-1).view(np.uint8)
        self.wbuf = torch.from_numpy(blob).to(self.dev)  # the one weight buffer
        self.weights_bytes = total
        self.w = {}
        for key, (o, a) in offs.items():
            tdt = {
                np.dtype(np.float16): torch.float16,
                np.dtype(np.float32): torch.float32,
                np.dtype(np.int8): torch.int8,
                np.dtype(np.int32): torch.int32,
            }[a.dtype]
            self.w[key] = self.wbuf[o : o + a.nbytes].view(tdt).view(a.shape)

    # ------------------------------------------------------------------ arena
    @staticmethod
    def _place(launches, T) -> tuple[dict, dict, int]:
        """Liveness over one launch list, first fit by size, fp16 rows of T tokens."""
        cols: dict[str, int] = {}
        live: dict[str, list[int]] = {}
        for i, L in enumerate(launches):
            reads = L.ins + ([L.res] if L.res else [])
            if L.kind == "linear" and L.quant == 4:
                reads = [L.extra["qname"]] + reads[1:]
            for n in reads:
                if n in live:
                    live[n][1] = i
            if L.kind != "pool":
                cols[L.out] = L.n
                live[L.out] = [i, i]
                if L.kind != "quantize" and L.extra.get("q"):  # the int8 copy it also writes
                    cols[L.extra["q"]] = L.n
                    live[L.extra["q"]] = [i, i]
        # fp16 activations, int8 ("#q") per-token quantised copies
        sizes = {n: _align(T * c * (1 if n.endswith("#q") else 2)) for n, c in cols.items()}
        placed, offs = [], {}
        for n in sorted(sizes, key=lambda n: (-sizes[n], live[n][0])):
            s0, e0 = live[n]
            off = 0
            for a, b in sorted((o, o + sz) for o, sz, s1, e1 in placed if s1 <= e0 and s0 <= e1):
                if off + sizes[n] <= a:
                    break
                off = max(off, b)
            offs[n] = off
            placed.append((off, sizes[n], s0, e0))
        return offs, cols, max((o + sz for o, sz, _, _ in placed), default=0)

    def _alloc_arena(self):
        """One arena: activations (both plans share the region, one runs at a time), per-row
        amax / a_scale / zero point, the attention tile table, the call's input staging and the pooled output."""
        torch, T, Bmax = self.torch, self.max_tokens, self.max_batch
        act_bytes, n_amax = 0, 1
        for plan in self.plans.values():
            plan["offs"], plan["cols"], nb = self._place(plan["launches"], T)
            act_bytes = max(act_bytes, nb)
            # atomic first: the embed kernel zeroes rows [0, n_atomic); then the a_scale / zp
            # rows of the int8 copies (zp rows hold int32)
            names = plan["atomic"] + plan["direct"] + plan["scales"]
            plan["amax_row"] = {n: i for i, n in enumerate(names)}
            n_amax = max(n_amax, len(names))
        self.hdr_ints = _align((4 + Bmax + 1) * 4) // 4  # header [flag, B, T, 0] + cu_seqlens
        regions = [
            ("act", act_bytes),
            ("amax", n_amax * T * 4),
            ("tcum", Bmax * 4),
            ("in", (self.hdr_ints + 2 * T) * 4),
            ("out", Bmax * self.spec.hidden * 4),
        ]
        roff, total = {}, 0
        for name, nb in regions:
            roff[name] = total
            total = _align(total + max(nb, 4))
        self.arena = torch.zeros(total, dtype=torch.uint8, device=self.dev)  # the one arena
        self.arena_bytes = total
        self.act_bytes = act_bytes
        self._roff = roff
        ab = self.arena[roff["amax"] : roff["amax"] + n_amax * T * 4].view(torch.float32)
        self.amax_region = ab.view(n_amax, T)
        self.tcum = self.arena[roff["tcum"] : roff["tcum"] + Bmax * 4].view(torch.int32)
        self.d_in = self.arena[roff["in"] : roff["in"] + (self.hdr_ints + 2 * T) * 4].view(
            torch.int32
        )
        self.d_out = self.arena[roff["out"] : roff["out"] + Bmax * self.spec.hidden * 4].view(
            torch.float32
        )
        self.d_out = self.d_out.view(Bmax, self.spec.hidden)
        if self.eager:
            self.h_in = np.zeros(self.hdr_ints + 2 * T, np.int32)
            self.h_out = np.zeros((Bmax, self.spec.hidden), np.float32)
        else:
            self.p_in = self.drv.Pinned((self.hdr_ints + 2 * T) * 4)
            self.p_out = self.drv.Pinned(Bmax * self.spec.hidden * 4)
            self.h_in = self.p_in.view(np.int32, 0, self.hdr_ints + 2 * T)
            self.h_out = self.p_out.view(np.float32, 0, Bmax * self.spec.hidden).reshape(
                Bmax, self.spec.hidden
            )
            self.h_in[:] = 0
            from zoi.backends.cuda.driver import cu

            self._cu = cu
            self._d_in_ptr = cu.CUdeviceptr(self.d_in.data_ptr())
            self._d_out_ptr = cu.CUdeviceptr(self.d_out.data_ptr())

    def _act(self, plan: dict, name: str, rows: int):
        c = plan["cols"][name]
        o = plan["offs"][name]
        if name.endswith("#q"):
            return self.arena[o : o + rows * c].view(self.torch.int8).view(rows, c)
        return self.arena[o : o + rows * c * 2].view(self.torch.float16).view(rows, c)

    # ------------------------------------------------------------------ buckets
    def plan_for(self, tb: int) -> dict:
        return self.plans[tb >= self.fuse_min_tokens]

    def _steps_for(self, tb: int, persistent: bool | None = None) -> list:
        """The launch list of one bucket: closures over fixed device views (captured as is).
        persistent: the one-launch forward (default: for buckets <= persistent_max)."""
        if persistent is None:
            persistent = tb <= self.persistent_max
        if persistent:
            from zoi.backends.cuda.persistent import PersistentPlan, PersistentUnsupported

            try:
                plan = PersistentPlan(self, tb)
                self._pplans[tb] = plan
                if not self.eager and not hasattr(self, "p_flag"):
                    self.p_flag = self.drv.Pinned(8)  # the barrier error flag, copied per call
                    self.h_flag = self.p_flag.view(np.int64, 0, 1)
                return plan.steps()
            except PersistentUnsupported as e:
                log.info("zoi: bucket %d keeps the per-op kernels (%s)", tb, e)
                self.persistent_max = 0
        from zoi.backends.cuda.kernels import attention as k_attn
        from zoi.backends.cuda.kernels import embed as k_embed
        from zoi.backends.cuda.kernels import layernorm as k_ln
        from zoi.backends.cuda.kernels import linear as k_lin
        from zoi.backends.cuda.kernels import pool as k_pool
        from zoi.backends.cuda.kernels import quantize as k_q

        T = self.max_tokens
        plan = self.plan_for(tb)
        pdl = self.pdl and tb <= PDL_MAX_TOKENS
        nseq = min(self.max_batch, tb)
        hdr = self.d_in[: self.hdr_ints]
        cu = self.d_in[4 : 4 + self.max_batch + 1]
        ids = self.d_in[self.hdr_ints : self.hdr_ints + tb]
        pos = self.d_in[self.hdr_ints + tb : self.hdr_ints + 2 * tb]
        hd = next((L.op.attrs["head_dim"] for L in plan["launches"] if L.kind == "attention"), 32)
        acfg = k_attn.pick_config(tb, hd)
        steps, w, sp = [], self.w, self.spec
        rows = plan["amax_row"]
        amx = lambda n: self.amax_region[rows[n]] if n in rows else None  # noqa: E731
        act = lambda n: self._act(plan, n, tb)  # noqa: E731
        qinfo = plan["qinfo"]

        def qrow(qname):  # (a_scale fp32 [T], zero point int32 [T] or None) of an int8 copy
            zp = rows.get(qname + "#zp")
            return self.amax_region[rows[qname]], (
                self.amax_region[zp].view(self.torch.int32) if zp is not None else None
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
                steps.append(
                    lambda x=x, L=L, nz=nz, qo=qout(L): k_embed.launch_embed(
                        ids,
                        pos,
                        w.get("embed.word_q", w.get("embed.word")),
                        w.get("embed.word_scale"),
                        w["embed.pos"],
                        w.get("embed.type0"),
                        w["embed.ln.w"],
                        w["embed.ln.b"],
                        x,
                        amx(L.out) if L.amax_out else None,
                        self.amax_region,
                        tb,
                        L.n,
                        nz,
                        T,
                        L.op.attrs["eps"],
                        tiles=(hdr, cu, self.tcum, acfg["BLOCK_M"], k_attn.block_b(nseq)),
                        pdl=pdl,
                        **qo,
                    )
                )
            elif L.kind == "linear":
                p = L.extra["prefix"]
                a, y = act(L.extra["qname"] if L.quant == 4 else L.ins[0]), act(L.out)
                r = act(L.res) if L.res else None
                ln = L.ln is not None
                rowq = bool(L.extra.get("q")) and not ln
                cfg = k_lin.pick_config(
                    tb, L.n, L.k, L.quant != 0, ln, prequant=L.quant == 4, rowq=rowq
                )
                a_sc, a_zp = qrow(L.extra["qname"]) if L.quant == 4 else (amx(L.ins[0]), None)
                steps.append(
                    lambda a=a, y=y, r=r, L=L, p=p, ln=ln, cfg=cfg, a_sc=a_sc, a_zp=a_zp, qo=qout(L): (
                        k_lin.launch_linear(
                            a,
                            a_sc,
                            w[f"{p}.w_q"] if L.quant else w[f"{p}.w"],
                            w[f"{p}.w_scale"] if L.quant else None,
                            w[f"{p}.b"],
                            r,
                            w[f"{L.out}.ln.w"] if ln else None,
                            w[f"{L.out}.ln.b"] if ln else None,
                            y,
                            amx(L.out) if L.amax_out else None,
                            tb,
                            L.n,
                            L.k,
                            quant=L.quant,
                            act=L.op.attrs.get("act", "none"),
                            static_amax=L.static_amax,
                            eps=L.ln.attrs["eps"] if ln else 1e-12,
                            ln=ln,
                            amax_out_mode=L.amax_out,
                            cfg=cfg,
                            pdl=pdl,
                            a_zp=a_zp,
                            colsum=w.get(f"{p}.colsum") if a_zp is not None else None,
                            **qo,
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
                qkv, o = act(L.ins[0]), act(L.out)
                at = L.op.attrs
                steps.append(
                    lambda qkv=qkv, o=o, L=L, at=at: k_attn.launch_attention(
                        qkv,
                        hdr,
                        cu,
                        self.tcum,
                        o,
                        amx(L.out) if L.amax_out else None,
                        tb,
                        nseq,
                        at["heads"],
                        at["head_dim"],
                        at["scale"],
                        cfg=acfg,
                        pdl=pdl,
                    )
                )
            elif L.kind == "add_layernorm":
                x, r, y = act(L.ins[0]), act(L.res), act(L.out)
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
                    )
                )
            elif L.kind == "pool":
                x = act(L.ins[0])
                steps.append(
                    lambda x=x, L=L: k_pool.launch_pool(
                        x, cu, hdr, self.d_out, nseq, sp.hidden, L.op.attrs["mode"], pdl=pdl
                    )
                )
        return steps

    def _layout(self, tb: int) -> tuple[int, int, int]:
        """(ids offset, positions offset, ints to copy) in the input staging for bucket tb."""
        return self.hdr_ints, self.hdr_ints + tb, self.hdr_ints + 2 * tb

    def _stage(self, ids, positions, cu_seqlens, normalize, tb) -> tuple[int, int]:
        T, B = len(ids), len(cu_seqlens) - 1
        io, po, n = self._layout(tb)
        h = self.h_in
        h[0], h[1], h[2] = 1 if normalize else 0, B, T
        h[4 : 4 + B + 1] = cu_seqlens
        h[io : io + T] = ids
        h[io + T : io + tb] = 0
        h[po : po + T] = positions
        h[po + T : po + tb] = 0
        return n, B

    def _build_bucket(self, tb: int):
        """Compile, warm up and capture the forward of bucket tb. For small buckets both the
        persistent one-launch forward and the per-op graph are built and timed on this GPU
        (back-to-back launches, alternating rounds); the faster is kept. Which one won, with
        both times, is in ``memory()["bucket_paths"]``."""
        want_p = tb <= self.persistent_max
        if not want_p or self.eager or self.persistent_choice == "force":
            steps = self._steps_for(tb)
            self._steps[tb] = steps
            self._graphs[tb] = self._capture(tb, steps)
            path = "persistent" if tb <= self.persistent_max else "per-op"
            self.bucket_paths[tb] = {"path": path}
            return
        built = {}
        for persistent in (True, False):
            steps = self._steps_for(tb, persistent=persistent)
            if persistent and tb > self.persistent_max:  # unsupported model: per-op only
                built[False] = (steps, self._capture(tb, steps))
                break
            built[persistent] = (steps, self._capture(tb, steps))
        times = {m: [] for m in built}
        for _ in range(3):
            for m, (_steps, g) in built.items():
                times[m].append(self._time_graph(g[1]))
        us = {m: min(t) for m, t in times.items()}
        keep = min(us, key=us.get)
        for m, (_steps, g) in built.items():
            if m != keep:
                self._cu.cuGraphExecDestroy(g[1])
                self._cu.cuGraphDestroy(g[0])
        if not keep:
            self._pplans.pop(tb, None)
        self._steps[tb], self._graphs[tb] = built[keep]
        self.bucket_paths[tb] = {
            "path": "persistent" if keep else "per-op",
            **{("persistent_us" if m else "per_op_us"): round(v, 2) for m, v in us.items()},
        }
        if not keep and tb <= self.persistent_max:
            log.info("zoi: bucket %d: per-op graph faster than the persistent forward %s", tb, us)

    def _time_graph(self, gexec, n: int = 20) -> float:
        """µs per launch of an instantiated graph, n back-to-back launches (device-bound)."""
        import time

        cuda, chk = self._cu, self.drv.check
        chk(cuda.cuGraphLaunch(gexec, self.stream))
        chk(cuda.cuStreamSynchronize(self.stream))
        t0 = time.perf_counter()
        for _ in range(n):
            chk(cuda.cuGraphLaunch(gexec, self.stream))
        chk(cuda.cuStreamSynchronize(self.stream))
        return (time.perf_counter() - t0) / n * 1e6

    def _stage_random(self, tb: int, seed: int, normalize: bool = False) -> int:
        """Stage one sequence of tb random tokens (host staging); returns the ints to copy."""
        rng = np.random.default_rng(seed)
        ids = rng.integers(0, int(self.spec.vocab_size), tb).astype(np.int32)
        P = int(self.model.weights[self.plans[True]["launches"][0].op.weights["pos"]].shape[0])
        pos = (np.arange(tb) % P).astype(np.int32)
        return self._stage(ids, pos, np.array([0, tb], np.int32), normalize, tb)[0]

    def _capture(self, tb: int, steps: list):
        """Warm up (compiles every kernel of the bucket) and capture one bucket's steps."""
        n = self._stage_random(tb, seed=tb)  # warm-up input: one sequence of tb tokens
        if self.eager:
            return None
        torch, drv, cuda = self.torch, self.drv, self._cu
        drv.check(cuda.cuMemcpyHtoDAsync(self._d_in_ptr, self.p_in.ptr, n * 4, self.stream))
        with torch.cuda.stream(self.tstream):
            for s in steps:  # compile + run once outside the capture
                s()
        drv.check(cuda.cuStreamSynchronize(self.stream))
        # no garbage collection inside the capture: a collected torch CUDAGraph (of anyone's)
        # calls into CUDA and invalidates the capture (seen on the H200)
        gc.collect()
        gc_was = gc.isenabled()
        gc.disable()
        drv.begin_capture(self.stream)
        try:
            with torch.cuda.stream(self.tstream):
                for s in steps:
                    s()
        finally:
            graph, gexec, nodes = drv.end_capture(self.stream)
            if gc_was:
                gc.enable()
        return (graph, gexec, nodes)

    # ------------------------------------------------------------------ run
    def run(self, ids, positions, cu_seqlens, normalize: bool) -> np.ndarray:
        ids = np.asarray(ids, np.int32)
        T, B = int(ids.shape[0]), int(len(cu_seqlens) - 1)
        if T > self.max_tokens or B > self.max_batch or T < 1 or B < 1:
            raise InputError(
                f"batch of {T} tokens / {B} sequences exceeds this engine "
                f"(max_tokens {self.max_tokens}, max_batch {self.max_batch})"
            )
        tb = next(b for b in self.buckets if b >= T)
        H = self.spec.hidden
        with self._lock:
            n, B = self._stage(ids, positions, cu_seqlens, normalize, tb)
            if self.eager:
                self.d_in[:n] = self.torch.from_numpy(self.h_in[:n].copy())
                for s in self._steps[tb]:
                    s()
                if tb in self._pplans and self._pplans[tb].barrier_timed_out():
                    self._barrier_failed(tb)
                return self.d_out[:B].numpy().copy()
            cuda, chk = self._cu, self.drv.check
            chk(cuda.cuCtxSetCurrent(self.ctx))
            chk(cuda.cuMemcpyHtoDAsync(self._d_in_ptr, self.p_in.ptr, n * 4, self.stream))
            chk(cuda.cuGraphLaunch(self._graphs[tb][1], self.stream))
            chk(cuda.cuMemcpyDtoHAsync(self.p_out.ptr, self._d_out_ptr, B * H * 4, self.stream))
            plan = self._pplans.get(tb)
            if plan is not None:  # the persistent forward's barrier flag (8 bytes, same stream)
                flag = cuda.CUdeviceptr(plan.bar[1:].data_ptr())
                chk(cuda.cuMemcpyDtoHAsync(self.p_flag.ptr, flag, 8, self.stream))
            chk(cuda.cuStreamSynchronize(self.stream))
            if plan is not None and self.h_flag[0] != 0:
                self._barrier_failed(tb)
            return self.h_out[:B].copy()

    def run_into(self, ids, positions, cu_seqlens, normalize: bool, out: np.ndarray) -> np.ndarray:
        out[: len(cu_seqlens) - 1] = self.run(ids, positions, cu_seqlens, normalize)
        return out

    def _barrier_failed(self, tb: int):
        """A grid barrier of the persistent forward gave up waiting (its programs were not all
        resident: the GPU is shared with long-running work): the result is void. The flag is
        cleared (every program still arrived at every barrier, so the counter stays aligned
        and the next call is sound) and the call fails loudly rather than return garbage."""
        plan = self._pplans[tb]
        plan.bar[1:].zero_()
        if not self.eager:
            self.torch.cuda.synchronize()
            self.h_flag[0] = 0
        raise BackendUnavailableError(
            f"cuda: the one-launch forward of bucket {tb} timed out in a grid barrier (its "
            "programs were not all resident: is the GPU shared with long-running work?); this "
            "call's result was discarded. Retry, or set ZOI_PERSISTENT=0 for per-op graphs"
        )

    def memory(self) -> dict:
        out = {
            "weights_bytes": int(self.weights_bytes),
            "arena_bytes": int(self.arena_bytes),
            "activation_bytes": int(self.act_bytes),
            "buckets": list(self.buckets),
            "kernels_per_forward": {
                tb: 1
                if self.bucket_paths.get(tb, {}).get("path") == "persistent"
                else len(self.plan_for(tb)["launches"])
                for tb in self.buckets
            },
            "persistent_max": self.persistent_max,
            "bucket_paths": {tb: dict(v) for tb, v in self.bucket_paths.items()},
            "fuse_min_tokens": self.fuse_min_tokens,
            "pdl": self.pdl,
            "device": self.device_name,
        }
        if not self.eager:
            out["pinned_bytes"] = int(self.p_in.nbytes + self.p_out.nbytes)
            out["graph_nodes"] = {tb: g[2] for tb, g in self._graphs.items()}
            out["device_bytes_used"] = int(self._free0 - self.drv.mem_info()[0])
            out["torch_reserved_bytes"] = int(self.torch.cuda.memory_reserved() - self._reserved0)
        return out

    def __del__(self):
        try:
            if not getattr(self, "eager", True):
                for _graph, gexec, _ in self._graphs.values():
                    self._cu.cuGraphExecDestroy(gexec)
                    self._cu.cuGraphDestroy(_graph)
                self.p_in.free()
                self.p_out.free()
                if hasattr(self, "p_flag"):
                    self.p_flag.free()
        except Exception:
            pass
