"""The CUDA backend's launch plan: which kernel runs each op of the IR, as the IR's fusion
attributes (zoi.graph.fusion, decided once for every backend) say; what this backend does not
realise is recorded in the plan's "fallbacks", never silently.

Per BERT layer: qkv, attention, o, add_layernorm, ffn1+act, ffn2, add_layernorm. The LayerNorm
runs on its own: o / ffn2 + LN in one kernel measured slower than linear + add_layernorm at every
bucket on the H200 (lab/gpu/NOTES.md), so the linear has no norm epilogue.
INT8 linears (every scheme of zoi.quant: dynamic, static, dynamic_asym, with SmoothQuant
act_mul / act_shift) mostly read an int8 copy of their input with a per-row a_scale (and zero
point), written by the producer when it sees whole rows (embed, add_layernorm, glu: the
consumer's act_shift / act_mul applied first) or by a ``quantize`` launch of its own
(after attention / ffn1, when asymmetric or transformed); symmetric / static linears without
a transform after such a producer quantise while loading their fp16 input (row amax by float
atomic max, from a buffer the embed kernel zeroed). Details: docs/GPU.md, Numerics.

Linears over the B pooled rows (sentence-transformers' Dense modules after the pool) run on
fp32 [max_batch, N] rows of the arena with FP16 weights; the pool they read writes its rows
there unnormalised, and a last pool launch ("rows" mode) copies the last module's rows into
the call's output, normalised on request.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from zoi.errors import BackendUnavailableError
from zoi.graph.fusion import annotate
from zoi.graph.quantmode import QuantMode


@dataclass
class Launch:
    kind: str  # embed | linear | attention | add_layernorm | quantize | pool | glu | sparse_pool
    # (a linear with extra["splade"]: the MLM decoder fused with SPLADE's pool, out = the pool's)
    op: object
    out: str
    ins: list[str]
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


def _annotate(model):
    try:
        return annotate(model)
    except ValueError as e:
        raise BackendUnavailableError(str(e)) from None


def plan_launches(model) -> dict:
    """The launch list every per-op bucket runs, as the IR's fusion attributes say
    (zoi.graph.fusion); what this backend does not realise is listed in the plan's "fallbacks"
    (IR buffer or copy -> reason)."""
    g = _annotate(model)
    ops = g.ops
    fallbacks: dict[str, str] = {}
    out: list[Launch] = []
    i = 0
    while i < len(ops):
        op = ops[i]
        if op.kind == "embed":
            cols = g.buffers[op.output].cols  # embed_size (Electra / ALBERT), else hidden
            out.append(Launch("embed", op, op.output, list(op.inputs), n=cols))
        elif op.kind == "linear" and g.buffers[op.output].rows == "B":
            out.append(_rows_linear(model, op, g, fallbacks))
        elif op.kind == "linear":
            prefix = op.prefix
            mode = op.attrs["quant"]
            samax = op.attrs.get("quant_static_amax", 0.0)
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
            L.extra["transform"] = bool(op.attrs.get("quant_transform", False))
            nxt = ops[i + 1] if i + 1 < len(ops) else None
            if _splade_of(nxt, op, ops) and L.res is None:
                # the MLM decoder with SPLADE's max over tokens in its epilogue
                # (kernels/sparse_pool.py GEMM): [B, V] fp32 in the arena, no [T, V] logits
                L.out, L.n = nxt.output, int(N)
                L.extra.update(splade=True, out_bytes=_max_batch(model) * int(N) * 4)
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
                    res=op.inputs[1] if len(op.inputs) > 1 else None,  # one input: LN(x)
                    n=g.buffers[op.output].cols,
                )
            )
        elif op.kind == "glu":  # kernels/glu.py (ModernBERT's GeGLU)
            out.append(Launch("glu", op, op.output, [op.inputs[0]], n=g.buffers[op.output].cols))
        elif op.kind == "pool" and op.attrs["mode"] == "splade":
            # not after its decoder linear: kernels/sparse_pool.py over stored fp16 logits,
            # fp32 [max_batch, V] into the arena, copied back by run_outputs
            V = g.buffers[op.output].cols
            la = Launch("sparse_pool", op, op.output, [op.inputs[0]], n=V)
            la.extra["out_bytes"] = _max_batch(model) * V * 4
            out.append(la)
            fallbacks[op.inputs[0]] = "SPLADE logits stored: no decoder linear fused with the pool"
        elif op.kind == "pool":
            la = Launch("pool", op, op.output, [op.inputs[0]], n=model.spec.hidden)
            if op.output != g.output:  # Dense modules read it: fp32 [max_batch, H] in the arena
                la.extra["out_bytes"] = _max_batch(model) * la.n * 4
            out.append(la)
        else:
            raise BackendUnavailableError(f"device='cuda' has no kernel for op {op.kind!r}")
        i += 1
    if out and out[-1].extra.get("rows") == "B":
        # the Dense modules' output: copied (normalised on request) into the call's output rows
        # by the pool kernel reading one row per sequence
        la = Launch("pool", out[-1].op, out[-1].out + "#out", [out[-1].out], n=out[-1].n)
        la.extra["mode"] = "rows"
        out.append(la)
    tail_ok = out and (
        out[-1].kind in ("pool", "sparse_pool")
        or out[-1].extra.get("splade")
        or (out[-1].kind == "linear" and g.buffers[out[-1].out].rows == "T")  # token logits
    )
    if not out or out[0].kind != "embed" or not tail_ok:
        raise BackendUnavailableError(
            "device='cuda' expects a graph that starts with embed and ends with pool "
            "(or per-token logits)"
        )
    # INT8 linears read the int8 copy the IR names (quant_in). Its writer (quant_in_by) writes
    # it in its epilogue where it sees whole rows: embed, add_layernorm, glu. A linear's tile
    # sees part of a row: the copy the IR gives it (ffn1 -> ffn2) is made at the consumer (a
    # linear owning whole rows measured slower than ffn1 + a quantize launch on the H200,
    # lab/gpu/NOTES.md): quantised while loading the fp16 input where the IR allows it
    # (quant_in_loop: QUANT 1 / 2), else by a quantize launch of its own before it.
    producer = {L.out: L for L in out}

    def whole(P):  # its kernel sees whole rows: it writes the int8 copy / a plain amax
        return P.kind in ("embed", "add_layernorm", "glu")

    def can_write(P, why: dict) -> bool:
        if whole(P):
            return True
        why["r"] = f"a {P.kind} launch writes no int8 copy"
        return False

    qinfo: dict[str, dict] = {}
    final: list[Launch] = []
    for L in out:
        if L.kind != "linear" or not L.mode.quantized:
            final.append(L)
            continue
        op = L.op
        X, P, p = L.ins[0], producer[L.ins[0]], L.extra["prefix"]
        qname, by = op.attrs["quant_in"], op.attrs["quant_in_by"]
        why: dict = {}
        writes = by is not None and by == P.out and ("q" not in P.extra or P.extra["q"] == qname)
        writes = writes and can_write(P, why)
        if by is not None and not writes:
            fallbacks.setdefault(qname, f"made at the consumer: {why.get('r', 'no writer')}")
        if not writes and op.attrs["quant_in_loop"]:
            final.append(L)  # QUANT 1 / 2: fp16 A, quantised while loading
            continue
        if qname not in qinfo:
            qinfo[qname] = dict(
                mode=L.mode,
                static_amax=L.static_amax,
                prefix=p if L.extra["transform"] else None,
                k=L.k,
            )
            if writes:
                P.extra["q"] = qname
            else:
                final.append(Launch("quantize", L.op, qname, [X], n=L.k, k=L.k))
                final[-1].extra["q"] = qname
        L.prequant = True
        L.extra["qname"] = qname
        final.append(L)
    from zoi.backends.cuda.first_row import first_rows

    out = first_rows(model, final, fallbacks, warn=True)
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
        "fallbacks": fallbacks,
    }


def _rows_linear(model, op, g, fallbacks: dict) -> Launch:
    """A linear over the B pooled rows (sentence-transformers' Dense modules): fp32 [max_batch,
    N] in the arena, FP16 weights (an INT8 scheme of the IR runs dequantised: a quantize launch
    would cost more than a GEMM of a few rows; recorded in the fallbacks)."""
    prefix = op.prefix
    wq = model.weights.get(f"{prefix}.w_q")
    N, K = wq.shape if wq is not None else model.weights[f"{prefix}.w"].shape
    if op.attrs["quant"].quantized:
        fallbacks[op.output] = (
            f"{prefix}: fp16 weights on the pooled rows, not {op.attrs['quant'].value} "
            "(a few rows: the weights dequantised once)"
        )
    la = Launch("linear", op, op.output, [op.inputs[0]], n=int(N), k=int(K))
    la.extra.update(prefix=prefix, transform=False, rows="B")
    la.extra["out_bytes"] = _max_batch(model) * int(N) * 4
    return la


def _max_batch(model) -> int:
    """Sequences per call at most: the rows of a [B, ...] output (CudaBackend.max_batch)."""
    return int(min(model.plan.max_batch, model.plan.max_tokens))


def _splade_of(nxt, op, ops) -> bool:
    """Whether nxt is SPLADE's pool of op's output and nothing else reads that output."""
    return (
        nxt is not None
        and nxt.kind == "pool"
        and nxt.attrs.get("mode") == "splade"
        and nxt.inputs[0] == op.output
        and sum(op.output in o.inputs for o in ops) == 1
    )


def describe(plan: dict) -> list[tuple[str, str, str]]:
    """[(linear weight prefix, int8 copy, who makes it)] of every INT8 linear of a plan, in
    the vocabulary of zoi.graph.fusion.decisions: the IR op kind of the writer, "loop" or
    "quantize"."""
    writer = {L.extra["q"]: L for L in plan["launches"] if L.extra.get("q")}
    out = []
    for L in plan["launches"]:
        if L.kind != "linear" or not L.mode.quantized:
            continue
        qn = L.op.attrs["quant_in"]
        if not L.prequant:  # quantised in its own GEMM (QUANT 1 / 2)
            who = "loop"
        else:
            who = writer[qn].kind
        out.append((L.extra["prefix"], qn, who))
    return out


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
