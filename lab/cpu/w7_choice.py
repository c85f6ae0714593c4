"""The quantiser's per-linear 7-bit weight choice on the real MiniLM (docs/QUANT.md "7-bit weights").

    python lab/cpu/w7_choice.py [--loss-db 1.0] [--save DIR]

Compiles the bundled all-MiniLM-L6-v2 to INT8 with weight_bits "auto" (QuantConfig.extra
weight_bits_loss_db = --loss-db) and prints each linear's 8-bit and 7-bit output SQNR (worst
calibration domain, zoi.quant.sensitivity.layer_sqnr) and the bits chosen; --save writes the
artifact (for `zoi eval ARTIFACT` and the bench).
"""

from __future__ import annotations

import argparse


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--loss-db", type=float, default=None)
    ap.add_argument("--weight-bits", default="auto")
    ap.add_argument("--save", default=None)
    args = ap.parse_args()
    import numpy as np

    import zoi

    extra = {"weight_bits": args.weight_bits}
    if args.loss_db is not None:
        extra["weight_bits_loss_db"] = args.loss_db
    e = zoi.compile(None, device="cpu", precision="int8", quant_config={"extra": extra})
    n7 = 0
    for p, q in e.model.quant.items():
        i = q.info
        wq = e.model.weights.get(p + ".w_q")
        top = int(np.abs(wq.astype(np.int32)).max()) if wq is not None else None
        bits = i.get("weight_bits", 8)
        n7 += bits == 7
        print(
            f"{p:10s} {q.scheme!s:13s} sqnr8 {i.get('sqnr_db')} sqnr7 {i.get('sqnr7_db')} "
            f"bits {bits} max|w_q| {top}"
        )
    print(f"{n7} of {len(e.model.quant)} linears 7-bit")
    if args.save:
        print("saved", e.save(args.save))


if __name__ == "__main__":
    main()
