"""The `zoi eval` subcommand: zoi/cli.py calls `register(subparsers)`."""

from __future__ import annotations

import argparse


def register(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "eval",
        help="INT8 quality against FP32: cosine, neighbour agreement, per-layer SQNR",
        description="Compile MODEL (a Hugging Face folder; default: the bundled all-MiniLM-L6-v2) "
        "to INT8, or load an INT8 ARTIFACT, and measure it against the FP32 original on "
        "held-out texts (default: zoi's eval set). An ARTIFACT is compared with the model "
        "folder recorded in it, or the one --reference names.",
    )
    p.add_argument("model", nargs="?", default=None, help="model folder or zoi artifact")
    p.add_argument(
        "--reference",
        metavar="MODEL_DIR",
        help="ARTIFACT only: the Hugging Face folder it was compiled from (default: the path "
        "recorded in the artifact; needed once the artifact or the model has moved)",
    )
    p.add_argument("--texts", help="file of texts, one per line (default: zoi/data/eval.txt)")
    p.add_argument("--json", help="write the full report as JSON here")
    p.add_argument(
        "--device",
        default="reference",
        help="backend of the INT8 side: reference (default), cpu, cuda, or emulated "
        "(zoi.quant's own integer-exact emulator, no backend)",
    )
    p.add_argument(
        "--precision",
        default="int8",
        choices=["int8", "fp8"],
        help="MODEL only: what the quantised side is compiled to: int8 (default) or fp8 "
        "(E4M3, dynamic scales; --device reference / emulated emulates it, cuda needs sm_89+)",
    )
    p.add_argument(
        "--calibrate", help="calibration texts, one per line (MODEL only; default: zoi's set)"
    )
    p.add_argument("--quant-config", help="QuantConfig as JSON (inline or a file), MODEL only")
    from zoi.quant.config import CALIBRATION_BUDGETS

    p.add_argument(
        "--calibration",
        default=None,
        choices=list(CALIBRATION_BUDGETS),
        help="MODEL only: the INT8 compile budget (QuantConfig preset; --quant-config fields "
        "on top); default: default",
    )
    p.add_argument(
        "--domains",
        help="comma-separated held-out domains to measure (default: prose, questions, code, "
        "techdocs, queries; + multilingual for multilingual models)",
    )
    p.add_argument(
        "--markdown", action="store_true", help="print the per-domain table as markdown (README)"
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=_run)
    return p


def _run(args) -> int:
    from zoi.tools.eval import main

    return main(args)


def main(argv=None) -> int:  # `python -m zoi.tools.cli eval ...` without zoi/cli.py
    ap = argparse.ArgumentParser(prog="zoi")
    sub = ap.add_subparsers(dest="cmd", required=True)
    register(sub)
    args = ap.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
