"""INT8 rerank scores against FP32 on real queries and documents (the quality target:
Spearman >= 0.995), through `zoi eval`'s seq_cls report (zoi.tools.eval_heads).

Queries: the held-out real questions (``zoi.data`` eval_questions.txt); each ranks ``--docs``
real documents drawn (seeded) from the held-out sentences and technical docs (eval.txt,
eval_techdocs.txt): the shape of rerank-1x32. No relevance labels are needed: the figure is
the agreement of INT8's ranking with FP32's. The model is the bench's minilm-sized
cross-encoder (``minilm-ce``, random init: no real cross-encoder weights are available
offline), or any seq_cls folder given with ``--model``.

    python scripts/rerank_quality.py [--model DIR] [--queries 48] [--docs 32] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np


def _lines(name: str) -> list[str]:
    import zoi.data

    p = Path(zoi.data.__file__).resolve().parent / name
    return [x.strip() for x in p.read_text(encoding="utf-8").splitlines() if x.strip()]


def query_doc_texts(n_queries: int, n_docs: int, seed: int = 0) -> list[str]:
    """[q0, d0_0 .. d0_{n-1}, q1, ...]: the grouping seq_cls_report reads (group = n_docs)."""
    qs = _lines("eval_questions.txt")
    docs = _lines("eval.txt") + _lines("eval_techdocs.txt")
    if n_queries > len(qs) or n_docs > len(docs):
        raise ValueError(f"at most {len(qs)} queries and {len(docs)} documents")
    rng = np.random.default_rng(seed)
    out: list[str] = []
    for i in rng.choice(len(qs), n_queries, replace=False):
        out.append(qs[i])
        out += [docs[j] for j in rng.choice(len(docs), n_docs, replace=False)]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=None, help="seq_cls folder (default minilm-ce)")
    ap.add_argument("--queries", type=int, default=48)
    ap.add_argument("--docs", type=int, default=32)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--weights", default=None, help="what the model's weights are (recorded)")
    a = ap.parse_args(argv)

    import zoi
    from zoi.tools.eval_heads import seq_cls_report

    if a.model is None:
        from zoi.bench import models as M

        ref = M.get_model("minilm-ce", M.default_cache_dir())
        folder, what = ref.path, "minilm-ce: BertForSequenceClassification 6x384, random init"
    else:
        folder, what = a.model, str(a.model)
    weights = a.weights or (
        "random init (torch.manual_seed(0)): no real cross-encoder offline"
        if a.model is None
        else "as in the folder given"
    )
    texts = query_doc_texts(a.queries, a.docs)
    load0 = list(os.getloadavg())
    t0 = time.perf_counter()
    f = zoi.compile(str(folder), device="cpu", precision="fp32")
    q = zoi.compile(str(folder), device="cpu", precision="int8")
    rep = seq_cls_report(f, q, texts, group=a.docs)
    res = {
        "what": "INT8 vs FP32 rerank scores (zoi CPU), Spearman per query and over all pairs",
        "model": what,
        "weights": weights,
        "queries_source": "zoi/data/eval_questions.txt (held out from calibration)",
        "docs_source": "zoi/data/eval.txt + eval_techdocs.txt, seeded draw per query",
        "report": rep,
        "target_spearman": 0.995,
        "meets_target_per_query_mean": bool(rep["spearman_per_query_mean"] >= 0.995),
        "seconds": round(time.perf_counter() - t0, 1),
        "loadavg_start": load0,
        "loadavg_end": list(os.getloadavg()),
        "zoi_version": zoi.__version__,
        "command": "python scripts/rerank_quality.py "
        + " ".join(argv if argv is not None else __import__("sys").argv[1:]),
    }
    s = json.dumps(res, indent=1)
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(s + "\n")
    print(s)
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
