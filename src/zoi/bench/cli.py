"""``zoi bench`` (run the harness) and ``zoi bench plot`` (draw PNGs from result files).

``zoi/cli.py`` calls ``register(subparsers)``; ``python -m zoi.bench`` works too.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _csv(s: str) -> list[str]:
    return [x.strip() for x in s.split(",") if x.strip()]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: minilm 1x16/1x128/8x128/mixed, fewer calls (< 3 min)",
    )
    p.add_argument(
        "--device",
        default="auto",
        choices=["auto", "cpu", "cuda", "all"],
        help="providers to run (auto: CPU, plus CUDA when torch sees a GPU); decode workloads: "
        "cuda runs zoi-cuda-w8 (weight-only INT8), zoi-cuda-int8 (W8A8), zoi-cuda-fp16, "
        "transformers-cuda-fp16",
    )
    p.add_argument(
        "--providers",
        type=_csv,
        default=None,
        help="comma-separated provider names or patterns, e.g. 'zoi-*,torch-fp32'",
    )
    p.add_argument(
        "--workloads",
        type=_csv,
        default=None,
        help="comma-separated workloads, e.g. 'minilm-1x128,bert-base-32x128'",
    )
    p.add_argument(
        "--peer-isa",
        default="native",
        choices=["native", "avx2"],
        help="avx2: cap the peers at AVX2 where each library allows it (CTranslate2, PyTorch, "
        "OpenVINO; ONNX Runtime cannot be capped and is marked 'native ISA'); zoi runs the same "
        "ISA (ZOI_CPU_ISA=avx2) unless ZOI_CPU_ISA is set",
    )
    p.add_argument("--threads", type=int, default=2, help="threads for every provider (default 2)")
    p.add_argument(
        "--calls", type=int, default=None, help="timed calls per cell (default 200; quick 20)"
    )
    p.add_argument(
        "--calls-slow",
        type=int,
        default=None,
        help="timed calls per cell when a call takes over 100 ms (default 20; quick 3)",
    )
    p.add_argument(
        "--rounds", type=int, default=None, help="interleaved rounds (default 10; quick 2)"
    )
    p.add_argument(
        "--warmup", type=float, default=None, help="warm-up seconds per cell (default 1; quick 0.2)"
    )
    p.add_argument(
        "--accuracy",
        type=int,
        default=None,
        help="real sentences for accuracy (default 500; quick 100)",
    )
    p.add_argument(
        "--streams",
        nargs="+",
        default=None,
        metavar="N",
        help="decode workloads: concurrent stream counts, e.g. '--streams 8 32' or '8,32' "
        "(default 8 on cpu, 8 and 32 on cuda)",
    )
    p.add_argument(
        "--new-tokens",
        type=int,
        default=None,
        help="decode workloads: tokens generated per sequence (default 64 on cpu, 128 with cuda; "
        "quick 32)",
    )
    p.add_argument(
        "--prompt-len",
        type=int,
        default=None,
        help="decode workloads: prompt tokens (default 128; quick 32)",
    )
    p.add_argument("--no-rss", action="store_true", help="skip the fresh-process peak RSS runs")
    p.add_argument(
        "--load-threshold",
        type=float,
        default=0.3,
        help="other processes' CPU load (cores) tolerated before a workload starts",
    )
    p.add_argument(
        "--load-wait",
        type=float,
        default=120.0,
        help="seconds to wait for the machine to become quiet before each workload",
    )
    p.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help="peer conversions (default ~/.cache/zoi/bench, or $ZOI_BENCH_CACHE)",
    )
    p.add_argument(
        "--out-dir", type=Path, default=None, help="where the JSON goes (default bench/results)"
    )
    p.add_argument("--out", type=Path, default=None, help="exact JSON file to write")


def run_bench(args: argparse.Namespace) -> int:
    if args.workloads and all(w.endswith("-decode") for w in args.workloads):  # decoders
        from zoi.bench.decode import run_from_args

        return run_from_args(args)
    from zoi.bench.harness import Config, main
    from zoi.bench.rerank import WORKLOAD, main_rerank

    if args.workloads and WORKLOAD in args.workloads:  # the cross-encoder workload
        rc = main_rerank(args)
        args.workloads = [w for w in args.workloads if w != WORKLOAD]
        if not args.workloads:
            return rc

    q = args.quick
    cfg = Config(
        quick=q,
        device=args.device,
        providers=args.providers,
        workloads=args.workloads,
        threads=args.threads,
        calls=args.calls or (20 if q else 200),
        calls_slow=args.calls_slow or (3 if q else 20),
        warmup_min_calls=2 if q else 3,
        rounds=args.rounds or (2 if q else 10),
        warmup_s=args.warmup if args.warmup is not None else (0.2 if q else 1.0),
        accuracy_n=args.accuracy if args.accuracy is not None else (100 if q else 500),
        rss=not args.no_rss,
        load_threshold=args.load_threshold,
        load_wait_s=args.load_wait if not q else min(args.load_wait, 10.0),
        cache_dir=args.cache_dir,
        out_dir=args.out_dir,
        out_file=args.out,
        peer_isa=getattr(args, "peer_isa", "native"),
        argv=(["zoi", "bench", *args._argv] if hasattr(args, "_argv") else ["zoi", *sys.argv[1:]]),
    )
    return main(cfg)


def run_plot(args: argparse.Namespace) -> int:
    from zoi.bench.plot import plot_files

    files = plot_files(args.files, out_dir=args.out_dir)
    for f in files:
        print(f)
    return 0 if files else 1


def run_show(args: argparse.Namespace) -> int:
    import json

    from zoi.bench.plot import latest
    from zoi.bench.report import print_report

    f = args.file or latest(None)
    print_report(json.loads(Path(f).read_text()))
    print(f)
    return 0


def _dispatch(args: argparse.Namespace) -> int:
    action = getattr(args, "bench_action", None)
    if action == "plot":
        return run_plot(args)
    if action == "show":
        return run_show(args)
    return run_bench(args)


def register(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "bench",
        help="benchmark zoi against the peers (JSON + plots under bench/results/)",
        description="Measure zoi and the peer libraries on the workloads of BENCHMARKS.md; "
        "every provider runs in its own fresh process, rounds interleaved.",
    )
    add_arguments(p)
    sub = p.add_subparsers(dest="bench_action")
    pp = sub.add_parser("plot", help="draw PNGs from result JSON files")
    pp.add_argument(
        "files",
        nargs="*",
        type=Path,
        help="result files (default: the latest CPU and GPU full runs in bench/results)",
    )
    pp.add_argument(
        "--out-dir", type=Path, default=None, help="where PNGs go (default: next to the JSON)"
    )
    ps = sub.add_parser("show", help="print the tables of a result file (default: the latest)")
    ps.add_argument("file", nargs="?", type=Path, default=None)
    try:  # `zoi bench serve`: load test of the HTTP server (sets its own func)
        from zoi.bench.loadtest import register_bench
    except ImportError:  # the serve extra is not installed
        pass
    else:
        register_bench(sub)
    p.set_defaults(func=_dispatch)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="zoi")
    sub = parser.add_subparsers(dest="command", required=True)
    register(sub)
    args = parser.parse_args(["bench", *argv])
    args._argv = argv
    return args.func(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
