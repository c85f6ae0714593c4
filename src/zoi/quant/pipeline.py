"""The quantisation pipeline behind `zoi.quant.quantize_model`.

1. calibrate: one FP32 pass of the native CPU engine over the calibration texts (channel
   ranges, Gram matrices for GPTQ, the FP32 embeddings as the yardstick), batch by batch;
2. SmoothQuant: alpha searched on a subset of the calibration texts, first one alpha for
   the model, then refined per linear role (qkv / o / ffn1 / ffn2, "off" included); each
   candidate runs on the INT8 CPU engine of its own weights (plain rounding), and its score
   is the embedding error against FP32: mean(1 - cos) + mean of the worst 2%, of the worst
   domain;
3. weights: per-channel INT8, GPTQ rounding by default, on a Gram whose token rows weigh
   1 / L**2 of their text's length L (QuantConfig.gptq_weighting "pooled": the mean-pooled
   embedding's error, so short texts and their [CLS] / [SEP] rows count; docs/QUANT.md);
4. static scheme only: an activation observer per linear (another FP32 engine pass);
5. sensitivity: per-layer SQNR on calibration data (the FP32 engine's inputs, each linear's
   FP32 output against its emulated INT8 output); layers under the threshold stay FP32,
   worst first, within the byte budget (FP32 weights, or INT8 weight-only past the budget);
6. the embedding table: per-row INT8.

BLAS runs single-threaded with the second core taken by the quantiser itself (zoi.quant.blas),
so a machine gives the same artifact bytes whatever its thread counts.
"""

from __future__ import annotations

import os
import tempfile
import time

import numpy as np

from zoi.graph.build import linear_prefix
from zoi.numerics import primitives as P
from zoi.numerics.reference import pre_transform
from zoi.quant import blas
from zoi.quant.calibrate import calibrate, observe, spread_batches, token_batches, tokenize
from zoi.quant.config import QuantConfig
from zoi.quant.detmath import fixed_mean, fixed_sum
from zoi.quant.gptq import (
    QMAX_OF,
    choose_weight_bits,
    gptq_quantize,
    round_weight,
    weight_bits_option,
)
from zoi.quant.native import LinearInputs, batch_tokens, int8_engine, release_file_pages
from zoi.quant.observers import make_observer
from zoi.quant.sensitivity import choose_fallback, fallback_cost, layer_sqnr
from zoi.quant.smoothquant import (
    _ln_weight_names,
    _producers,
    apply_smoothing,
    role,
    smooth_factors,
    smoothing_site,
    weight_colmax,
)

# the FP32 passes' batches (tokens): the arena and each batch's temporaries stay small
FP32_BATCH_TOKENS = 2048

LN_KINDS = ("add_layernorm", "layernorm", "embed")
# past this hidden size the search uses QuantConfig.search_texts_wide texts
WIDE_HIDDEN = 512


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


def worst_domain_error(out: np.ndarray, ref: np.ndarray, labels, score: str = "cos") -> float:
    """The search's score: the largest error over the domains of the texts, each domain's
    embedding_error ("cos") or pair_error ("pairs")."""
    f = pair_error if score == "pairs" else (lambda o, r: embedding_error(o, r)[0])
    return max(f(out[ix], ref[ix]) for ix in _domain_groups(labels).values())


def pair_error(out: np.ndarray, ref: np.ndarray) -> float:
    """RMS over the pairs of texts (i != j) of the change of their cosine similarity,
    out_i . out_j - ref_i . ref_j (rows L2-normalised): what reorders neighbours (top-10
    agreement). An error along a text's own direction, or orthogonal to the others, costs
    1 - cos but reorders nothing; one towards another text's direction does."""
    n = len(out)
    if n < 2:
        return embedding_error(out, ref)[0]
    o, r = out.astype(np.float64), ref.astype(np.float64)
    d = o @ o.T - r @ r.T  # symmetric, diagonal ~0; BLAS single-threaded (the same bits)
    np.fill_diagonal(d, 0.0)
    return float(np.sqrt(fixed_sum((d * d).ravel()[None, :], 1)[0] / (n * (n - 1))))


