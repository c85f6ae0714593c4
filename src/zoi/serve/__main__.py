"""`python -m zoi.serve [MODEL] [options]`: the same as `zoi serve`."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    from zoi.errors import ZoiError
    from zoi.serve.cli import register

    ap = argparse.ArgumentParser(prog="python -m zoi.serve")
    sub = ap.add_subparsers(dest="cmd", required=True)
    register(sub)
    args = ap.parse_args(["serve", *(sys.argv[1:] if argv is None else argv)])
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except (ZoiError, ValueError, OSError) as e:
        print(f"zoi serve: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
