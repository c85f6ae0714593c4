"""Weight packing: every tensor the launch plans read, converted once (fp16 / fp32 / int8 /
int32, fp8) into ONE aligned device buffer; the kernels get views into it.

Float linears (FP16, or weight-only INT8 dequantised here) have their SmoothQuant act_shift /
act_mul folded into the weights (exact in real arithmetic); INT8 linears keep w_q / w_scale
and the transform vectors (applied by whoever writes their int8 input copy), plus the exact
int32 column sums the asymmetric scheme needs.
"""

from __future__ import annotations

import numpy as np

from zoi.errors import InputError
from zoi.graph.quantmode import QuantMode
from zoi.numerics.fp8 import e4m3_encode, quantize_weight_fp8
from zoi.numerics.primitives import dequantize_weight, fold_act_transform, weight_colsum

ALIGN = 256


def align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def pack_weights(model, plans: list[dict], torch, dev: str) -> tuple[object, dict, int]:
    """(the weight buffer, {packed name: view}, bytes) for the launches of `plans`."""
    W = model.weights
    items: dict[str, np.ndarray] = {}  # packed name -> array (plans share weights)

    def add(key, arr):
        if key not in items:
            items[key] = np.ascontiguousarray(arr)

    def f16(a):
        a = np.asarray(a, np.float32)
        if np.abs(a).max(initial=0) > 65504:
            raise InputError("a weight exceeds the fp16 range; use precision='int8'")
        return a.astype(np.float16)

    f32 = lambda a: np.asarray(a, np.float32)  # noqa: E731
    for L in [la for plan in plans for la in plan["launches"]]:
        op = L.op
        if L.kind == "embed":
            w = op.weights
            if "embed.word_q" in W and "embed.word" not in W:
                add("embed.word_q", W["embed.word_q"])
                add("embed.word_scale", f32(W["embed.word_scale"]))
            else:
                add("embed.word", f16(W[w["word"]]))
            if "pos" in w:  # ModernBERT has none (RoPE in attention)
                add("embed.pos", f16(W[w["pos"]]))
            if "type" in w:
                add("embed.type0", f16(W[w["type"]][0]))
            if "ln_w" in w:  # the decoder architectures have no embedding norm
                add("embed.ln.w", f32(W[w["ln_w"]]))
                add("embed.ln.b", f32(W[w["ln_b"]]))
        elif L.kind == "linear":
            p = L.extra["prefix"]
            shift, mul = W.get(f"{p}.act_shift"), W.get(f"{p}.act_mul")
            if L.mode is QuantMode.FP8:  # E4M3 per output channel (zoi.numerics.fp8)
                if f"{p}.w_q" not in items:
                    q, sc = quantize_weight_fp8(W[f"{p}.w"])
                    add(f"{p}.w_q", e4m3_encode(q))  # uint8 codes, viewed as float8_e4m3fn
                    add(f"{p}.w_scale", sc)
                    add(f"{p}.b", f32(W[f"{p}.b"]))
            elif L.mode.is_int8:
                add(f"{p}.w_q", np.asarray(W[f"{p}.w_q"], np.int8))
                add(f"{p}.w_scale", f32(W[f"{p}.w_scale"]))
                if L.mode is QuantMode.DYNAMIC_ASYM:  # sum_k w_q[n, k], exact in int32
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
        elif L.kind == "attention":  # bias table, RoPE tables, q / k norm weights (fp32)
            for k in ("rel_bias", "rope_cos", "rope_sin", "q_norm", "k_norm"):
                if k in op.weights:
                    add(op.weights[k], f32(W[op.weights[k]]))
        elif L.kind == "add_layernorm":
            add(f"{op.output}.ln.w", f32(W[op.weights["w"]]))
            add(f"{op.output}.ln.b", f32(W[op.weights["b"]]))
    offs, total = {}, 0
    for key, a in items.items():
        offs[key] = (total, a)
        total = align(total + a.nbytes)
    blob = np.zeros(total, np.uint8)
    for o, a in offs.values():
        blob[o : o + a.nbytes] = a.reshape(-1).view(np.uint8)
    wbuf = torch.from_numpy(blob).to(dev)  # the one weight buffer
    views = {}
    for key, (o, a) in offs.items():
        tdt = {
            np.dtype(np.float16): torch.float16,
            np.dtype(np.float32): torch.float32,
            np.dtype(np.int8): torch.int8,
            np.dtype(np.int32): torch.int32,
            np.dtype(np.uint8): torch.float8_e4m3fn,  # only FP8 weights are packed as uint8
        }[a.dtype]
        views[key] = wbuf[o : o + a.nbytes].view(tdt).view(a.shape)
    return wbuf, views, total
