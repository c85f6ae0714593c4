"""`zoi eval` of a model with a task head: INT8 against FP32, per head.

- seq_cls: queries of the eval set against the texts that follow each (groups of 16): the
  Spearman rank correlation of the rerank scores (per query, mean and min; and over all
  pairs), the argmax agreement of the labels, the largest logit difference;
- token_cls: per-token argmax agreement; entity F1 of the INT8 entities (aggregation
  "simple": (group, start, end)) against the FP32 ones;
- splade: top-10 / top-50 overlap of each text's largest weights, cosine of the vectors.
"""

from __future__ import annotations

import numpy as np


def spearman(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if len(a) < 2:
        return float("nan")
    ra = np.argsort(np.argsort(a, kind="stable"), kind="stable").astype(np.float64)
    rb = np.argsort(np.argsort(b, kind="stable"), kind="stable").astype(np.float64)
    if ra.std() == 0 or rb.std() == 0:
        return float("nan")
    return float(np.corrcoef(ra, rb)[0, 1])


def _f1(ref: set, got: set) -> float:
    if not ref and not got:
        return 1.0
    tp = len(ref & got)
    p = tp / max(1, len(got))
    r = tp / max(1, len(ref))
    return 0.0 if tp == 0 else 2 * p * r / (p + r)


def seq_cls_report(f, q, texts: list[str], group: int = 16) -> dict:
    pairs, groups = [], []
    for i in range(0, len(texts) - 1, group + 1):
        docs = texts[i + 1 : i + 1 + group]
        if docs:
            groups.append((len(pairs), len(pairs) + len(docs)))
            pairs += [(texts[i], d) for d in docs]
    lf = f.predict(pairs, activation_fn="identity").reshape(len(pairs), -1)
    lq = q.predict(pairs, activation_fn="identity").reshape(len(pairs), -1)
    per_q = [spearman(lf[a:b, 0], lq[a:b, 0]) for a, b in groups]
    per_q = [x for x in per_q if x == x]
    return {
        "pairs": len(pairs),
        "queries": len(groups),
        "labels": int(lf.shape[1]),
        "spearman_all": spearman(lf[:, 0], lq[:, 0]),
        "spearman_per_query_mean": float(np.mean(per_q)) if per_q else float("nan"),
        "spearman_per_query_min": float(np.min(per_q)) if per_q else float("nan"),
        "argmax_agreement": float(np.mean(lf.argmax(1) == lq.argmax(1))),
        "max_abs_logit_diff": float(np.abs(lf - lq).max()),
        "logit_spread": float(lf.max() - lf.min()),
    }


def token_cls_report(f, q, texts: list[str]) -> dict:
    tf = np.concatenate(f.predict_tokens(texts))
    tq = np.concatenate(q.predict_tokens(texts))
    ef = f.ner(texts, aggregation_strategy="simple")
    eq = q.ner(texts, aggregation_strategy="simple")
    f1 = [
        _f1(
            {(e["entity_group"], e["start"], e["end"]) for e in a},
            {(e["entity_group"], e["start"], e["end"]) for e in b},
        )
        for a, b in zip(ef, eq, strict=True)
    ]
    return {
        "texts": len(texts),
        "tokens": int(len(tf)),
        "token_argmax_agreement": float(np.mean(tf.argmax(1) == tq.argmax(1))),
        "entity_f1_mean": float(np.mean(f1)),
        "entity_f1_min": float(np.min(f1)),
        "entities_fp32": int(sum(len(x) for x in ef)),
    }


def splade_report(f, q, texts: list[str]) -> dict:
    vf = f.encode_sparse(texts, dense=True)
    vq = q.encode_sparse(texts, dense=True)
    out = {"texts": len(texts)}
    for k in (10, 50):
        ov = [
            len(set(np.argsort(-a)[:k].tolist()) & set(np.argsort(-b)[:k].tolist())) / k
            for a, b in zip(vf, vq, strict=True)
        ]
        out[f"top{k}_overlap_mean"] = float(np.mean(ov))
        out[f"top{k}_overlap_min"] = float(np.min(ov))
    a, b = vf.astype(np.float64), vq.astype(np.float64)
    cos = (a * b).sum(1) / np.maximum(np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1), 1e-30)
    out["cos_mean"], out["cos_min"] = float(cos.mean()), float(cos.min())
    out["nonzero_fp32_mean"] = float((vf > 0).sum(1).mean())
    return out


REPORTS = {"seq_cls": seq_cls_report, "token_cls": token_cls_report, "splade": splade_report}


def evaluate_head(f, q, texts: list[str], t_compile: float) -> dict:
    m = q.model
    wq = int(sum(a.nbytes for a in m.weights.values()))
    wf = int(sum(a.nbytes for a in f.model.weights.values()))
    return {
        "model": m.spec.name,
        "head": m.spec.head,
        "source": m.meta.get("source"),
        "device": q.device,
        "texts": len(texts),
        m.spec.head: REPORTS[m.spec.head](f, q, texts),
        "weights_bytes": wq,
        "fp32_weights_bytes": wf,
        "weights_ratio": round(wq / max(1, wf), 4),
        "seconds": {"compile_or_load": round(t_compile, 2)},
    }


def render_head(rep: dict, console=None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    t = Table(title=f"zoi eval: {rep['model']} ({rep['head']} head) INT8 ({rep['device']}) vs FP32")
    t.add_column("figure")
    t.add_column("value")
    for k, v in rep[rep["head"]].items():
        t.add_row(k, f"{v:.5f}" if isinstance(v, float) else str(v))
    t.add_row("weights vs FP32", f"{rep['weights_ratio']:.3f}x")
    console.print(t)
