"""The benchmark harness (``zoi bench``): zoi against the peers, JSON results and plots.

See docs/BENCH.md and the measurement method in BENCHMARKS.md.
"""
