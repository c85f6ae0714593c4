"""The fusion pass: fusion and the placement of INT8 activation copies, decided ONCE for every
backend, as attributes of the IR ops (docs/ARCHITECTURE.md, "One plan").

``annotate(model)`` writes, on the ops of ``model.graph`` (deterministic, idempotent; every
backend calls it at construction, so the attributes always match the model's weights and
quantisation):

every ``linear``
    ``quant``: its ``QuantMode`` (FLOAT: float weights, or weight-only INT8 dequantised; FP8:
    precision="fp8", an E4M3 copy named ``"<input>@fp8#q"``, placed by the same rules).
an INT8 ``linear`` (reads an INT8 copy of its input)
    ``quant_in``: the name of the copy, ``"<input>@<tag>#q"`` (tag: the mode, the static amax,
    or the linear's own weight prefix when it has a SmoothQuant ``act_shift`` / ``act_mul``,
    applied before quantising: such a copy is that linear's alone); the copy is a ``Buffer``
    of ``graph.buffers`` with dtype ``"i8"`` (its a_scale / zero point rows go with it).
    ``quant_static_amax`` (STATIC: the calibrated amax, else 0.0), ``quant_transform``
    (bool: act_shift / act_mul present).
    ``quant_in_by``: the output name of the op whose epilogue writes the copy, or None: the
    copy is made at the consumer (a quantize step before it; see ``quant_in_loop``).
    ``quant_in_loop``: True when the consumer's GEMM may quantise its float input while
    loading it instead of a separate quantize step (symmetric / static, no transform), for
    the buckets where no producer writes the copy.
the writer of a copy
    ``quant_out``: the copy's name; ``quant_out_min_tokens``: from this many tokens in a call
    on (0: always); below it the copy is made at the consumer, as if ``quant_in_by`` were None.
a ``linear`` writing a copy
    ``quant_out_only``: whether, from ``quant_out_min_tokens`` on, nothing reads its float
    output but that quantisation (the copy's one consumer, right after it, reads only the
    copy; the output is not the graph's): then a backend may keep those float rows in scratch
    instead of its arena (the CPU core: per-thread rows, ``Engine.add_linear_i8(y_dead=...)``).
    Below that many tokens the consumer's quantise step reads the float rows as usual.
    ``FusionPolicy.quant_out_only`` False (an A/B of the backends, lab/cpu/yscratch_ab.py) sets it False everywhere,
    and so does a model whose meta says ``token_states`` (its callers read the pool's input
    back on every call: multi-vector heads).
    A permission, not a data flow: a backend that writes the rows anyway (the CUDA backend)
    changes only its memory traffic, and records no fallback for it.
A ``linear`` with task adapters (``lora_a`` / ``lora_b`` weights) adds their term to its rows
after the GEMM, then its activation and residual: it writes no copy, and the
float rows of its input stay in the arena (they feed the adapters).

Who writes a copy: the op right before its first consumer, when it produces the consumer's
input and its epilogue sees whole rows (``embed``, ``add_layernorm``, ``glu``: always), or is
a ``linear`` without a residual that does not itself read a copy another linear wrote (from
``FusionPolicy.linear_quant_min_tokens`` on: below that the split of a GEMM over columns, which
reads each weight once, is worth more than the saved pass). Any other copy is made at its
consumer. Every choice is exact: the integers, scales and zero points do not depend on who
makes the copy (a backend that keeps activations in fp16 quantises what it stored).

A backend that cannot (or by its options does not) realise a decision falls back to making the
copy at the consumer / running the LayerNorm on its own, and records that in its plan
(``CpuBackend.fallbacks``, the CUDA plan's ``"fallbacks"``): never silently.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from zoi.graph.ir import Buffer, Graph, Op
from zoi.graph.quantmode import QuantMode

# The CPU core's measured threshold (csrc/kernels/kernels.h kI8FuseQuantMinM; tests check the
# two agree): from 256 tokens an INT8 GEMM quantising its own output rows beats a quantise step.
LINEAR_QUANT_MIN_TOKENS = 256
WHOLE_ROWS = ("embed", "add_layernorm", "glu")  # ops whose epilogue sees whole rows


@dataclass(frozen=True)
class FusionPolicy:
    """The tunables of the pass (arguments: a backend passes its own, e.g.
    ``CpuBackend(model, fusion=FusionPolicy(quant_out_only=False))``; no environment is read)."""

    linear_quant_min_tokens: int = LINEAR_QUANT_MIN_TOKENS
    quant_out_only: bool = True  # False: no linear's float output is marked dead (A/B, taps)


def linear_quant(model, prefix: str) -> tuple[QuantMode, float]:
    """(mode, static amax) of one linear of a CompiledModel: INT8 when the model is INT8, the
    linear has int8 weights and its scheme is not "fp32" (weight-only INT8 is FLOAT: its
    weights are dequantised by the backend). An unknown scheme raises ValueError."""
    W, q = model.weights, model.quant.get(prefix)
    if model.precision == "fp8" and q is not None and q.scheme == QuantMode.FP8:
        return QuantMode.FP8, 0.0  # E4M3 (zoi.numerics.fp8): weights packed by the backend
    if model.precision == "int8" and f"{prefix}.w_q" in W and (q is None or q.scheme != "fp32"):
        mode = QuantMode.parse(None if q is None else q.scheme, prefix)
        return mode, float(q.amax) if mode is QuantMode.STATIC else 0.0
    return QuantMode.FLOAT, 0.0


_KEYS = (
    "quant",
    "quant_in",
    "quant_static_amax",
    "quant_transform",
    "quant_in_by",
    "quant_in_loop",
    "quant_out",
    "quant_out_min_tokens",
    "quant_out_only",
)


def annotate(model, policy: FusionPolicy | None = None) -> Graph:
    """Write the fusion attributes (module docstring) on model.graph's ops; returns the graph.
    policy None: FusionPolicy() (the defaults). Raises ValueError for a linear with an unknown INT8
    scheme."""
    policy = policy or FusionPolicy()
    if (getattr(model, "meta", None) or {}).get("token_states"):
        # its callers read the pool's input back on every call (a tap: zoi.heads.multivector),
        # and the CPU core refuses a tap at the arena offset of a linear output kept in scratch
        policy = dataclasses.replace(policy, quant_out_only=False)
    g: Graph = model.graph
    ops = g.ops
    for op in ops:
        for k in _KEYS:
            op.attrs.pop(k, None)
    for name in [n for n, b in g.buffers.items() if b.dtype == "i8"]:
        del g.buffers[name]
    writer_of = {op.output: i for i, op in enumerate(ops)}
    readers: dict[str, list[int]] = {}
    for i, op in enumerate(ops):
        for n in op.inputs:
            readers.setdefault(n, []).append(i)
    copy_writer: dict[str, str | None] = {}  # copy -> writer op output (None: at the consumer)
    for i, op in enumerate(ops):
        if op.kind != "linear":
            continue
        p = op.prefix
        mode, amax = linear_quant(model, p)
        op.attrs["quant"] = mode
        if not mode.quantized:  # FLOAT; INT8 and FP8 read a 1-byte copy ("i8" buffer)
            continue
        X = op.inputs[0]
        tr = any(f"{p}.{t}" in model.weights for t in ("act_shift", "act_mul"))
        tag = p if tr else (f"static{amax!r}" if mode is QuantMode.STATIC else mode.value)
        if mode is QuantMode.FP8 and tr:  # an FP8 copy's name always ends "@fp8#q"
            tag = f"{p}@fp8"
        qname = f"{X}@{tag}#q"
        op.attrs.update(
            quant_in=qname,
            quant_static_amax=amax,
            quant_transform=tr,
            quant_in_loop=mode in (QuantMode.DYNAMIC, QuantMode.STATIC) and not tr,
        )
        if qname not in copy_writer:  # the first consumer of a copy decides who writes it
            src = g.buffers[X]
            g.buffers[qname] = Buffer(qname, src.rows, src.cols, "i8")
            j = writer_of.get(X)
            P = ops[j] if j is not None else None
            who, min_t = None, 0
            if P is not None and j == i - 1:
                if P.kind in WHOLE_ROWS:
                    who = P.output
                elif (
                    P.kind == "linear"
                    and len(P.inputs) == 1
                    and "lora_a" not in P.weights  # its rows are final only after the adapters
                    and not _reads_linear_copy(P, ops, writer_of)
                ):
                    who, min_t = P.output, int(policy.linear_quant_min_tokens)
            if who is not None:
                P.attrs["quant_out"] = qname
                P.attrs["quant_out_min_tokens"] = min_t
                if P.kind == "linear":
                    P.attrs["quant_out_only"] = policy.quant_out_only and _only_copy_read(
                        g, ops, readers, j, qname
                    )
            copy_writer[qname] = who
        op.attrs["quant_in_by"] = copy_writer[qname]
    return g


def _only_copy_read(
    g: Graph, ops: list[Op], readers: dict[str, list[int]], j: int, qname: str
) -> bool:
    """Whether the float output of ops[j] is read by nothing but the quantisation into its copy
    qname: its one reader is ops[j + 1], reading it once (as the input of that INT8 linear, not
    as its residual too) through qname, and it is not the graph's output."""
    Y = ops[j].output
    return (
        Y != g.output
        and readers.get(Y) == [j + 1]
        and ops[j + 1].kind == "linear"
        and ops[j + 1].inputs[0] == Y
        and ops[j + 1].attrs.get("quant_in") == qname
        and "lora_a" not in ops[j + 1].weights  # the adapters read the float rows
    )