def embedding_error(out: np.ndarray, ref: np.ndarray) -> tuple[float, np.ndarray]:
    """score = mean(1 - cos) + mean of the worst 2% of (1 - cos); out/ref L2-normalised."""
    err = 1.0 - fixed_sum(out.astype(np.float64) * ref, 1)
    k = max(1, int(round(0.02 * len(err))))
    worst = np.sort(err)[-k:]
    return float(fixed_mean(err) + fixed_mean(worst)), err


def _input_producer(graph, p: str):
    op = next(o for o in graph.ops if o.kind == "linear" and linear_prefix(o) == p)
    return next((o for o in graph.ops if o.output == op.inputs[0]), None)


def _transform_gram(st, shift: np.ndarray | None, scale_div: np.ndarray | None) -> np.ndarray:
    """Gram of x' = (x - shift) / scale_div from the Gram, the sum and the count of x: a new
    float64 array (GPTQ may overwrite it)."""
    g = _gram_of(st).astype(np.float64)
    if shift is not None:  # the Gram's own (possibly length-weighted) sums and weight
        z = shift.astype(np.float64)
        sx = st.gram_sum
        g -= np.outer(z, sx)
        g -= np.outer(sx, z)
        g += st.gram_weight * np.outer(z, z)
    if scale_div is not None:
        m = 1.0 / scale_div.astype(np.float64)
        g *= m[:, None]
        g *= m[None, :]
    return g


def _gram_of(st) -> np.ndarray | None:
    if st.gram is None and st.gram_file:
        return np.load(st.gram_file)
    return st.gram


# past this many bytes of Grams, they wait in a temporary file from the end of calibration
# to GPTQ (which reads each back in turn): the search does not hold them (MPNet: 540 MB)
SPILL_GRAM_BYTES = 256 << 20


def _spill_grams(st: dict, spill_dir: str) -> None:
    if sum(s.gram.nbytes for s in st.values() if s.gram is not None) <= SPILL_GRAM_BYTES:
        return
    for p, s in st.items():
        if s.gram is not None:
            s.gram_file = os.path.join(spill_dir, f"{p}.npy")
            np.save(s.gram_file, s.gram)
            s.gram = None


def _gptq_job(cfg, st, shifts, factors, used, qmax=127):
    """(p, smoothed float w) -> GPTQ's (w_q, w_scale) of linear p under the smoothing
    (factors, used); None where p has no Gram (plain rounding then). qmax: 63 for 7-bit."""

    def job(p, w):
        if not (cfg.gptq and (st[p].gram is not None or st[p].gram_file)):
            return None
        return gptq_quantize(
            w,
            _transform_gram(  # a new array, GPTQ's to overwrite and free
                st[p],
                shifts.get(p) if used.get(p) == "act" else None,
                factors.get(p) if p in used else None,
            ),
            cfg.gptq_damp,
            act_order=cfg.gptq_act_order,
            overwrite=True,
            qmax=qmax,
        )

    return job


def _round_weights(cfg, st, cands, alphas, shifts, factors, used, qw, progress) -> None:
    """Step 3: per-channel INT8 weights of every linear into qw (GPTQ where a Gram exists),
    each linear's smoothed float weights made for its job alone; two linears at a time
    (zoi.quant.blas: single-threaded BLAS each, the same bits). A search that rounded its
    candidates with GPTQ already holds the chosen candidate's integers: they are taken as
    they are (the same computation, so the same bytes)."""
    from tqdm.auto import tqdm

    if cands.rounder is not None and cfg.gptq:
        for p in cands.prefixes:
            ent = cands.cache.get(cands.key(p, alphas))
            if ent is None:  # alphas given (QuantConfig.extra) rather than searched
                break
        else:
            for p in cands.prefixes:
                qw.update(cands.cache[cands.key(p, alphas)])
                qw.pop(p + ".w", None)
            return

    gptq_of = _gptq_job(cfg, st, shifts, factors, used)

    def job(p):
        ent = cands.smoothed(p, alphas)
        w = ent.pop(p + ".w")
        q = gptq_of(p, w)
        ent[p + ".w_q"], ent[p + ".w_scale"] = q if q is not None else P.quantize_weight(w)
        return ent

    with tqdm(
        total=len(cands.prefixes), desc="GPTQ", unit="linear", disable=not progress, leave=False
    ) as bar:
        order = sorted(cands.prefixes, key=lambda p: -cands.weights[p + ".w"].size)  # largest first
        for p, ent in zip(order, blas.parallel_map(job, order), strict=True):
            qw.update(ent)
            qw.pop(p + ".w", None)
            bar.update(1)
    release_file_pages(cands.weights)


