"""zoi.quant: INT8 quantisation that every backend consumes (its report: `zoi eval`, zoi.tools).

Whatever the target device, the quantiser runs the model on the CPU core's own kernels
(zoi.quant.native): its FP32 engine for the calibration statistics and the FP32 yardstick,
INT8 engines for the SmoothQuant candidates (docs/QUANT.md, "The pipeline").

The one entry point the engine calls (zoi.engine.compile with precision="int8")::

    from zoi import quant
    report: dict = {}
    weights_q, q = quant.quantize_model(
        spec, weights, tokenizer,          # ModelSpec, float32 weights (our names), zoi Tokenizer
        calibration=None,                  # list[str] or a file path; None -> zoi.data.calibration_texts();
                                           # or a budget, "fast" | "default" | "thorough"
        config=None,                       # QuantConfig | dict | None: the budget's preset
                                           # (QuantConfig.preset), a dict's fields on top
        progress=False,                    # tqdm bars on stderr
        graph=None,                        # the Graph; None -> zoi.graph.build_graph(spec)
        report=report,                     # optional dict, filled with the summary (JSON-able)
        features=None,                     # what the backend runs; None = all (see below)
    )
    # weights_q: the new weights dict; q: {linear prefix: zoi.graph.LinearQuant}
    model.meta["quant_report"] = report    # what `zoi info` / `zoi eval` show

What the returned weights hold (docs/ARCHITECTURE.md, docs/QUANT.md):

- an INT8 linear `p` (q[p].scheme "dynamic_asym" (default), "dynamic" or "static"):
  `p.w_q` int8 [N, K], `p.w_scale` f32 [N], `p.b` f32 [N]; with smooth_targets="act_mul"
  (default) also `p.act_mul` (f32 [K]) and, with smooth_shift, `p.act_shift` (f32 [K]):
  the kernel computes x' = (x - act_shift) * act_mul before quantising x (docs/QUANT.md).
- an FP32 linear (q[p].scheme "fp32"): `p.w` f32 [N, K] + `p.b`, or, when the byte budget
  did not allow FP32 weights, `p.w_q` + `p.w_scale` (weight-only INT8: dequantise, run in
  float; q[p].info["weights"] == "int8"). Never act_mul / act_shift.
- `embed.word_q` int8 [V, H] + `embed.word_scale` f32 [V] instead of `embed.word` (default).
- every other weight unchanged, except the V rows of `l{i}.qkv.w`/`.b` that carry the
  o-projection's SmoothQuant factors (exact fold; kernels see nothing).

q[p].info records: sqnr_db (per-layer SQNR on the calibration set), smooth ({site, alpha}
or None), gptq (bool), weights / fallback when it stayed FP32, in_scale (the folded
factors, for reports). `quant_to_json` / `quant_from_json` (de)serialise the dict.

QuantConfig (zoi.quant.config) defaults, chosen on the calibration set to meet the
accuracy targets on MiniLM (docs/QUANT.md): per-token asymmetric UINT8 activations ("dynamic_asym"),
SmoothQuant "auto" (alpha searched, per role, "off" allowed) with `act_mul` where a fold is
impossible, GPTQ weight rounding on a text-length-weighted Gram (gptq_weighting="pooled"), per-layer SQNR with FP32 fallback under 30 dB within
0.27x the FP32 weight bytes, per-row INT8 embedding table. Artifacts inside the original
contract (no act_mul, symmetric): QuantConfig(activations="dynamic", smooth_targets="fold"),
or `features={"dynamic", "static"}`, which narrows any config that way.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence

from zoi.numerics import primitives
from zoi.quant.config import QuantConfig

__all__ = [
    "QuantConfig",
    "primitives",
    "quantize_model",
    "quant_to_json",
    "quant_from_json",
    "weights_ratio",
]


def _linear_quant_cls():
    from zoi.graph.compiled import LinearQuant

    return LinearQuant


def quant_to_json(quant: dict) -> str:
    return json.dumps({p: q.to_dict() for p, q in quant.items()}, sort_keys=True)


def quant_from_json(s: str | dict) -> dict:
    d = json.loads(s) if isinstance(s, str) else s
    LQ = _linear_quant_cls()
    return {p: LQ.from_dict(v) for p, v in d.items()}


def weights_ratio(quantized: dict, original: dict) -> float:
    """Bytes of the quantised weights over the bytes of the FP32 weights."""
    return float(
        sum(a.nbytes for a in quantized.values()) / max(1, sum(a.nbytes for a in original.values()))
    )


def quantize_model(
    spec,
    weights: dict,
    tokenizer,
    calibration: Sequence[str] | None = None,
    config: QuantConfig | dict | None = None,
    progress: bool = False,
    graph=None,
    report: dict | None = None,
    features=None,
) -> tuple[dict, dict]:
    """Calibrate, smooth, quantise and choose per-layer precision. See the module doc.

    calibration: texts, a file of texts, or a compile budget ("fast" | "default" |
    "thorough", zoi.quant.config.CALIBRATION_BUDGETS; None:
    "default"), which picks the QuantConfig preset that `config` (a dict) adjusts.
    features: what the target backend runs (zoi.quant.config.FEATURES); None = everything.
    The config is narrowed to it (QuantConfig.restricted_to) so the artifact never needs a
    feature the backend lacks."""
    from zoi.quant.config import check_calibration, config_for, is_budget
    from zoi.quant.pipeline import run_pipeline

    check_calibration(calibration)
    cfg = config_for(calibration, config)
    if is_budget(calibration):  # a budget, not texts: zoi's calibration set
        calibration = None
    if features is not None:
        cfg = cfg.restricted_to(features)
    if graph is None:
        from zoi.graph.build import build_graph

        graph = build_graph(spec)
    if calibration is None:
        from zoi.data import calibration_set, is_multilingual

        pairs = calibration_set(multilingual=is_multilingual(spec))
        texts, domains = [t for t, _ in pairs], [d for _, d in pairs]
    else:
        domains = None
        if isinstance(calibration, (str, os.PathLike)):  # a file, one text per line
            from zoi.data import read_lines

            calibration = read_lines(calibration)
        texts = [t for t in calibration if isinstance(t, str) and t.strip()]
        if not texts:
            from zoi.errors import InputError

            raise InputError("the calibration set holds no text")
    t0 = time.perf_counter()
    new_w, quant, summary = run_pipeline(
        spec, graph, weights, tokenizer, texts, cfg, progress, domains=domains
    )
    summary["seconds"] = round(time.perf_counter() - t0, 2)
    if report is not None:
        report.update(summary)
    return new_w, quant
