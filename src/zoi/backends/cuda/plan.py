"""The CUDA backend's launch plan: which kernel runs each op of the IR, which ops fuse,
which linears read a pre-quantised int8 copy of their input and who writes it.

Fusion (decided once, from the IR): a ``linear`` whose only reader is the next op, an
``add_layernorm``, becomes one kernel (bias + residual + LayerNorm in the epilogue) when the
row fits one program (N <= opts.max_fused_n) and opts.fuse_ln (off by default: slower on the
H200). Per BERT layer: qkv, attention, o(+LN), ffn1+act, ffn2(+LN).
INT8 linears (every scheme of zoi.quant: dynamic, static, dynamic_asym, with SmoothQuant
act_mul / act_shift) mostly read an int8 copy of their input with a per-row a_scale (and zero
point), written by the producer when it sees whole rows (embed, add_layernorm, linear + LN:
the consumer's act_shift / act_mul applied first) or by a ``quantize`` launch of its own
(after attention / ffn1, when asymmetric or transformed); symmetric / static linears without
a transform after such a producer quantise while loading their fp16 input (row amax by float
atomic max, from a buffer the embed kernel zeroed). Details: docs/GPU.md, Numerics.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from zoi.backends.cuda.options import CudaOptions
from zoi.errors import BackendUnavailableError
from zoi.graph.quantmode import QuantMode


@dataclass
class Launch:
    kind: str  # embed | linear | attention | add_layernorm | quantize | pool
    op: object
    out: str
    ins: list[str]
    ln: object = None  # fused add_layernorm op (linear)
    res: str | None = None  # residual buffer
    mode: QuantMode = QuantMode.FLOAT  # linear: its INT8 / FP8 scheme (FLOAT: fp16 weights)
    prequant: bool = False  # linear: reads a pre-quantised int8 copy of its input
    static_amax: float = 0.0
    amax_out: int = 0  # 0 none, 1 atomic, 2 direct
    n: int = 0  # output cols
    k: int = 0  # input cols (linear)
    extra: dict = field(default_factory=dict)

    @property
    def quant(self) -> int:
        """The linear kernel's QUANT constexpr (kernels/linear.py), derived at this edge:
        0 float, 1 int8 quantised while loading (per-token amax), 2 static (in the loop),
        4 int8 A read from a pre-quantised copy, 8 FP8 (always a pre-quantised fp8 copy)."""
        if self.mode is QuantMode.FLOAT:
            return 0
        if self.mode is QuantMode.FP8:
            return 8
        if self.prequant:
            return 4
        return 2 if self.mode is QuantMode.STATIC else 1


def linear_mode(model, prefix: str) -> tuple[QuantMode, float]:
    """(mode, static amax) of one linear: FLOAT for FP16 and for weight-only INT8 (dequantised
    at pack time); the plan decides whether an INT8 one reads a pre-quantised copy (what
    DYNAMIC_ASYM and act_shift / act_mul need) or quantises while loading."""
    W, q = model.weights, model.quant.get(prefix)
    if model.precision == "fp8" and q is not None and q.scheme == QuantMode.FP8:
        return QuantMode.FP8, 0.0  # E4M3 weights packed by weights.py, dynamic scales
    if model.precision == "int8" and f"{prefix}.w_q" in W and (q is None or q.scheme != "fp32"):
        try:
            mode = QuantMode.parse(None if q is None else q.scheme, prefix)
        except ValueError as e:
            raise BackendUnavailableError(str(e)) from None
        return mode, float(q.amax) if mode is QuantMode.STATIC else 0.0
    return QuantMode.FLOAT, 0.0


def plan_launches(model, fuse: bool, opts: CudaOptions) -> dict:
    """The launch list of one plan (fuse: the fused plan of buckets >= fuse_min_tokens)."""
    g = model.graph
    ops = g.ops
    readers: dict[str, list[int]] = {}
    for i, op in enumerate(ops):
        for n in op.inputs:
            readers.setdefault(n, []).append(i)
    out: list[Launch] = []
    i = 0
    while i < len(ops):
        op = ops[i]
        if op.kind == "embed":
            cols = g.buffers[op.output].cols  # embed_size (Electra / ALBERT), else hidden
            out.append(Launch("embed", op, op.output, list(op.inputs), n=cols))
        elif op.kind == "linear":
            prefix = op.weights["w"].rsplit(".", 1)[0]
            mode, samax = linear_mode(model, prefix)
            wq = model.weights.get(f"{prefix}.w_q")
            N, K = wq.shape if wq is not None else model.weights[f"{prefix}.w"].shape
            L = Launch(
                "linear",
                op,
                op.output,
                [op.inputs[0]],
                mode=mode,
                static_amax=samax,
                n=int(N),
                k=int(K),
                res=op.inputs[1] if len(op.inputs) > 1 else None,
            )
            L.extra["prefix"] = prefix
            L.extra["transform"] = any(
                f"{prefix}.{t}" in model.weights for t in ("act_shift", "act_mul")
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
                and int(N) <= opts.max_fused_n
                and opts.fuse_ln
            ):
                L.ln, L.res, L.out = nxt, nxt.inputs[1], nxt.output
                i += 1
            out.append(L)
        elif op.kind == "attention":
            out.append(
                Launch(
                    "attention",
                    op,
                    op.output,
                    [op.inputs[0]],
                    n=op.attrs["heads"] * op.attrs["head_dim"],
                )
            )
        elif op.kind == "add_layernorm":
            out.append(
                Launch(
                    "add_layernorm",
                    op,
                    op.output,
                    [op.inputs[0]],
                    res=op.inputs[1],
                    n=model.spec.hidden,
                )
            )
        elif op.kind == "pool":
            out.append(Launch("pool", op, op.output, [op.inputs[0]], n=model.spec.hidden))
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
        rowq = (
            fuse
            and opts.rowq
            and P.kind == "linear"
            and P.res is None
            and (P.prequant or not P.mode.quantized)
        )
        return whole(P) or rowq

    qinfo: dict[str, dict] = {}
    final: list[Launch] = []
    for L in out:
        if L.kind != "linear" or not L.mode.quantized:
            final.append(L)
            continue
        X, P, sch, p = L.ins[0], producer[L.ins[0]], L.mode, L.extra["prefix"]
        tr = L.extra["transform"]
        fp8 = sch is QuantMode.FP8  # always an fp8 copy (the kernel has no in-loop FP8)
        if not tr and not fp8 and sch is not QuantMode.DYNAMIC_ASYM and not writes_q(P):
            final.append(L)  # QUANT 1 / 2: fp16 A, quantised while loading
            continue
        tag = p if tr else (f"static{L.static_amax!r}" if sch is QuantMode.STATIC else sch.value)
        if fp8 and tr:  # the arena views a copy named "...@fp8#q" as float8_e4m3fn
            tag = f"{p}@fp8"
        qname = f"{X}@{tag}#q"
        if qname not in qinfo:
            qinfo[qname] = dict(
                mode=sch, static_amax=L.static_amax, prefix=p if tr else None, k=L.k
            )
            if writes_q(P) and "q" not in P.extra:
                P.extra["q"] = qname
            else:
                final.append(Launch("quantize", L.op, qname, [X], n=L.k, k=L.k))
                final[-1].extra["q"] = qname
        L.prequant = True
        L.extra["qname"] = qname
        final.append(L)
    out = final
    # fp16 inputs quantised in the loop (QUANT 1) need a per-row amax from their producer
    need = {
        L.ins[0]
        for L in out
        if L.kind == "linear" and L.mode is QuantMode.DYNAMIC and not L.prequant
    }
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
        n + "#zp" for n, i in qinfo.items() if i["mode"] is QuantMode.DYNAMIC_ASYM
    ]
    return {
        "launches": out,
        "atomic": atomic,
        "direct": direct,
        "qinfo": qinfo,
        "scales": scales,
    }


FP8_MIN_CAPABILITY = (8, 9)


def require_fp8(capability, device_name: str = "this GPU") -> None:
    """precision="fp8" needs FP8 tensor cores (compute capability >= 8.9: Ada, Hopper);
    below that a BackendUnavailableError that names the fix."""
    if tuple(capability) < FP8_MIN_CAPABILITY:
        raise BackendUnavailableError(
            f"precision='fp8' needs a GPU with FP8 tensor cores (compute capability >= 8.9: "
            f"Ada, Hopper); {device_name} has {tuple(capability)}. Use precision='int8' or "
            "'fp16' on this GPU, or device='reference' to emulate FP8"
        )
