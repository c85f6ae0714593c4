"""Host overhead of zoi's text path, in one process, A/B interleaved:
``python -m zoi.bench.e2e [--device cpu|cuda] [--precision int8,fp32] [--shapes 1x16,mixed1000]``.

For each shape, the same texts are timed four ways, round-robin in rotating order so that
load from other processes hits all of them alike: the native tokenizer alone (texts -> packed
ids), ``run_packed`` on the ids it gives, ``encode(texts)`` (tokenisation included) and
``encode(texts, batch_size=32)``; sentence-transformers ``encode`` too when installed
(``--st``). Reported: p50 per call, ``encode / run_packed`` and the share of the call spent
outside ``run_packed``, with the machine's load (foreign cores) during the measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np


def _shape_texts(tok, shape: str) -> list[str]:
    from zoi.bench.text import exact_length_texts, natural_texts

    if shape.startswith("mixed"):
        return natural_texts(tok, int(shape[5:] or 1000), max_len=256)
    b, s = (int(x) for x in shape.split("x"))
    return exact_length_texts(tok, b, s, offset=b * 7 + s)


def measure(engine, texts, reps: int, rounds: int, st=None) -> dict:
    from zoi.bench.sysinfo import LoadMeter, loadavg

    ids, pos, cu = engine.tokenizer.encode_packed(texts)
    nat = engine.tokenizer.native
    cases = {
        "tokenizer": (lambda: nat.encode_packed(texts, True, engine.spec.position_offset, 0))
        if nat is not None
        else (lambda: engine.tokenizer.encode_packed(texts)),
        "run_packed": lambda: engine.run_packed(ids, pos, cu),
        "encode": lambda: engine.encode(texts, normalize_embeddings=False),
        "encode_bs32": lambda: engine.encode(texts, batch_size=32, normalize_embeddings=False),
    }
    if st is not None:
        cases["sentence_transformers"] = lambda: st.encode(
            texts, batch_size=32, convert_to_numpy=True, show_progress_bar=False
        )
    a = engine.run_packed(ids, pos, cu)
    b = engine.encode(texts, normalize_embeddings=False)
    assert np.array_equal(a, b), "encode and run_packed differ on the same ids"
    for f in cases.values():  # warm-up
        for _ in range(2):
            f()
    ns: dict[str, list[int]] = {k: [] for k in cases}
    names = list(cases)
    meter = LoadMeter()
    la0 = loadavg()
    meter.start()
    for r in range(rounds):
        for k in names[r % len(names) :] + names[: r % len(names)]:
            f = cases[k]
            n = reps if k != "sentence_transformers" else max(1, reps // 10)
            for _ in range(n):
                t0 = time.perf_counter_ns()
                f()
                ns[k].append(time.perf_counter_ns() - t0)
    foreign = meter.stop()
    host = host_overhead(engine, texts, ids, pos, cu, max(200, reps * 20))
    p50 = {k: float(np.median(v)) / 1e3 for k, v in ns.items()}
    out = {
        "texts": len(texts),
        "tokens": int(len(ids)),
        "p50_us": p50,
        "p25_us": {k: float(np.percentile(v, 25)) / 1e3 for k, v in ns.items()},
        "calls": {k: len(v) for k, v in ns.items()},
        "encode_over_run_packed": p50["encode"] / p50["run_packed"],
        "encode_bs32_over_run_packed": p50["encode_bs32"] / p50["run_packed"],
        "overhead_share": (p50["encode"] - p50["run_packed"]) / p50["encode"],
        "foreign_cores": round(foreign, 2),
        "loadavg_before": la0,
        "loadavg_after": loadavg(),
    }
    if "sentence_transformers" in p50:
        out["st_over_encode"] = p50["sentence_transformers"] / p50["encode"]
    out["host"] = host
    out["host_overhead_share_p25"] = host["overhead_p25_us"] / out["p25_us"]["run_packed"]
    return out


def host_overhead(engine, texts, ids, pos, cu, n: int) -> dict:
    """What encode adds on the host, without the forward's noise: the backend's run_into
    replaced by a stub that only fills its output, then encode(texts) and run_packed(ids)
    timed alternately, call by call (min, p25 and median of the difference)."""
    backend = engine.backend
    real = backend.run_into

    def stub(ids_, pos_, cu_, normalize, out):
        out.fill(1.0)

    backend.run_into = stub
    try:
        a, b = [], []
        clock = time.perf_counter_ns
        for _ in range(n):
            t0 = clock()
            engine.encode(texts, normalize_embeddings=False)
            t1 = clock()
            engine.run_packed(ids, pos, cu)
            t2 = clock()
            a.append(t1 - t0)
            b.append(t2 - t1)
    finally:
        del backend.run_into  # the instance attribute: the class's method again
        assert backend.run_into == real
    a, b = np.asarray(a) / 1e3, np.asarray(b) / 1e3
    q = lambda x, p: float(np.percentile(x, p))  # noqa: E731
    return {
        "encode_host_us": {"min": float(a.min()), "p25": q(a, 25), "p50": q(a, 50)},
        "run_packed_host_us": {"min": float(b.min()), "p25": q(b, 25), "p50": q(b, 50)},
        "overhead_min_us": float(a.min() - b.min()),
        "overhead_p25_us": q(a, 25) - q(b, 25),
        "overhead_p50_us": q(a, 50) - q(b, 50),
    }


def main(argv: list[str] | None = None) -> int:
    import zoi
    from zoi.bench.text import Tok
    from zoi.engine import default_model_path

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="HF folder (default: the bundled MiniLM)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--precision", default="int8", help="comma-separated")
    ap.add_argument("--shapes", default="1x16,1x128,32x128,mixed1000")
    ap.add_argument("--reps", type=int, default=20, help="calls per case per round")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--max-tokens", type=int, default=None)
    ap.add_argument("--st", action="store_true", help="also sentence-transformers (fp16 on cuda)")
    ap.add_argument("--out", default=None, help="JSON file")
    a = ap.parse_args(argv)
    model = a.model or os.environ.get("ZOI_MINILM_DIR") or str(default_model_path())
    tok = Tok(model)
    res = {
        "device": a.device,
        "model": str(model),
        "threads": os.environ.get("ZOI_NUM_THREADS") or os.cpu_count(),
        "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "cases": [],
    }
    st = None
    if a.st:
        from sentence_transformers import SentenceTransformer

        st = SentenceTransformer(model, device=a.device)
        if a.device == "cuda":
            st = st.half()
    for prec in a.precision.split(","):
        engine = zoi.compile(model, device=a.device, precision=prec, max_tokens=a.max_tokens)
        res["tokenizer"] = engine.tokenizer.kind
        for shape in a.shapes.split(","):
            texts = _shape_texts(tok, shape)
            m = measure(engine, texts, a.reps, a.rounds, st)
            m.update(precision=prec, shape=shape, max_tokens=engine.max_tokens)
            res["cases"].append(m)
            p = m["p50_us"]
            print(
                f"{prec} {shape:>10}: tokenizer {p['tokenizer']:9.1f} us | run_packed "
                f"{p['run_packed']:9.1f} | encode {p['encode']:9.1f} (x{m['encode_over_run_packed']:.3f}, "
                f"{100 * m['overhead_share']:.1f}% outside run_packed) | bs32 {p['encode_bs32']:9.1f}"
                + (
                    f" | ST {p['sentence_transformers']:9.1f}"
                    if "sentence_transformers" in p
                    else ""
                )
                + f" | foreign cores {m['foreign_cores']}",
                flush=True,
            )
            h = m["host"]
            print(
                f"{'':>16} host only (stub backend): encode {h['encode_host_us']['p25']:.1f} us, "
                f"run_packed {h['run_packed_host_us']['p25']:.1f} us (p25); encode adds "
                f"{h['overhead_min_us']:.1f} (min) / {h['overhead_p25_us']:.1f} (p25) / "
                f"{h['overhead_p50_us']:.1f} (p50) us = {100 * m['host_overhead_share_p25']:.2f}% "
                "of run_packed's p25",
                flush=True,
            )
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
