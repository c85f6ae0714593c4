"""Fidelity of 7-bit weights (|w_q| <= 63: the AVX2 lever, lab/cpu/README.md) on the real MiniLM.

    python lab/cpu/w7_fidelity.py [--texts 120]

Compiles the bundled all-MiniLM-L6-v2 to INT8 twice with the default quantiser (GPTQ): as is
(8-bit weights, QMAX 127) and with GPTQ's QMAX patched to 63 (7-bit weights, rounded once with
error feedback; the SmoothQuant search still scores with 8-bit plain rounding), then the
cosine of each CPU engine's embeddings to the FP32 engine's on a spread of zoi's calibration
texts (the same texts the calibration used: an optimistic set), and the halved-codes variant
(8-bit GPTQ codes / 2, rounded: double rounding) for comparison.
"""

from __future__ import annotations

import argparse

import numpy as np


def cos(a, b):
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return (a * b).sum(1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--texts", type=int, default=120)
    args = ap.parse_args()
    import zoi
    import zoi.quant.gptq as G
    from zoi.data import calibration_texts

    texts = list(calibration_texts())[::7][: args.texts]
    ref = zoi.compile(None, device="cpu", precision="fp32").encode(texts)
    e8 = zoi.compile(None, device="cpu", precision="int8")
    c8 = cos(e8.encode(texts), ref)
    G.QMAX = 63
    try:
        e7 = zoi.compile(None, device="cpu", precision="int8")
    finally:
        G.QMAX = 127
    lin = [k for k in e7.model.weights if k.endswith(".w_q") and not k.startswith("embed")]
    top = max(int(np.abs(e7.model.weights[k].astype(np.int32)).max()) for k in lin)
    c7 = cos(e7.encode(texts), ref)
    for name, c in (("8-bit GPTQ", c8), ("7-bit GPTQ", c7)):
        print(f"{name}: cos mean {c.mean():.5f} min {c.min():.5f}")
    print(f"7-bit engine: {len(lin)} linears, max |w_q| {top}")


if __name__ == "__main__":
    main()
