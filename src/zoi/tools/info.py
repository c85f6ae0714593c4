"""`zoi info`: the machine (CPU model, ISA, GPU, tokenizer), a model folder or artifact (spec,
pooling, arena, per-linear quantisation), or the architectures zoi runs (--archs)."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path


def _console():
    from rich.console import Console

    return Console(stderr=False)


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or "unknown"


def system_info() -> dict:
    from zoi.backends import cuda_status

    info: dict = {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")
        else os.cpu_count(),
    }
    try:
        from zoi import _cpu

        feats = _cpu.cpu_info()
        info["isa_best"] = feats["best_isa"]
        try:  # the CLI is the API's edge: the CPU options from the environment, as an engine gets them
            from zoi.backends.cpu.options import CpuOptions, apply_cpu_options

            opts = apply_cpu_options(CpuOptions.from_env())
            info["isa_active"] = _cpu.active_isa()
            info["cpu_options"] = dataclasses.asdict(opts)
        except ValueError as e:
            info["isa_active"] = f"error: {e}"
        info["cpu_features"] = {k: v for k, v in feats.items() if isinstance(v, bool)}
    except ImportError as e:
        info["isa_best"] = f"native core not built ({e})"
    ok, why = cuda_status()
    info["cuda"] = {"usable": ok, "detail": why}
    from zoi.frontend.tokenizer import _native_module

    has_native = _native_module() is not None
    info["tokenizer"] = (
        "native WordPiece, byte-level BPE, SentencePiece BPE and Unigram (zoi._cpu) for the files "
        "they cover exactly"
        if has_native
        else "no native tokenizer"
    ) + f", HF tokenizers for the others; ZOI_TOKENIZER={os.environ.get('ZOI_TOKENIZER', 'auto')}"
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    return info


def _tokenizer_kind(folder: Path, max_positions: int) -> str:
    """Which tokenizer runs this model's tokenizer.json (native WordPiece or HF)."""
    from zoi.errors import ZoiError
    from zoi.frontend.tokenizer import Tokenizer, tokenizer_choice

    try:
        choice = tokenizer_choice()  # the CLI's edge: ZOI_TOKENIZER, else auto
        return Tokenizer.from_file(folder / "tokenizer.json", max_positions, tokenizer=choice).kind
    except ZoiError as e:
        return f"error: {e}"


def _short(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, (list, tuple)):
        if len(v) > 4:
            return f"[{len(v)} values]"
        return "[" + " ".join(_short(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}={_short(x)}" for k, x in v.items()) + "}"
    return str(v)


def quant_details(info: dict) -> str:
    """One linear's quantisation record as `key=value` pairs: numbers rounded, long lists
    (per-channel scales) summarised by their length, nothing cut mid-word."""
    return ", ".join(f"{k}={_short(v)}" for k, v in info.items()) if info else "-"


def cmd_info(args) -> int:
    from rich.markup import escape
    from rich.table import Table

    con = _console()
    if args.path:
        from zoi.engine import is_artifact, read_artifact_meta

        p = Path(args.path)
        t = Table(title=str(p), show_header=False)
        if is_artifact(p):
            from zoi.frontend.spec import ModelSpec
            from zoi.graph import build_graph, plan_memory

            meta = read_artifact_meta(p)
            spec = ModelSpec.from_dict(meta["spec"])
            plan = plan_memory(build_graph(spec), meta["max_tokens"], meta.get("max_batch"))
            wbytes = (p / "weights.safetensors").stat().st_size
            pooled = (meta.get("meta") or {}).get("pooling")
            rows = {
                "kind": "zoi artifact",
                "precision": meta["precision"],
                **{k: v for k, v in meta["spec"].items()},
                **(
                    {"pooling": f"{spec.pooling} ({pooled['origin']})"}
                    if isinstance(pooled, dict) and isinstance(pooled.get("origin"), str)
                    else {}
                ),
                "max_tokens": plan.max_tokens,
                "max_batch": plan.max_batch,
                "arena": f"{plan.arena_bytes / 2**20:.2f} MiB ({plan.arena_bytes} bytes)",
                "weights file": f"{wbytes / 2**20:.2f} MiB",
                "tokenizer": _tokenizer_kind(p, spec.max_positions),
            }
            for k, v in rows.items():
                t.add_row(k, str(v))
            con.print(t)
            if meta.get("quant"):
                q = Table(title="quantisation per linear")
                q.add_column("linear", no_wrap=True)
                q.add_column("scheme", no_wrap=True)
                q.add_column("details", overflow="fold")
                for name, lq in meta["quant"].items():
                    q.add_row(
                        name, lq.get("scheme", "?"), escape(quant_details(lq.get("info", {})))
                    )
                con.print(q)
            if args.json:
                print(json.dumps({**meta, "arena_bytes": plan.arena_bytes}, indent=1))
            return 0
        from zoi.frontend import load_spec
        from zoi.frontend.checkpoint import pooling_origin
        from zoi.frontend.hub import resolve_model

        folder = resolve_model(args.path)
        spec = load_spec(folder)
        for k, v in spec.to_dict().items():
            if k == "pooling" and not spec.head:  # and where it comes from
                v = f"{v} ({pooling_origin(folder)}; --pooling at compile to override)"
            t.add_row(k, str(v))
        t.add_row("tokenizer", _tokenizer_kind(Path(folder), spec.max_positions))
        con.print(t)
        return 0
    if args.archs:
        return _print_archs(con, args.json)
    info = system_info()
    if args.json:
        print(json.dumps(info, indent=1))
        return 0
    t = Table(title="zoi info", show_header=False)
    t.add_row("CPU", info["cpu"])
    t.add_row("cores", f"{info['cores']} ({info['usable_cores']} usable)")
    t.add_row("ISA (best)", str(info.get("isa_best")))
    t.add_row(
        "ISA (active)",
        str(info.get("isa_active", "-"))
        + ("  [ZOI_CPU_ISA]" if (info.get("cpu_options") or {}).get("isa") else ""),
    )
    feats = info.get("cpu_features", {})
    t.add_row("CPU features", " ".join(k for k, v in feats.items() if v) or "-")
    t.add_row(
        "CUDA GPU", escape(("yes: " if info["cuda"]["usable"] else "no: ") + info["cuda"]["detail"])
    )
    t.add_row("triton", info["triton"] or "not installed")
    t.add_row("tokenizer", info["tokenizer"])
    con.print(t)
    return 0


def _print_archs(con, as_json: bool) -> int:
    """The architectures zoi compiles, the precisions per device and the outputs."""
    import dataclasses

    from rich.table import Table

    from zoi.frontend.catalog import rows

    if as_json:
        print(json.dumps([dataclasses.asdict(r) for r in rows()], indent=1))
        return 0
    t = Table(title="architectures (interpreter: checked under the Triton interpreter only)")
    for col in ("architecture", "model_type", "e.g.", "CPU", "CUDA", "outputs"):
        t.add_column(col, overflow="fold")
    for r in rows():
        t.add_row(r.arch, ", ".join(r.model_types), r.examples, r.cpu, r.cuda, ", ".join(r.outputs))
    con.print(t)
    return 0