def _reads_linear_copy(op: Op, ops: list[Op], writer_of: dict[str, int]) -> bool:
    """Whether op reads an INT8 copy written by a linear's epilogue (chains alternate: the
    CPU core holds such a copy in its second slot, the one a linear writes)."""
    by = op.attrs.get("quant_in_by")
    return by is not None and ops[writer_of[by]].kind == "linear"


def copy_made_by(graph: Graph, consumer: Op, tokens: int) -> str:
    """Who makes the INT8 copy an INT8 linear reads, in a call of `tokens` tokens, as the IR
    decides it: the writer op's kind ("embed", "add_layernorm", "glu", "linear"), or "loop"
    (the consumer's GEMM quantises while loading) or "quantize" (a quantize step)."""
    by = consumer.attrs["quant_in_by"]
    if by is not None:
        w = next(o for o in graph.ops if o.output == by)
        if tokens >= w.attrs.get("quant_out_min_tokens", 0):
            return w.kind
    return "loop" if consumer.attrs["quant_in_loop"] else "quantize"


def decisions(graph: Graph, tokens: int) -> list[tuple[str, str, str]]:
    """[(linear weight prefix, copy name, who makes it)] for every INT8 linear, in op order,
    at a call of `tokens` tokens: the plan both backends realise (tests compare them)."""
    return [
        (o.prefix, o.attrs["quant_in"], copy_made_by(graph, o, tokens))
        for o in graph.ops
        if o.kind == "linear" and o.attrs.get("quant_in")
    ]
