import os, time, json, numpy as np, torch, zoi
p = os.environ["ZOI_MINILM_DIR"]
text = " ".join(["the quick brown fox jumps over the lazy dog"] * 14)
res = {}
for fr in (False, True):
    t0 = time.perf_counter()
    eng = zoi.compile(p, device="cuda", precision="int8", quant_config={"first_row_residual": fr})
    ct = time.perf_counter() - t0
    for name, texts in (("1x128", [text]), ("8x128", [text] * 8), ("1x16", ["hello world, a short query of sixteen tokens or so ok"])):
        for _ in range(30): eng.encode(texts)
        ts = []
        for _ in range(300):
            t = time.perf_counter(); eng.encode(texts); ts.append(time.perf_counter() - t)
        res[f"fr={fr} {name}"] = round(float(np.median(ts)) * 1e6, 1)
    res[f"fr={fr} compile_s"] = round(ct, 1)
    print(res, flush=True)
print(json.dumps({"card": torch.cuda.get_device_name(), "p50_us_encode": res}))
