"""GPU cost of the first-row residual (QuantConfig.first_row_residual): the real MiniLM INT8
compiled twice (off / on) on the CUDA device, `encode` p50 in microseconds at 1x16, 1x128 and
8x128 (texts in, host-observed), one process. ZOI_MINILM_DIR: the model folder."""

import json
import os
import time

import numpy as np
import torch

import zoi


def main() -> None:
    path = os.environ["ZOI_MINILM_DIR"]
    text = " ".join(["the quick brown fox jumps over the lazy dog"] * 14)
    shapes = {
        "1x128": [text],
        "8x128": [text] * 8,
        "1x16": ["hello world, a short query of sixteen tokens or so ok"],
    }
    res = {}
    for fr in (False, True):
        t0 = time.perf_counter()
        eng = zoi.compile(
            path, device="cuda", precision="int8", quant_config={"first_row_residual": fr}
        )
        res[f"fr={fr} compile_s"] = round(time.perf_counter() - t0, 1)
        for name, texts in shapes.items():
            for _ in range(30):
                eng.encode(texts)
            ts = []
            for _ in range(300):
                t = time.perf_counter()
                eng.encode(texts)
                ts.append(time.perf_counter() - t)
            res[f"fr={fr} {name}"] = round(float(np.median(ts)) * 1e6, 1)
        print(res, flush=True)
    print(json.dumps({"card": torch.cuda.get_device_name(), "p50_us_encode": res}))


if __name__ == "__main__":
    main()
