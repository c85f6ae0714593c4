"""SmoothQuant (Xiao et al. 2023): move activation outliers into the weights, per input channel.

For a linear y = x W^T + b with input channel maxima a[k] = max_t |x[t, k]| and weight column
maxima m[k] = max_n |W[n, k]|, the factor s[k] = a[k]^alpha / m[k]^(1 - alpha) gives
y = (x / s) (W * s)^T + b: the same function, with an activation that quantises better.
Where x / s is produced decides how it is paid for; `smoothing_site` finds it in the graph:

- "ln_fold": x is a LayerNorm output read by linears only: 1/s folds into the LN's w and b.
  (Not the case in post-LN encoders such as BERT, where the LN output is also the residual.)
- "v_fold": x is the attention context. ctx = P V with P's rows summing to one, so scaling
  the V rows of the qkv weight and bias by 1/s scales ctx by 1/s exactly.
- "act": anything else (LN outputs that are also residuals, the FFN down-projection): x' =
  (x - act_shift) * act_mul per channel right before the activation is quantised, stored as
  `p.act_shift` / `p.act_mul` (float32 [K]); the shift's effect is folded into the bias
  (b + W z). Needs the kernel to apply it (docs/QUANT.md); used only with
  QuantConfig.smooth_targets == "act_mul".

Every rewrite keeps the FP32 function (tests/quant/test_smoothquant.py checks ~1e-5).
"""

from __future__ import annotations

import numpy as np

from zoi.graph.build import linear_prefix
from zoi.quant.detmath import det_matmul, det_pow

S_MIN, S_MAX = 1e-4, 1e4


def weight_colmax(w: np.ndarray) -> np.ndarray:
    """max_n |w[n, k]| (float64 [K])."""
    w = np.asarray(w)
    return np.maximum(w.max(axis=0), -w.min(axis=0)).astype(np.float64)


def smooth_factors(
    act_absmax: np.ndarray, w: np.ndarray, alpha: float, w_colmax: np.ndarray | None = None
) -> np.ndarray:
    """s[k] = a[k]^alpha / max_n|w[n,k]|^(1-alpha), clipped to a sane range (1 for dead channels).
    w_colmax: weight_colmax(w), when the caller has it."""
    a = np.asarray(act_absmax, np.float64)
    wm = weight_colmax(w) if w_colmax is None else w_colmax
    ok = (a > 0) & (wm > 0)
    s = np.ones_like(a)
    s[ok] = det_pow(a[ok], alpha) / det_pow(wm[ok], 1.0 - alpha)  # numpy's pow differs by CPU
    return np.clip(s, S_MIN, S_MAX).astype(np.float32)


def _linear_ops(graph) -> dict:
    return {linear_prefix(o): o for o in graph.ops if o.kind == "linear"}


def _producers(graph) -> dict:
    return {o.output: o for o in graph.ops}


def _consumers(graph, buf: str) -> list:
    return [o for o in graph.ops if buf in o.inputs]


def smoothing_site(graph, prefix: str) -> str | None:
    """'ln_fold', 'v_fold' or 'act' (see the module doc); None when x is a graph input."""
    op = _linear_ops(graph)[prefix]
    src = op.inputs[0]
    prod = _producers(graph).get(src)
    if prod is None:
        return None
    users = _consumers(graph, src)
    if prod.kind in ("add_layernorm", "layernorm", "embed") and all(
        u.kind == "linear" and u.inputs[0] == src and len(u.inputs) == 1 for u in users
    ):
        return "ln_fold"
    grouped = prod.kind == "attention" and prod.attrs.get("kv_heads", 0) not in (
        0,
        prod.attrs.get("heads"),
    )  # a V channel serves several heads: one factor per channel cannot fold into V
    if prod.kind == "attention" and len(users) == 1 and not grouped:
        qkv_prod = _producers(graph).get(prod.inputs[0])
        if (
            qkv_prod is not None
            and qkv_prod.kind == "linear"
            and len(_consumers(graph, prod.inputs[0])) == 1
        ):
            return "v_fold"
    return "act"


def _ln_weight_names(prod) -> tuple[str, str]:
    if prod.kind == "embed":
        return prod.weights["ln_w"], prod.weights["ln_b"]
    return prod.weights["w"], prod.weights["b"]


def apply_smoothing(
    graph,
    weights: dict,
    factors: dict[str, np.ndarray],
    shifts: dict[str, np.ndarray] | None = None,
    allow_act: bool = False,
) -> tuple[dict, dict[str, str]]:
    """Rewrite float weights so linear `p` reads x / factors[p] (and x - shifts[p] first, "act" only).

    Returns (new weights, {prefix: site used}). Linears whose site is "act" are skipped unless
    allow_act. The input weights dict is not modified (arrays are replaced, not written).
    """
    w = dict(weights)
    used: dict[str, str] = {}
    ops = _linear_ops(graph)
    prods = _producers(graph)
    shifts = shifts or {}
    for p, s in factors.items():
        site = smoothing_site(graph, p)
        s = np.asarray(s, np.float32)
        if site == "ln_fold":
            src = ops[p].inputs[0]
            readers = [linear_prefix(u) for u in _consumers(graph, src)]
            if any(r != p and r in factors and not np.array_equal(factors[r], s) for r in readers):
                raise ValueError(
                    f"{p}: linears reading one LayerNorm output need one smoothing vector"
                )
            lw, lb = _ln_weight_names(prods[src])
            if lw not in used.values():
                w[lw] = (w[lw] / s).astype(np.float32)
                w[lb] = (w[lb] / s).astype(np.float32)
            for r in readers:
                w[r + ".w"] = (w[r + ".w"] * s[None, :]).astype(np.float32)
                used[r] = "ln_fold"
        elif site == "v_fold":
            att = prods[ops[p].inputs[0]]
            qp = linear_prefix(prods[att.inputs[0]])
            H = s.shape[0]
            wq, bq = w[qp + ".w"].copy(), w[qp + ".b"].copy()
            if wq.shape[0] != 3 * H:
                raise ValueError(
                    f"{qp}: expected {3 * H} rows (Q, K, V) for V folding, got {wq.shape[0]}"
                )
            wq[2 * H :] /= s[:, None]
            bq[2 * H :] /= s
            w[qp + ".w"], w[qp + ".b"] = wq.astype(np.float32), bq.astype(np.float32)
            w[p + ".w"] = (w[p + ".w"] * s[None, :]).astype(np.float32)
            used[p] = "v_fold"
        elif site == "act" and allow_act:
            W = w[p + ".w"]
            z = shifts.get(p)
            if z is not None:
                z = np.asarray(z, np.float32)
                w[p + ".act_shift"] = z
                wz = det_matmul(W, z[None, :])[:, 0]  # W z, order-independent
                w[p + ".b"] = (w[p + ".b"].astype(np.float64) + wz).astype(np.float32)
            w[p + ".w"] = (W * s[None, :]).astype(np.float32)
            w[p + ".act_mul"] = (1.0 / s).astype(np.float32)
            used[p] = "act"
    return w, used


def role(prefix: str) -> str:
    """'l3.ffn1' -> 'ffn1' (the linear's place in the layer)."""
    return prefix.split(".", 1)[1] if "." in prefix else prefix
