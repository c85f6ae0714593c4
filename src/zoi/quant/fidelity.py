"""Fidelity of a quantised model per text domain: the figures `zoi eval` reports and writes.

For each domain (zoi.data.DOMAINS: prose, questions, code, techdocs, queries, and
multilingual for multilingual models), from the FP32 and the INT8 embeddings of the
domain's held-out texts:

- cosine of each text's INT8 embedding with its FP32 one: mean, min, 1st percentile;
- top-10 neighbour agreement within the domain's set (the share of each text's 10 nearest
  neighbours, by cosine, itself excluded, that INT8 finds as FP32 does; mean over texts),
  and top-1 agreement;
- the worst texts (lowest cosine) with their cosine, and the pass / fail of each target.

`markdown_table` renders a report's domains as docs/RESULTS.md's quality table
(`zoi eval --markdown`, or `python -m zoi.quant.fidelity REPORT.json`).
numpy only: no engine here (the caller encodes).
"""

from __future__ import annotations

import json
import sys

import numpy as np

# INT8 against FP32 on every domain
TARGETS = {"cos_mean": 0.9995, "cos_min": 0.997, "top10": 0.975}
# FP8 (E4M3) on the H200 against FP32, every domain
FP8_TARGETS = {"cos_mean": 0.9998}


def cosine_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    na = np.sqrt(np.einsum("ij,ij->i", a, a))
    nb = np.sqrt(np.einsum("ij,ij->i", b, b))
    return np.einsum("ij,ij->i", a, b) / np.maximum(na * nb, 1e-30)


def neighbours(e: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k nearest neighbours (cosine) of each row, itself excluded; ties by
    index. [n, min(k, n - 1)]"""
    e = np.asarray(e, np.float64)
    e = e / np.maximum(np.linalg.norm(e, axis=1, keepdims=True), 1e-30)
    s = e @ e.T
    np.fill_diagonal(s, -np.inf)
    k = min(k, len(e) - 1)
    return np.argsort(-s, axis=1, kind="stable")[:, :k]


def agreement(ref: np.ndarray, test: np.ndarray, k: int = 10) -> dict:
    if len(ref) < 2:
        return {f"top{k}": float("nan"), "top1": float("nan")}
    a, b = neighbours(ref, k), neighbours(test, k)
    kk = a.shape[1]
    topk = float(
        np.mean([len(set(x) & set(y)) / kk for x, y in zip(a.tolist(), b.tolist(), strict=True)])
    )
    return {f"top{k}": topk, "top1": float(np.mean(a[:, 0] == b[:, 0]))}


def domain_report(ref: np.ndarray, test: np.ndarray, texts, worst: int = 5) -> dict:
    """Figures of one domain (see the module doc); ref/test [n, H] embeddings of `texts`."""
    texts = list(texts)
    if len(texts) != len(ref) or ref.shape != test.shape:
        raise ValueError(f"{len(texts)} texts, {ref.shape} FP32 and {test.shape} INT8 embeddings")
    if not (np.isfinite(ref).all() and np.isfinite(test).all()):
        raise FloatingPointError("non-finite embeddings: the engine produced NaN or inf")
    cos = cosine_rows(ref, test)
    order = np.argsort(cos, kind="stable")[:worst]
    out = {
        "texts": len(texts),
        "cos_mean": float(cos.mean()),
        "cos_min": float(cos.min()),
        "cos_p1": float(np.percentile(cos, 1)),
    }
    out.update(agreement(ref, test, 10))
    out["worst"] = [{"cos": round(float(cos[i]), 6), "text": texts[i]} for i in order]
    out["meets"] = meets(out)
    return out


def meets(fig: dict, targets: dict | None = None) -> dict:
    t = TARGETS if targets is None else targets
    return {k: bool(fig[k] >= v) for k, v in t.items()}


def summarise(domains: dict) -> dict:
    """Worst figure over the domains, and which domain gives it."""
    out: dict = {}
    for k in ("cos_mean", "cos_min", "top10", "top1"):
        d = min(domains, key=lambda n: domains[n][k])
        out[k] = {"value": domains[d][k], "domain": d}
    out["all_targets_met"] = all(all(v["meets"].values()) for v in domains.values())
    return out


def domain_figures(fp32, int8, domains, known: dict | None = None, worst: int = 5) -> dict:
    """{domain: domain_report} for engines `fp32` and `int8` (anything with
    .encode(texts, normalize_embeddings=True)) on zoi's held-out sets of `domains`.
    known: {domain: (texts, fp32 embeddings, int8 embeddings)} already computed."""
    from zoi.data import domain_texts

    known = known or {}
    out = {}
    for d in domains:
        if d in known:
            texts, e_f, e_q = known[d]
        else:
            texts = domain_texts(d)
            e_f = fp32.encode(texts, normalize_embeddings=True)
            e_q = int8.encode(texts, normalize_embeddings=True)
        out[d] = domain_report(np.asarray(e_f), np.asarray(e_q), texts, worst)
    return out


def markdown_table(rep: dict) -> str:
    """docs/RESULTS.md's quality table from a `zoi eval` report (its "domains" section)."""
    doms = rep.get("domains") or {}
    if not doms:
        raise ValueError("the report has no per-domain figures (run `zoi eval` without --texts)")
    t = TARGETS
    lines = [
        f"| domain ({rep.get('model', '?')}, {rep.get('precision', 'int8').upper()} vs FP32) "
        "| texts | mean cos | min cos "
        "| top-10 | top-1 |",
        "|---|---|---|---|---|---|",
    ]

    def cell(v: float, key: str, fmt: str) -> str:
        s = format(v, fmt)
        return s if v >= t[key] else f"**{s}** (< {t[key]:g})"

    for name, d in doms.items():
        lines.append(
            f"| {name} | {d['texts']} | {cell(d['cos_mean'], 'cos_mean', '.5f')} | "
            f"{cell(d['cos_min'], 'cos_min', '.5f')} | {cell(d['top10'], 'top10', '.4f')} | "
            f"{d['top1']:.4f} |"
        )
    lines.append(f"| target | | >= {t['cos_mean']} | >= {t['cos_min']} | >= {t['top10']} | |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m zoi.quant.fidelity REPORT.json  (prints the markdown table)")
        return 2
    with open(argv[0], encoding="utf-8") as f:
        sys.stdout.write(markdown_table(json.load(f)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