class _Candidates:
    """The weights of SmoothQuant candidates, linear by linear: a linear's smoothed float
    arrays depend on the alphas of the roles in `deps` (its own; a qkv's also the alpha of the
    o whose factors fold into its V rows), so each is made from the original weights alone
    (no whole smoothed copy of the model), and its plain INT8 rounding is cached while the
    current best candidate uses it."""

    def __init__(self, graph, weights, prefixes, sites, eligible, absmax, shifts, allow_act):
        self.graph, self.weights, self.prefixes = graph, weights, prefixes
        self.eligible, self.absmax, self.shifts, self.allow_act = (
            eligible,
            absmax,
            shifts,
            allow_act,
        )
        prods = _producers(graph)
        ops = {linear_prefix(o): o for o in graph.ops if o.kind == "linear"}
        self.deps: dict[str, list[str]] = {p: [p] for p in prefixes}
        self.ln: dict[str, tuple[str, str]] = {}
        for p in prefixes:
            src = ops[p].inputs[0]
            if sites[p] == "v_fold":  # o's factors divide the V rows of the qkv before it
                qkv = linear_prefix(prods[prods[src].inputs[0]])
                self.deps[qkv].append(p)
            elif sites[p] == "ln_fold":
                self.ln[p] = _ln_weight_names(prods[src])
        self.factors: dict[tuple, np.ndarray] = {}
        self.colmax: dict[str, np.ndarray] = {}
        self.cache: dict[tuple, dict] = {}

    def factor(self, p: str, alpha: float) -> np.ndarray:
        k = (p, alpha)
        if k not in self.factors:
            if p not in self.colmax:
                self.colmax[p] = weight_colmax(self.weights[p + ".w"])
            w = self.weights[p + ".w"]
            self.factors[k] = smooth_factors(self.absmax[p], w, alpha, self.colmax[p])
        return self.factors[k]

    def key(self, p: str, alphas: dict) -> tuple:
        return (p,) + tuple(
            alphas.get(role(d)) if d in self.eligible else None for d in self.deps[p]
        )

    def smoothed(self, p: str, alphas: dict) -> dict:
        """Linear p's float arrays in the model smoothed with `alphas`: p.w, p.b, p.act_mul /
        p.act_shift where the kernel applies them, its LayerNorm's w / b where they fold."""
        k = self.key(p, alphas)
        f = {
            d: self.factor(d, a) for d, a in zip(self.deps[p], k[1:], strict=True) if a is not None
        }
        sh = {d: self.shifts[d] for d in f if d in self.shifts}
        w1, used = apply_smoothing(self.graph, self.weights, f, sh, self.allow_act)
        ent = {n: w1[n] for n in (p + ".w", p + ".b", p + ".act_mul", p + ".act_shift") if n in w1}
        if used.get(p) == "ln_fold":
            ent.update({n: w1[n] for n in self.ln[p]})
        return ent

    def out_scale(self, p: str, alphas: dict) -> np.ndarray | None:
        """Per output channel of p: its smoothed output over its original one (the V rows of
        a qkv carry 1 / s of the o after it); None when they are equal."""
        v = [d for d in self.deps[p][1:] if d in self.eligible and alphas.get(role(d)) is not None]
        if not v:
            return None
        s = self.factor(v[0], alphas[role(v[0])])
        out = np.ones(self.weights[p + ".w"].shape[0], np.float32)
        out[2 * s.shape[0] :] = (1.0 / s).astype(np.float32)  # the rows apply_smoothing divides
        return out

    # QuantConfig.search_rounding "gptq": (p, alphas, smoothed w) -> (w_q, w_scale); its
    # entries are kept for the whole search (a later role's refinement reuses the alphas the
    # model-wide stage rounded), so `keep_only` does not drop them
    rounder = None

    def weights_for(self, alphas: dict) -> dict:
        """The whole weight dict of a candidate, every linear rounded to INT8 (to nearest, or
        by `rounder`), the missing linears two at a time."""
        missing = [p for p in self.prefixes if self.key(p, alphas) not in self.cache]

        def make(p):
            ent = self.smoothed(p, alphas)
            w = ent.pop(p + ".w")
            if self.rounder is not None:
                ent[p + ".w_q"], ent[p + ".w_scale"] = self.rounder(p, alphas, w)
            else:
                ent[p + ".w_q"], ent[p + ".w_scale"] = P.quantize_weight(w)
            return ent

        for p, ent in zip(missing, blas.parallel_map(make, missing), strict=True):
            self.cache[self.key(p, alphas)] = ent
        out = dict(self.weights)
        for p in self.prefixes:
            out.update(self.cache[self.key(p, alphas)])
            out.pop(p + ".w", None)
        return out

    def keep_only(self, alphas: dict, force: bool = False) -> None:
        """Drop the cached linears the candidate `alphas` does not use (with a rounder, only
        when forced: the search's end)."""
        if self.rounder is not None and not force:
            return
        keep = {self.key(p, alphas) for p in self.prefixes}
        for k in [k for k in self.cache if k not in keep]:
            del self.cache[k]


