"""What the grouped int8 handoff ffn1 -> ffn2 (lab/gpu/grouped_handoff.py: ffn1's epilogue
writes int8 codes with one symmetric scale per (token, G columns), ffn2 rescales per group)
costs in accuracy on real text, before it becomes a QuantMode.

The golden numpy engine (device="reference") runs the bundled all-MiniLM-L6-v2 as compiled
INT8. The ffn2 linears' activation quantisation is then swapped for the candidates:

  default          the artifact as compiled (per-token, asymmetric for GELU outputs, the
                   first row quantised twice)
  token_sym        one symmetric scale per token (what a symmetric per-row handoff gives)
  group_sym G      one symmetric scale per (token, G columns): G = 128, 64, 32

Each is compared to the FP32 engine on the same sentences (src/zoi/data/eval*.txt). The
figures are the mean and minimum cosine and the worst nearest-neighbour swaps on a
retrieval-style check (each query's top-1 among the rest). Runs on the CPU in ~2 minutes:

    python lab/gpu/grouped_error.py [--n 400] [--out R.json]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

import zoi
from zoi.numerics import primitives as qp
from zoi.numerics import reference as R


def texts(n: int) -> list[str]:
    root = Path(zoi.__file__).parent / "data"
    out = []
    for name in ("eval.txt", "eval_questions.txt", "eval_techdocs.txt", "eval_code.txt"):
        out += [
            ln.strip()
            for ln in (root / name).read_text(encoding="utf-8").splitlines()
            if ln.strip()
        ]
    rng = np.random.default_rng(0)
    return [out[i] for i in rng.permutation(len(out))[:n]]


def ffn2_prefixes(model) -> list[str]:
    """The linears whose input is an activation's output (the ffn1 -> ffn2 handoff)."""
    ops = model.graph.ops
    acts = {
        op.output for op in ops if op.kind == "linear" and op.attrs.get("act", "none") != "none"
    }
    return sorted(op.prefix for op in ops if op.kind == "linear" and op.inputs[0] in acts)


def grouped_linear(x, weights, prefix, g: int):
    """x @ w.T + b with x quantised symmetric per (token, g columns), w per channel (exact
    integer sums per group, rescaled in float32 as the grouped ffn2 kernel does)."""
    x = R.pre_transform(np.asarray(x, np.float32), weights, prefix)
    w_q, w_s = weights[prefix + ".w_q"], weights[prefix + ".w_scale"]
    T, K = x.shape
    y = np.zeros((T, w_q.shape[0]), np.float32)
    for k0 in range(0, K, g):
        xs = x[:, k0 : k0 + g]
        q, s = qp.quantize_act(xs)
        acc = qp.int8_matmul_fast(q, w_q[:, k0 : k0 + g]).astype(np.float32)
        y += acc * s[:, None]
    y *= w_s[None, :]
    b = weights.get(prefix + ".b")
    return y + np.asarray(b, np.float32)[None, :] if b is not None else y


def token_sym_linear(x, weights, prefix):
    return grouped_linear(x, weights, prefix, np.asarray(x).shape[1])


def run(engine, sents, swap):
    """encode with the ffn2 linears' quantisation replaced by swap(x, weights, prefix)."""
    base = R.linear_apply
    targets = set(ffn2_prefixes(engine.model))

    def patched(x, weights, prefix, lq=None, *a, **kw):
        if swap is not None and prefix in targets:
            return swap(x, weights, prefix)
        return base(x, weights, prefix, lq, *a, **kw)

    R.linear_apply = patched
    try:
        return engine.encode(sents, batch_size=32)
    finally:
        R.linear_apply = base


def compare(a: np.ndarray, ref: np.ndarray) -> dict:
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    ref = ref / np.linalg.norm(ref, axis=1, keepdims=True)
    cos = (a * ref).sum(axis=1)
    sa, sr = a @ a.T, ref @ ref.T
    np.fill_diagonal(sa, -2)
    np.fill_diagonal(sr, -2)
    top1 = float((sa.argmax(axis=1) == sr.argmax(axis=1)).mean())
    return {
        "cos_mean": round(float(cos.mean()), 6),
        "cos_min": round(float(cos.min()), 6),
        "top1_agree": round(top1, 4),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=400)
    ap.add_argument("--groups", default="128,64,32")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    sents = texts(a.n)
    t0 = time.perf_counter()
    fp32 = zoi.compile(device="reference", precision="fp32", max_tokens=512)
    int8 = zoi.compile(device="reference", precision="int8", max_tokens=512)
    print(
        f"compiled in {time.perf_counter() - t0:.0f} s; ffn2 linears: {ffn2_prefixes(int8.model)}",
        flush=True,
    )
    schemes = sorted({str(int8.model.quant[p].scheme) for p in ffn2_prefixes(int8.model)})
    ref = fp32.encode(sents, batch_size=32)
    rows = {"default": run(int8, sents, None), "token_sym": run(int8, sents, token_sym_linear)}
    for g in (int(v) for v in a.groups.split(",")):
        rows[f"group_sym_{g}"] = run(int8, sents, lambda x, w, p, g=g: grouped_linear(x, w, p, g))
    result = {
        "model": "all-MiniLM-L6-v2 (bundled)",
        "sentences": len(sents),
        "ffn2_default_scheme": schemes,
    }
    for name, emb in rows.items():
        result[name] = compare(emb, ref)
        print(name, result[name], flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
