"""A quick harness run for the bench tests: tiny counts, no load gate, the JSON it wrote."""

from __future__ import annotations

import json

from zoi.bench import harness

QUICK = dict(
    device="cpu",
    calls=3,
    calls_slow=2,
    rounds=2,
    warmup_s=0.0,
    warmup_min_calls=1,
    accuracy_n=0,
    rss=False,
    load_threshold=100.0,
    load_wait_s=0.0,
)


def quick_config(out, providers: list[str], workloads: list[str], **kw) -> harness.Config:
    """A harness config with the QUICK settings (`kw` overrides or adds to them) writing `out`."""
    return harness.Config(providers=providers, workloads=workloads, out_file=out, **{**QUICK, **kw})


def run_harness(cfg: harness.Config) -> dict:
    """harness.main(cfg), which must exit 0; the run's JSON."""
    assert harness.main(cfg) == 0
    return json.loads(cfg.out_file.read_text())
