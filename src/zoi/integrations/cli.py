"""`zoi export triton ...` and `zoi deploy ray ...` (see docs/DEPLOY.md)."""

from __future__ import annotations


def register(sub) -> None:
    p = sub.add_parser("export", help="export an artifact for another inference server (triton)")
    targets = p.add_subparsers(dest="export_target", required=True)
    from zoi.integrations.triton import register_export

    register_export(targets)

    p = sub.add_parser("deploy", help="run an artifact on a scale-out engine (ray)")
    targets = p.add_subparsers(dest="deploy_target", required=True)
    from zoi.integrations.ray import register_deploy

    register_deploy(targets)
