"""Fidelity of u7 activations (asymmetric per-token q in [0, 127] instead of [0, 255]: the
AVX2 loop of 2.5 ops per 32 MACs with 7-bit weights, lab/cpu/README.md) on an INT8 artifact.

    python lab/cpu/u7_fidelity.py ARTIFACT [--json OUT]

Runs `zoi eval ARTIFACT` (the reference backend: zoi.numerics.reference, the emulation every
backend matches) with zoi.numerics.primitives.UQMAX patched to 127, so every dynamic_asym
linear quantises its rows to 7 bits (zero point in [0, 127], scale range / 127). Nothing else
changes (weights, SmoothQuant, fallbacks are the artifact's).
"""

from __future__ import annotations

import sys


def main():
    import zoi.numerics.primitives as P
    from zoi.cli import main as cli

    P.UQMAX = 127
    sys.exit(cli(["eval", *sys.argv[1:]]))


if __name__ == "__main__":
    main()
