"""The quantisation pipeline behind `zoi.quant.quantize_model`.

1. calibrate: one FP32 pass over the calibration texts (channel ranges, Gram matrices for
   GPTQ, the FP32 embeddings as the yardstick);
2. SmoothQuant: alpha searched on a subset of the calibration texts, first one alpha for
   the model, then refined per linear role (qkv / o / ffn1 / ffn2, "off" included); the score
   is the INT8 model's embedding error against FP32: mean(1 - cos) + mean of the worst 2%;
3. weights: per-channel INT8, GPTQ rounding by default, on a Gram whose token rows weigh
   1 / L**2 of their text's length (QuantConfig.gptq_weighting "pooled": the mean-pooled
   embedding's error, so short texts and their [CLS] / [SEP] rows count; docs/QUANT.md);
4. static scheme only: an activation observer per linear;
5. sensitivity: per-layer SQNR on calibration data; layers under the threshold stay FP32,
   worst first, within the byte budget (FP32 weights, or INT8 weight-only past the budget);
6. the embedding table: per-row INT8.
"""

from __future__ import annotations

import time

import numpy as np

from zoi.graph.build import linear_prefix
from zoi.numerics import primitives as P
from zoi.quant.calibrate import calibrate, observe, token_batches, tokenize
from zoi.quant.config import QuantConfig
from zoi.quant.detforward import run_graph
from zoi.quant.detmath import fixed_mean, fixed_sum
from zoi.quant.gptq import gptq_quantize
from zoi.quant.observers import make_observer
from zoi.quant.sensitivity import choose_fallback, fallback_cost, layer_sqnr
from zoi.quant.smoothquant import apply_smoothing, role, smooth_factors, smoothing_site

LN_KINDS = ("add_layernorm", "layernorm", "embed")


class _Q:
    """A light LinearQuant stand-in for the emulated runs of the search."""

    def __init__(self, scheme: str = "dynamic", amax: float | None = None):
        self.scheme, self.amax = scheme, amax


def _domain_groups(labels) -> dict[str, list[int]]:
    """Indices of each domain label, domains in order of first appearance."""
    g: dict[str, list[int]] = {}
    for i, d in enumerate(labels):
        g.setdefault(d, []).append(i)
    return g


