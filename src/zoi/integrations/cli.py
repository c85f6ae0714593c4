"""`zoi export triton ...`, `zoi deploy ray ...`, and `--target` for `zoi bench serve`.

zoi.integrations sits above the surfaces (it builds on zoi.serve and zoi.bench), so rather
than the bench importing it, it adds `--target zoi|triton|ray` to the `zoi bench serve`
parser that zoi.bench registered, and wraps that command: start the target, point the load
at it (`--url`), stop it after.
"""

from __future__ import annotations

import argparse


def register(sub) -> None:
    p = sub.add_parser("export", help="export an artifact for another inference server (triton)")
    targets = p.add_subparsers(dest="export_target", required=True)
    from zoi.integrations.triton import register_export

    register_export(targets)

    p = sub.add_parser("deploy", help="run an artifact on a scale-out engine (ray)")
    targets = p.add_subparsers(dest="deploy_target", required=True)
    from zoi.integrations.ray import register_deploy

    register_deploy(targets)
    extend_bench_serve(sub)


def _subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser | None:
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction) and name in a.choices:
            return a.choices[name]
    return None


def extend_bench_serve(sub) -> None:
    """Add --target (and its options) to `zoi bench serve`, if zoi.bench registered it."""
    from zoi.integrations.targets import add_target_args

    bench = sub.choices.get("bench")
    serve = _subparser(bench, "serve") if bench is not None else None
    if serve is None:
        return
    add_target_args(serve)
    inner = serve.get_default("func")

    def cmd_bench_serve_target(args) -> int:
        if args.url is not None:
            return inner(args)
        import sys

        from zoi.integrations.targets import start_target

        print(f"starting {args.target} ...", file=sys.stderr, flush=True)
        started = start_target(args)
        try:
            args.url, args.served_model = started.url, started.model
            args.route = started.route or args.route
            return inner(args)
        finally:
            started.stop()

    serve.set_defaults(func=cmd_bench_serve_target)
