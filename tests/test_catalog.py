"""The architecture table (`zoi info --archs`) lists every architecture the loader accepts, with
every model_type it maps, and nothing it does not."""

from __future__ import annotations

import json
import subprocess
import sys

from zoi.frontend.catalog import rows
from zoi.frontend.checkpoint import SUPPORTED_TYPES


def test_every_loadable_architecture_has_a_row():
    listed = {t: r.arch for r in rows() for t in r.model_types}
    assert listed == SUPPORTED_TYPES
    assert len({r.arch for r in rows()}) == len(rows())  # one row per architecture
    for r in rows():
        assert r.cpu and r.cuda and r.outputs and r.examples


def test_zoi_info_archs_prints_the_table():
    out = subprocess.run(
        [sys.executable, "-m", "zoi", "info", "--archs", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert [r["arch"] for r in got] == [r.arch for r in rows()]
