"""`zoi eval MODEL|ARTIFACT`: what INT8 cost, measured against the FP32 original.

Figures (on zoi/data/eval.txt by default, texts never used for calibration or tuning):

- sentence-embedding cosine of each text, INT8 against FP32 (L2-normalised): mean, min, p1;
- top-10 neighbour agreement: for each text, the share of its 10 nearest neighbours (cosine,
  within the set, itself excluded) that the INT8 embeddings give as the FP32 ones do; mean
  over the texts. Top-1 agreement: the share of texts whose nearest neighbour is the same;
- per-layer SQNR (dB) of every linear on these texts: the FP32 model's input of the layer,
  through the quantised layer against through the FP32 layer (SmoothQuant's rescaling undone);
- the weight bytes against FP32, and the scheme of each layer.

The INT8 side runs on the chosen backend (default "reference", the numpy emulation) and,
as a cross-check, through zoi.quant's own emulator: a backend that does not reproduce the
numerics of docs/QUANT.md shows up as a large "backend vs emulation" gap.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from zoi.graph.build import linear_prefix
from zoi.numerics.reference import linear_apply
from zoi.quant.calibrate import token_batches, tokenize
from zoi.quant.fidelity import agreement, cosine_rows
from zoi.quant.forward import run_graph


def embedding_report(ref: np.ndarray, test: np.ndarray) -> dict:
    cos = cosine_rows(ref, test)
    out = {
        "texts": int(len(cos)),
        "cos_mean": float(cos.mean()),
        "cos_min": float(cos.min()),
        "cos_p1": float(np.percentile(cos, 1)),
    }
    out.update(agreement(ref, test, 10))
    return out


def _basis(graph, quant: dict) -> tuple[dict, dict]:
    """Per linear: the divisor of its input (ln_fold / v_fold) and the multiplier of its output
    (a qkv whose o was folded into its V rows) that map the quantised model onto the FP32 one."""
    in_div: dict[str, np.ndarray] = {}
    out_mul: dict[str, np.ndarray] = {}
    lin = {linear_prefix(o): o for o in graph.ops if o.kind == "linear"}
    prod = {o.output: o for o in graph.ops}
    for p, op in lin.items():
        info = getattr(quant.get(p), "info", {}) or {}
        s = info.get("in_scale")
        if s is None:
            continue
        s = np.asarray(s, np.float32)
        in_div[p] = s
        sm = info.get("smooth") or {}
        if sm.get("site") == "v_fold":
            att = prod[op.inputs[0]]
            qp = linear_prefix(prod[att.inputs[0]])
            H = s.shape[0]
            out_mul[qp] = np.concatenate([np.ones(2 * H, np.float32), s])
    return in_div, out_mul


def layer_sqnr_eval(
    graph, fp32_weights: dict, q_weights: dict, quant: dict, batches
) -> dict[str, float]:
    """Per-layer SQNR of the quantised model's layers on the FP32 model's inputs."""
    in_div, out_mul = _basis(graph, quant)
    sig: dict[str, float] = {}
    noise: dict[str, float] = {}

    def tap(p, x, y):
        xin = x / in_div[p][None, :] if p in in_div else x
        lq = quant.get(p)
        yq = linear_apply(xin.astype(np.float32), q_weights, p, lq)
        if p in out_mul:
            yq = yq * out_mul[p][None, :]
        y64 = y.astype(np.float64)
        sig[p] = sig.get(p, 0.0) + float(np.sum(y64 * y64))
        noise[p] = noise.get(p, 0.0) + float(np.sum((y64 - yq) ** 2))

    for b in batches:
        run_graph(graph, fp32_weights, *b, tap=tap)
    return {
        p: (float("inf") if noise[p] == 0 else 10 * float(np.log10(max(sig[p], 1e-300) / noise[p])))
        for p in sig
    }


def _reference_source(model: str, q, reference) -> str | None:
    """The FP32 model folder an INT8 artifact is measured against: `reference` when given,
    else the folder recorded at compile time (None: the bundled default model)."""
    if reference is not None:
        return str(reference)
    meta = q.model.meta
    if meta.get("source_default"):
        return None
    src = meta.get("source")
    if src and Path(src).is_dir():
        return src
    why = (
        f"the model folder it was compiled from, {src}, is not there (moved or on another machine)"
        if src
        else "it does not record the model folder it was compiled from"
    )
    raise ValueError(
        f"{model}: cannot build the FP32 side to compare against: {why}. Pass the original "
        "Hugging Face model folder: zoi eval ARTIFACT --reference MODEL_DIR"
    )


def _check_same_model(model: str, ref_src, f, q) -> None:
    a = {k: v for k, v in f.spec.to_dict().items() if k != "name"}
    b = {k: v for k, v in q.spec.to_dict().items() if k != "name"}
    diff = [f"{k} {a[k]!r} vs {b[k]!r}" for k in a if a[k] != b.get(k)]
    if diff:
        raise ValueError(
            f"--reference {ref_src or 'the bundled model'} is not the model {model} was compiled "
            f"from ({'; '.join(diff)}); pass the folder it was compiled from"
        )


def _load_engines(
    model: str | None,
    device: str,
    config,
    calibration,
    progress: bool,
    reference=None,
    precision: str = "int8",
):
    import zoi
    from zoi.engine import is_artifact

    t0 = time.perf_counter()
    if device == "emulated":  # the INT8 side through zoi.quant's own emulator (no backend)
        device = "reference"
    if model is not None and is_artifact(model):
        q = zoi.load(model, device=device)
        if q.precision not in ("int8", "fp8"):
            raise ValueError(
                f"{model}: precision {q.precision!r}; zoi eval measures INT8 and FP8 artifacts"
            )
        src = _reference_source(model, q, reference)
        f = zoi.compile(src, device="reference", precision="fp32")
        _check_same_model(model, src, f, q)
    else:
        if reference is not None:
            raise ValueError(
                "--reference is for an INT8 artifact; MODEL is compiled to both FP32 and INT8"
            )
        if precision not in ("int8", "fp8"):
            raise ValueError(f"precision must be 'int8' or 'fp8', got {precision!r}")
        if precision == "fp8" and (calibration is not None or config is not None):
            raise ValueError(
                "precision='fp8' has dynamic scales: nothing to calibrate (drop --calibrate "
                "/ --quant-config)"
            )
        f = zoi.compile(model, device="reference", precision="fp32")
        q = zoi.compile(
            model,
            device=device,
            precision=precision,
            calibration=calibration,
            quant_config=config,
            progress=progress,
        )
    return f, q, time.perf_counter() - t0


def evaluate(
    model: str | None = None,
    texts: Sequence[str] | None = None,
    device: str = "reference",
    config=None,
    calibration=None,
    progress: bool = False,
    sqnr_texts: int = 256,
    domains: Sequence[str] | None = None,
    reference=None,
    precision: str = "int8",
) -> dict:
    """Compile (or load) INT8 and FP32, encode `texts` (default: zoi's eval set), report.
    Without `texts`, also every domain's held-out set (zoi.quant.fidelity; `domains`
    default: zoi.data.default_domains for the model)."""
    from zoi.data import default_domains, eval_texts, is_multilingual
    from zoi.quant.fidelity import domain_figures, summarise

    per_domain = texts is None
    texts = list(texts) if texts is not None else eval_texts()
    f, q, t_compile = _load_engines(
        model, device, config, calibration, progress, reference, precision
    )
    if q.spec.head:  # a task head: agreement of its outputs (zoi.tools.eval_heads)
        from zoi.tools.eval_heads import evaluate_head

        return evaluate_head(f, q, texts, t_compile)
    m = q.model
    graph = m.graph
    seqs = tokenize(q.tokenizer, texts)
    batches = token_batches(seqs, q.spec.position_offset, 4096)
    t0 = time.perf_counter()
    e_f = f.encode(texts, normalize_embeddings=True)
    emu = np.concatenate(
        [run_graph(graph, m.weights, *b, quant=m.quant, normalize=True) for b in batches]
    )
    e_q = emu if device == "emulated" else q.encode(texts, normalize_embeddings=True)
    t_enc = time.perf_counter() - t0
    gap = cosine_rows(emu, e_q)

    sel = list(range(0, len(seqs), max(1, len(seqs) // max(1, sqnr_texts))))[:sqnr_texts]
    sq = layer_sqnr_eval(
        graph,
        f.model.weights,
        m.weights,
        m.quant,
        token_batches([seqs[i] for i in sel], q.spec.position_offset, 4096),
    )
    layers = []
    for op in graph.ops:
        if op.kind != "linear":
            continue
        p = linear_prefix(op)
        lq = m.quant.get(p)
        info = dict(getattr(lq, "info", {}) or {})
        sm = info.get("smooth") or {}
        layers.append(
            {
                "layer": p,
                "scheme": getattr(lq, "scheme", "fp32"),
                "weights": info.get("weights", "int8" if f"{p}.w_q" in m.weights else "fp32"),
                "smooth": f"{sm.get('site')} a={sm.get('alpha')}" if sm else "-",
                "sqnr_calib_db": info.get("sqnr_db"),
                "sqnr_eval_db": round(sq.get(p, float("nan")), 3),
            }
        )
    if per_domain:
        doms = list(domains or default_domains(is_multilingual(m.spec)))
        t1 = time.perf_counter()
        dfig = domain_figures(f, q, doms, known={"prose": (texts, e_f, e_q)})
        t_enc += time.perf_counter() - t1
    wq = int(sum(a.nbytes for a in m.weights.values()))
    if m.precision == "fp8":  # the FP32 weights are quantised when a backend packs them
        from zoi.quant.fp8 import fp8_weight_bytes

        wq = fp8_weight_bytes(m.weights, m.quant)
    wf = int(sum(a.nbytes for a in f.model.weights.values()))
    rep = {
        "model": m.spec.name,
        "source": m.meta.get("source", model),
        "reference": str(reference) if reference is not None else f.model.meta.get("source"),
        "device": "emulated" if device == "emulated" else q.device,
        "precision": m.precision,
        "texts": len(texts),
        "embedding": embedding_report(e_f, e_q),
        "backend_vs_emulation_cos_min": float(gap.min()),
        "weights_bytes": wq,
        "fp32_weights_bytes": wf,
        "weights_ratio": round(wq / max(1, wf), 4),
        "layers": layers,
        "quant_report": {
            k: v for k, v in (m.meta.get("quant_report") or {}).items() if k != "search"
        },
        "seconds": {"compile_or_load": round(t_compile, 2), "encode": round(t_enc, 2)},
    }
    if per_domain:
        rep["domains"] = dfig
        rep["worst_domain"] = summarise(dfig)
        if m.precision == "fp8":  # the FP8 target (the INT8 ones are in "meets")
            from zoi.quant.fidelity import FP8_TARGETS

            rep["fp8_targets"] = dict(FP8_TARGETS)
            rep["fp8_targets_met"] = all(
                d[k] >= v for d in dfig.values() for k, v in FP8_TARGETS.items()
            )
    rep["inputs"] = m.meta.get("inputs")
    return rep


def render(rep: dict, console=None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    if rep.get("head"):
        from zoi.tools.eval_heads import render_head

        return render_head(rep, console)
    e = rep["embedding"]
    t = Table(
        title=f"zoi eval: {rep['model']} {rep.get('precision', 'int8').upper()} "
        f"({rep['device']}) vs FP32, {rep['texts']} texts"
    )
    for c in ("figure", "value"):
        t.add_column(c)
    t.add_row("cosine mean", f"{e['cos_mean']:.5f}")
    t.add_row("cosine min", f"{e['cos_min']:.5f}")
    t.add_row("cosine p1", f"{e['cos_p1']:.5f}")
    t.add_row("top-10 neighbour agreement", f"{e['top10']:.4f}")
    t.add_row("top-1 agreement", f"{e['top1']:.4f}")
    t.add_row(
        "weights vs FP32", f"{rep['weights_ratio']:.3f}x ({rep['weights_bytes'] / 2**20:.1f} MiB)"
    )
    t.add_row("backend vs emulation (min cos)", f"{rep['backend_vs_emulation_cos_min']:.6f}")
    console.print(t)
    lt = Table(title="per-layer SQNR (dB)")
    for c in ("layer", "scheme", "weights", "smoothing", "calibration", "eval"):
        lt.add_column(c)
    for r in rep["layers"]:
        lt.add_row(
            r["layer"],
            r["scheme"],
            r["weights"],
            r["smooth"],
            "-" if r["sqnr_calib_db"] is None else f"{r['sqnr_calib_db']:.1f}",
            f"{r['sqnr_eval_db']:.1f}",
        )
    console.print(lt)
    if rep.get("domains"):
        from zoi.quant.fidelity import TARGETS

        dt = Table(
            title=f"per domain (zoi's held-out sets), {rep.get('precision', 'int8').upper()} vs FP32"
        )
        for c in ("domain", "texts", "cos mean", "cos min", "top-10", "top-1", "worst text"):
            dt.add_column(c)
        for name, d in rep["domains"].items():
            ok = all(d["meets"].values())
            w = d["worst"][0] if d["worst"] else {"cos": float("nan"), "text": ""}
            dt.add_row(
                f"{name}" + ("" if ok else " [red](below target)[/]"),
                str(d["texts"]),
                f"{d['cos_mean']:.5f}",
                f"{d['cos_min']:.5f}",
                f"{d['top10']:.4f}",
                f"{d['top1']:.4f}",
                f"{w['cos']:.4f} {w['text'][:60]!r}",
            )
        console.print(dt)
        console.print(
            f"targets: mean >= {TARGETS['cos_mean']}, min >= {TARGETS['cos_min']}, "
            f"top-10 >= {TARGETS['top10']}; all met: {rep['worst_domain']['all_targets_met']}"
        )


def main(args) -> int:
    from zoi.data import read_lines

    texts = read_lines(args.texts) if args.texts else None
    cfg = None
    if getattr(args, "quant_config", None):
        cfg = (
            json.loads(Path(args.quant_config).read_text())
            if Path(args.quant_config).exists()
            else json.loads(args.quant_config)
        )
    budget = getattr(args, "calibration", None)
    if budget is not None:  # the preset, --quant-config's fields on top (quant.config.config_for)
        cfg = {**(cfg or {}), "calibration": budget}
    rep = evaluate(
        args.model,
        texts,
        device=args.device,
        config=cfg,
        calibration=args.calibrate,
        progress=not args.quiet,
        domains=args.domains.split(",") if getattr(args, "domains", None) else None,
        reference=getattr(args, "reference", None),
        precision=getattr(args, "precision", "int8"),
    )
    if getattr(args, "markdown", False):
        from zoi.quant.fidelity import markdown_table

        print(markdown_table(rep), end="")
    else:
        render(rep)
    if args.json:
        Path(args.json).write_text(json.dumps(rep, indent=2, default=float))
    return 0
