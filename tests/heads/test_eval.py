"""`zoi eval` of the heads: INT8 against FP32 figures per head."""

from __future__ import annotations

import numpy as np
import pytest
from tests.conftest import real_sentences

from zoi.tools.eval import evaluate, render


@pytest.mark.parametrize(
    ("task", "labels", "key"),
    [("seq", 1, "seq_cls"), ("tok", 7, "token_cls"), ("mlm", 3, "splade")],
)
def test_eval_reports_each_head(head_ckpts, task, labels, key, capsys):
    folder, _ = head_ckpts("bert", task, labels)
    rep = evaluate(str(folder), texts=real_sentences(60), device="cpu")
    assert rep["head"] == key and rep["weights_ratio"] < 0.5
    r = rep[key]
    if key == "seq_cls":
        assert r["pairs"] > 40 and 0.9 < r["spearman_all"] <= 1 and r["argmax_agreement"] == 1
        assert r["max_abs_logit_diff"] < 0.1 * r["logit_spread"]
    elif key == "token_cls":
        assert r["token_argmax_agreement"] > 0.95 and 0.8 < r["entity_f1_mean"] <= 1
    else:
        assert r["top10_overlap_mean"] > 0.85 and r["cos_min"] > 0.999
    assert all(np.isfinite(v) for v in r.values() if isinstance(v, float))
    render(rep)
    assert key in capsys.readouterr().out