def _smoothed_input(used, factors):
    """x -> the input buffer linear p reads in the smoothed model, from the FP32 engine's x of
    the original model: x / s where the factors folded into the producer (LayerNorm, V rows);
    x itself where the kernel applies (x - act_shift) * act_mul (zoi.numerics.reference's
    pre_transform, which linear_apply runs)."""

    def f(p: str, x: np.ndarray) -> np.ndarray:
        if used.get(p) in ("ln_fold", "v_fold"):
            return (x / factors[p][None, :]).astype(np.float32)
        return x

    return f


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
    with blas.single_threaded(), tempfile.TemporaryDirectory(prefix="zoi-quant-") as spill:
        return _run(spec, graph, weights, tokenizer, texts, cfg, progress, domains, spill)


def _run(spec, graph, weights, tokenizer, texts, cfg, progress, domains, spill_dir):
    from zoi.graph.compiled import LinearQuant

    t_start = time.perf_counter()
    texts = list(texts)[: cfg.max_calib_texts]
    if domains is not None:
        domains = list(domains)[: cfg.max_calib_texts]
    seqs = tokenize(tokenizer, texts)
    off = int(getattr(spec, "position_offset", 0))
    fp32_tokens = min(cfg.chunk_tokens, FP32_BATCH_TOKENS)
    batches = token_batches(seqs, off, fp32_tokens)
    prefixes = [linear_prefix(o) for o in graph.ops if o.kind == "linear"]
    roles = sorted({role(p) for p in prefixes}, key=lambda r: [role(p) for p in prefixes].index(r))

    # 1. calibration
    wide = int(getattr(spec, "hidden", 0)) > WIDE_HIDDEN
    cal = calibrate(
        spec,
        weights,
        batches,
        gram=cfg.gptq,
        progress=progress,
        gram_weight=cfg.gptq_weighting,
        graph=graph,
        gram_batches=spread_batches(batches, cfg.gram_tokens_wide) if wide else None,
    )
    st = cal.stats
    _spill_grams(st, spill_dir)

    # search subset, spread over the set
    n = len(seqs)
    labels = list(domains) if domains is not None else ["all"] * n
    if len(labels) != n:
        raise ValueError(f"{len(labels)} domain labels for {n} calibration texts")
    groups = _domain_groups(labels)
    # search subset: spread over each domain's texts, the domains sharing search_texts
    idx = _spread_per_domain(groups, cfg.search_texts_wide if wide else cfg.search_texts)
    sbatches = token_batches([seqs[i] for i in idx], off, cfg.chunk_tokens)
    sref = cal.reference[idx].astype(np.float64)
    slabels = [labels[i] for i in idx]
    search_scheme = "dynamic" if cfg.activations == "static" else cfg.activations
    frr = bool(cfg.first_row_residual)  # the search sees the numerics that ship
    squant = {p: LinearQuant(search_scheme, first_row=frr) for p in prefixes}

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
    cands = _Candidates(graph, weights, prefixes, sites, set(eligible), absmax, shifts, allow_act)
    s_tokens = batch_tokens(sbatches)
    if cfg.search_rounding == "gptq" and cfg.gptq:

        def rounder(p, trial, w):
            a = trial.get(role(p)) if p in cands.eligible else None
            f = {p: cands.factor(p, a)} if a is not None else {}
            job = _gptq_job(cfg, st, shifts, f, {p: sites[p]} if f else {})
            out = job(p, w)
            return out if out is not None else P.quantize_weight(w)

        cands.rounder = rounder

    def evaluate(trial: dict[str, float | None]) -> float:
        eng = int8_engine(spec, cands.weights_for(trial), squant, s_tokens, graph)
        outs = [eng.run(*b, True) for b in sbatches]
        del eng
        release_file_pages(weights)  # the next candidate faults back what it reads
        return worst_domain_error(np.concatenate(outs), sref, slabels, cfg.search_score)

    def factors_for(alphas: dict[str, float | None]) -> dict[str, np.ndarray]:
        return {
            p: cands.factor(p, alphas[role(p)]) for p in eligible if alphas.get(role(p)) is not None
        }

    search_log: list[dict] = []
    alphas: dict[str, float | None] = {r: None for r in roles}
    smooth_roles = sorted({role(p) for p in eligible}, key=roles.index)
    scores: dict[tuple, float] = {}

    def score_of(trial: dict[str, float | None]) -> float:
        key = tuple(trial[r] for r in roles)
        if key not in scores:
            scores[key] = evaluate(trial)
            search_log.append({"alphas": dict(trial), "score": round(scores[key], 6)})
        return scores[key]

    t_search = time.perf_counter()
    if cfg.smoothquant != "off" and eligible and "alphas" not in (cfg.extra or {}):
        from tqdm.auto import tqdm

        grid = [cfg.smooth_alpha] if cfg.smooth_alpha is not None else list(cfg.alpha_grid)
        off_opt: list[float | None] = [None] if cfg.smoothquant == "auto" else []
        refine = cfg.smooth_alpha is None and len(smooth_roles) > 1 and cfg.alpha_step > 0
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
                cands.keep_only(best_trial)
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
                        cands.keep_only(best_trial)
            alphas = best_trial
    cands.keep_only(alphas, force=True)  # a GPTQ search's chosen integers are the artifact's
    t_search = time.perf_counter() - t_search
    fixed = (cfg.extra or {}).get("alphas")
    if fixed is not None:  # opt-in: the per-role alphas given, no search (experiments)
        unknown = set(fixed) - set(roles)
        if unknown:
            raise ValueError(f"QuantConfig.extra alphas names no role of the model: {unknown}")
        alphas = {r: fixed.get(r) for r in roles}

    # the chosen smoothing: its factors and sites (the arrays are made linear by linear)
    factors = factors_for(alphas)
    used = {p: sites[p] for p in factors}

    # 3. weights
    release_file_pages(weights)  # the search read every weight: let its pages go
    t_w = time.perf_counter()
    qw = dict(weights)
    _round_weights(cfg, st, cands, alphas, shifts, factors, used, qw, progress)
    cands.cache.clear()
    t_w = time.perf_counter() - t_w
    smoothed = _smoothed_input(used, factors)

    # 4. static scheme: per-tensor amax from the observer, on the (smoothed) FP32 inputs
    amax: dict[str, float | None] = {p: None for p in prefixes}
    if cfg.activations == "static":
        obs = observe(
            spec,
            weights,
            batches,
            lambda: make_observer(cfg.observer, cfg.percentile),
            transform=lambda p, x: pre_transform(smoothed(p, x), qw, p),
            progress=progress,
            graph=graph,
        )
        amax = {p: float(obs[p].amax()) for p in prefixes}
    quant = {p: LinearQuant(cfg.activations, amax[p], {}, frr) for p in prefixes}

    # 5. sensitivity and mixed precision
    t_s = time.perf_counter()
    # per-layer SQNR of each domain; a layer counts with its worst domain
    sq_idx = _spread_per_domain(groups, cfg.sqnr_texts)
    by_domain = {d: [i for i in sq_idx if labels[i] == d] for d in groups}
    by_domain = {d: sel for d, sel in by_domain.items() if sel}
    sq_batches = {
        d: token_batches([seqs[i] for i in sel], off, fp32_tokens) for d, sel in by_domain.items()
    }
    runner = LinearInputs(
        spec, weights, max(batch_tokens(b) for b in sq_batches.values()), graph=graph
    )
    out_scale = {p: cands.out_scale(p, alphas) for p in prefixes}
    sqnr_by = layer_sqnr(
        runner, sq_batches, weights, qw, quant, smoothed, out_scale, progress=progress
    )
    sqnr = {p: min(v[p] for v in sqnr_by.values()) for p in prefixes}
    # 7-bit weights (QuantConfig.extra["weight_bits"]; docs/QUANT.md "7-bit weights"): every
    # linear's 7-bit GPTQ integers, and for "auto" their per-layer SQNR on the same batches
    wbits = weight_bits_option(cfg.extra)
    qw7, sqnr7 = {}, {}
    if wbits != 8:
        gptq7 = _gptq_job(cfg, st, shifts, factors, used, qmax=QMAX_OF[7])

        def job7(p):
            w = cands.smoothed(p, alphas)[p + ".w"]
            q = gptq7(p, w)
            return q if q is not None else round_weight(w, 7)

        for p, q in zip(prefixes, blas.parallel_map(job7, prefixes), strict=True):
            qw7[p + ".w_q"], qw7[p + ".w_scale"] = q
        if wbits == "auto":
            by7 = layer_sqnr(runner, sq_batches, weights, {**qw, **qw7}, quant, smoothed, out_scale)
            sqnr7 = {p: min(v[p] for v in by7.values()) for p in prefixes}
    del runner
    release_file_pages(weights)
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
    # QuantConfig(extra={"fp32_activations": [...]}) (docs/QUANT.md, "Fidelity per
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
            # its own migration undone; a qkv's V rows still carry the o's folded factors
            ent = cands.smoothed(p, {**alphas, role(p): None})
            w_f, b_f = ent[p + ".w"], ent[p + ".b"]
            g = _gram_of(st[p])
        else:
            ent = cands.smoothed(p, alphas)
            w_f, b_f = ent[p + ".w"], ent[p + ".b"]
            g = (
                _transform_gram(st[p], None, factors.get(p))
                if st[p].gram is not None or st[p].gram_file
                else None
            )
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

    if wbits != 8:  # 7-bit integers where chosen, among the linears left INT8 end to end
        i8 = [p for p in prefixes if quant[p].scheme != "fp32"]
        loss = (cfg.extra or {}).get("weight_bits_loss_db")
        for p, b in choose_weight_bits(wbits, sqnr, sqnr7, i8, loss).items():
            if p in sqnr7:
                quant[p].info["sqnr7_db"] = round(float(sqnr7[p]), 3)
            if b == 7:
                out[p + ".w_q"], out[p + ".w_scale"] = qw7[p + ".w_q"], qw7[p + ".w_scale"]
                quant[p].info["weight_bits"] = 7
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