def _spread_per_domain(groups: dict[str, list[int]], total: int) -> list[int]:
    """About total / len(groups) indices spread evenly over each domain's texts (sorted).
    (Spreading by token length instead, to hold the shortest texts, was tried on MiniLM:
    no better on the worst domain; docs/QUANT.md.)"""
    per = max(1, total // max(1, len(groups)))
    out: list[int] = []
    for ix in groups.values():
        step = max(1, len(ix) // per)
        out.extend(ix[::step][:per])
    return sorted(out)


def worst_domain_error(out: np.ndarray, ref: np.ndarray, labels) -> float:
    """The search's score: the largest embedding_error over the domains of the texts."""
    return max(embedding_error(out[ix], ref[ix])[0] for ix in _domain_groups(labels).values())


def embedding_error(out: np.ndarray, ref: np.ndarray) -> tuple[float, np.ndarray]:
    """score = mean(1 - cos) + mean of the worst 2% of (1 - cos); out/ref L2-normalised."""
    err = 1.0 - fixed_sum(out.astype(np.float64) * ref, 1)
    k = max(1, int(round(0.02 * len(err))))
    worst = np.sort(err)[-k:]
    return float(fixed_mean(err) + fixed_mean(worst)), err


def _input_producer(graph, p: str):
    op = next(o for o in graph.ops if o.kind == "linear" and linear_prefix(o) == p)
    return next((o for o in graph.ops if o.output == op.inputs[0]), None)


def _quantize_plain(w: dict, prefixes) -> dict:
    out = dict(w)
    for p in prefixes:
        out[p + ".w_q"], out[p + ".w_scale"] = P.quantize_weight(w[p + ".w"])
        del out[p + ".w"]
    return out


def _transform_gram(st, shift: np.ndarray | None, scale_div: np.ndarray | None) -> np.ndarray:
    """Gram of x' = (x - shift) / scale_div from the Gram, the sum and the count of x."""
    g = st.gram
    if shift is not None:  # the Gram's own (possibly length-weighted) sums and weight
        z = shift.astype(np.float64)
        sx = st.gram_sum
        g = g - np.outer(z, sx) - np.outer(sx, z) + st.gram_weight * np.outer(z, z)
    if scale_div is not None:
        m = 1.0 / scale_div.astype(np.float64)
        g = g * m[:, None] * m[None, :]
    return g


def _blas_single_thread():
    """One BLAS thread for GPTQ's many small (exact, order-independent) products: with two
    threads on a loaded machine OpenBLAS spends most of the time waiting. No-op without
    threadpoolctl."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover
        import contextlib

        return contextlib.nullcontext()
    return threadpool_limits(1, user_api="blas")


def _round_weights(cfg, st, prefixes, shifts, factors, used, ws, qw) -> None:
    """Step 3: per-channel INT8 weights of every linear into qw (GPTQ where a Gram exists)."""
    for p in prefixes:
        if cfg.gptq and st[p].gram is not None:
            g = _transform_gram(
                st[p],
                shifts.get(p) if used.get(p) == "act" else None,
                factors.get(p) if p in used else None,
            )
            qw[p + ".w_q"], qw[p + ".w_scale"] = gptq_quantize(
                ws[p + ".w"], g, cfg.gptq_damp, act_order=cfg.gptq_act_order
            )
        else:
            qw[p + ".w_q"], qw[p + ".w_scale"] = P.quantize_weight(ws[p + ".w"])
        del qw[p + ".w"]


def run_pipeline(
    spec,
    graph,
    weights: dict,
    tokenizer,
    texts: list[str],
    cfg: QuantConfig,
    progress: bool = False,
    domains=None,
):
    from zoi.graph.compiled import LinearQuant

    t_start = time.perf_counter()
    texts = list(texts)[: cfg.max_calib_texts]
    if domains is not None:
        domains = list(domains)[: cfg.max_calib_texts]
    seqs = tokenize(tokenizer, texts)
    off = int(getattr(spec, "position_offset", 0))
    batches = token_batches(seqs, off, cfg.chunk_tokens)
    prefixes = [linear_prefix(o) for o in graph.ops if o.kind == "linear"]
    roles = sorted({role(p) for p in prefixes}, key=lambda r: [role(p) for p in prefixes].index(r))

    # 1. calibration
    cal = calibrate(
        graph, weights, batches, gram=cfg.gptq, progress=progress, gram_weight=cfg.gptq_weighting
    )
    st = cal.stats

    # search subset, spread over the set
    n = len(seqs)
    labels = list(domains) if domains is not None else ["all"] * n
    if len(labels) != n:
        raise ValueError(f"{len(labels)} domain labels for {n} calibration texts")
    groups = _domain_groups(labels)
    # search subset: spread over each domain's texts, the domains sharing search_texts
    idx = _spread_per_domain(groups, cfg.search_texts)
    sbatches = token_batches([seqs[i] for i in idx], off, cfg.chunk_tokens)
    sref = cal.reference[idx].astype(np.float64)
    slabels = [labels[i] for i in idx]
    qd = {p: _Q("dynamic" if cfg.activations == "static" else cfg.activations) for p in prefixes}

    def evaluate(w_float: dict) -> float:
        wq = _quantize_plain(w_float, prefixes)
        outs = [run_graph(graph, wq, *b, quant=qd, normalize=True) for b in sbatches]
        return worst_domain_error(np.concatenate(outs), sref, slabels)

    # 2. SmoothQuant
    sites = {p: smoothing_site(graph, p) for p in prefixes}
    allow_act = cfg.smooth_targets == "act_mul"
    eligible = [
        p
        for p in prefixes
        if sites[p] in ("ln_fold", "v_fold") or (sites[p] == "act" and allow_act)
    ]
    shifts: dict[str, np.ndarray] = {}
    absmax: dict[str, np.ndarray] = {}
    for p in prefixes:
        s = st[p]
        prod = _input_producer(graph, p)
        if (
            allow_act
            and cfg.smooth_shift
            and sites[p] == "act"
            and prod is not None
            and prod.kind in LN_KINDS
        ):
            shifts[p] = ((s.chan_max + s.chan_min) * 0.5).astype(np.float32)
            absmax[p] = ((s.chan_max - s.chan_min) * 0.5).astype(np.float32)
        else:
            absmax[p] = s.chan_absmax

    def factors_for(alphas: dict[str, float | None]) -> dict[str, np.ndarray]:
        return {
            p: smooth_factors(absmax[p], weights[p + ".w"], alphas[role(p)])
            for p in eligible
            if alphas.get(role(p)) is not None
        }

    def build(
        alphas: dict[str, float | None],
    ) -> tuple[dict, dict[str, str], dict[str, np.ndarray]]:
        f = factors_for(alphas)
        w, used = apply_smoothing(
            graph, weights, f, {p: shifts[p] for p in f if p in shifts}, allow_act
        )
        return w, used, f

    search_log: list[dict] = []
    alphas: dict[str, float | None] = {r: None for r in roles}
    smooth_roles = sorted({role(p) for p in eligible}, key=roles.index)
    scores: dict[tuple, float] = {}

    def score_of(trial: dict[str, float | None]) -> float:
        key = tuple(trial[r] for r in roles)
        if key not in scores:
            scores[key] = evaluate(build(trial)[0])
            search_log.append({"alphas": dict(trial), "score": round(scores[key], 6)})
        return scores[key]

    t_search = time.perf_counter()
    if cfg.smoothquant != "off" and eligible:
        from tqdm.auto import tqdm

        grid = [cfg.smooth_alpha] if cfg.smooth_alpha is not None else list(cfg.alpha_grid)
        off_opt: list[float | None] = [None] if cfg.smoothquant == "auto" else []
        refine = cfg.smooth_alpha is None and len(smooth_roles) > 1
        n_runs = (
            len(off_opt) + len(grid) + (len(smooth_roles) * (len(off_opt) + 2) if refine else 0)
        )
        with tqdm(total=n_runs, desc="SmoothQuant alpha", disable=not progress, leave=False) as bar:
            best, best_trial = float("inf"), dict(alphas)
            for a in off_opt + grid:  # one alpha for the whole model
                trial = {r: (a if r in smooth_roles else None) for r in roles}
                sc = score_of(trial)
                bar.update(1)
                if sc < best:
                    best, best_trial = sc, trial
            if refine and any(best_trial[r] is not None for r in smooth_roles):
                for r in smooth_roles:  # then per role, the others fixed: off (auto) or +-step
                    cur = best_trial[r]
                    near = (
                        []
                        if cur is None
                        else [round(cur + d, 4) for d in (-cfg.alpha_step, cfg.alpha_step)]
                    )
                    for a in off_opt + [a for a in near if 0.0 < a < 1.0]:
                        trial = dict(best_trial)
                        trial[r] = a
                        sc = score_of(trial)
                        bar.update(1)
                        if sc < best:
                            best, best_trial = sc, trial
            alphas = best_trial
    t_search = time.perf_counter() - t_search

    # the chosen smoothing, in float
    ws, used, factors = build(alphas)

    # 3. weights
    t_w = time.perf_counter()
    qw = dict(ws)
    with _blas_single_thread():  # small exact products: threads only contend (same bits)
        _round_weights(cfg, st, prefixes, shifts, factors, used, ws, qw)
    t_w = time.perf_counter() - t_w

    # 4. static scheme: per-tensor amax from the observer, on the (smoothed) FP32 inputs
    amax: dict[str, float | None] = {p: None for p in prefixes}
    if cfg.activations == "static":
        obs = observe(
            graph,
            ws,
            batches,
            lambda: make_observer(cfg.observer, cfg.percentile),
            progress=progress,
        )
        amax = {p: float(obs[p].amax()) for p in prefixes}
    quant = {p: LinearQuant(cfg.activations, amax[p], {}) for p in prefixes}

    # 5. sensitivity and mixed precision
    t_s = time.perf_counter()
    # per-layer SQNR of each domain; a layer counts with its worst domain
    sq_idx = _spread_per_domain(groups, cfg.sqnr_texts)
    sqnr_by: dict[str, dict[str, float]] = {}
    for d in groups:
        sel = [i for i in sq_idx if labels[i] == d]
        if sel:
            bd = token_batches([seqs[i] for i in sel], off, cfg.chunk_tokens)
            sqnr_by[d] = layer_sqnr(graph, ws, qw, quant, bd, progress=progress)
    sqnr = {p: min(v[p] for v in sqnr_by.values()) for p in prefixes}
    sqnr_worst = {p: min(sqnr_by, key=lambda d: sqnr_by[d][p]) for p in prefixes}
    t_s = time.perf_counter() - t_s

    out = dict(qw)
    if cfg.int8_embedding and "embed.word" in out:
        out["embed.word_q"], out["embed.word_scale"] = P.quantize_embedding(out.pop("embed.word"))
    fp32_bytes = sum(a.nbytes for a in weights.values())
    cur = sum(a.nbytes for a in out.values())
    budget = None if cfg.max_weight_ratio is None else cfg.max_weight_ratio * fp32_bytes - cur
    shapes = {p: weights[p + ".w"].shape for p in prefixes}
    below = [p for p in prefixes if sqnr[p] < cfg.sensitivity_db]
    fp32_full = choose_fallback(
        sqnr, cfg.sensitivity_db, {p: fallback_cost(*shapes[p]) for p in prefixes}, budget
    )
    if cfg.fallback_weights == "int8":
        fp32_full = []
    weight_only = (
        [p for p in below if p not in fp32_full] if cfg.fallback_weights in ("auto", "int8") else []
    )
    # opt-in: linears given FP32 activations (INT8 weights) whatever their SQNR,
    # QuantConfig(extra={"fp32_activations": [...]}) (issue 21: docs/QUANT.md, "Fidelity per
    # domain", l3.ffn2 on MiniLM); off by default, so the default config's digest is unchanged
    forced = list((cfg.extra or {}).get("fp32_activations", ()))
    unknown = [p for p in forced if p not in prefixes]
    if unknown:
        raise ValueError(
            f"QuantConfig.extra fp32_activations names no linear of the model: {unknown} "
            f"(the linears: {', '.join(prefixes)})"
        )
    forced = [p for p in forced if p not in fp32_full and p not in weight_only]
    weight_only += forced
    for p in fp32_full + weight_only:
        site = used.get(p)
        # an "act" migration would need the kernel's pre-transform: undo it (original w, b)
        if site == "act":
            for k in (".act_mul", ".act_shift"):
                out.pop(p + k, None)
            w_f, b_f = weights[p + ".w"], weights[p + ".b"]
            g = st[p].gram
        else:
            w_f, b_f = ws[p + ".w"], ws[p + ".b"]
            g = _transform_gram(st[p], None, factors.get(p)) if st[p].gram is not None else None
        out[p + ".b"] = b_f
        for k in (".w_q", ".w_scale"):
            out.pop(p + k, None)
        if p in fp32_full:
            out[p + ".w"] = w_f
            quant[p].info["weights"] = "fp32"
        else:
            out[p + ".w_q"], out[p + ".w_scale"] = (
                gptq_quantize(w_f, g, cfg.gptq_damp, act_order=cfg.gptq_act_order)
                if cfg.gptq and g is not None
                else P.quantize_weight(w_f)
            )
            quant[p].info["weights"] = "int8"
        quant[p].scheme = "fp32"
        quant[p].amax = None
        quant[p].info["fallback"] = (
            "fp32_activations (QuantConfig.extra)"
            if p in forced
            else f"sqnr {sqnr[p]:.1f} dB < {cfg.sensitivity_db:g} dB"
        )

    for p in prefixes:
        quant[p].info.update(
            {
                "sqnr_db": round(float(sqnr[p]), 3),
                "smooth": (
                    {"site": used[p], "alpha": alphas[role(p)]}
                    if p in used and p in factors
                    else None
                ),
                "gptq": bool(cfg.gptq and quant[p].info.get("weights") != "fp32"),
                "act_tok_absmax_mean": round(st[p].tok_absmax_mean, 4),
                "act_absmax": round(float(st[p].chan_absmax.max()), 4),
            }
        )
    # the V rows of a qkv whose o was folded carry 1/s: record s, reports need it (eval's SQNR)
    for p, site in used.items():
        if site in ("v_fold", "ln_fold"):
            quant[p].info["in_scale"] = [float(v) for v in factors[p]]

    from zoi.quant.provenance import record

    summary = {
        "inputs": record(spec, weights, tokenizer, texts, cfg),
        "config": cfg.to_dict(),
        "calibration": {
            "texts": len(texts),
            "tokens": cal.tokens,
            "seconds": round(cal.seconds, 2),
        },
        "smoothquant": {
            "alphas": alphas,
            "search": search_log,
            "seconds": round(t_search, 2),
            "sites": {p: used[p] for p in used},
        },
        "weights_seconds": round(t_w, 2),
        "sqnr_seconds": round(t_s, 2),
        "sqnr_db": {p: round(float(sqnr[p]), 3) for p in prefixes},
        "sqnr_worst_domain": sqnr_worst,
        "calibration_domains": {d: len(ix) for d, ix in groups.items()},
        "fallback_fp32": fp32_full,
        "fallback_weight_only": weight_only,
        "weights_bytes": int(sum(a.nbytes for a in out.values())),
        "fp32_weights_bytes": int(fp32_bytes),
        "pipeline_seconds": round(time.perf_counter() - t_start, 2),
    }
    summary["weights_ratio"] = round(summary["weights_bytes"] / max(1, fp32_bytes), 4)
    return out, quant, summary
