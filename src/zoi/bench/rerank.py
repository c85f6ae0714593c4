"""`zoi bench --workloads rerank-1x32`: rerank 1 query x 32 documents with a minilm-sized
cross-encoder (zoi.bench.models "minilm-ce", random init), CPU, texts in -> scores out.

Providers (in one process, rounds interleaved so machine load hits each alike):
- zoi CPU FP32 / INT8: `engine.rerank(query, docs)` (pair tokenisation included);
- ONNX Runtime FP32 / INT8: the BertForSequenceClassification graph exported with
  torch.onnx, ORT's transformer optimiser (model_type bert), `quantize_dynamic` per-channel
  INT8 (as bench/providers/onnxrt.py does for the embedding models); HF tokenizers pairs,
  padded to the longest, then sorting;
- CTranslate2 INT8 / FP32: its BERT encoder (pooler included) + the one-row classifier in
  numpy (CTranslate2 has no classification head; the classifier is 385 multiply-adds).

Figures: median and p90 latency per call over the rounds, and the agreement of each
provider's scores with zoi FP32 (Spearman). `--threads` threads for everyone.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from pathlib import Path

import numpy as np

WORKLOAD = "rerank-1x32"


def _texts(n: int = 33, seed: int = 0) -> tuple[str, list[str]]:
    from zoi.bench.text import corpus_lines

    lines = [x for x in corpus_lines() if 40 <= len(x) <= 400]
    rng = np.random.default_rng(seed)
    idx = rng.choice(len(lines), size=n, replace=False)
    return lines[idx[0]][:120], [lines[i] for i in idx[1:]]


def _hf_pairs(model_dir: Path, max_len: int):
    from tokenizers import Tokenizer

    tk = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tk.enable_truncation(max_len)
    tk.enable_padding()
    return tk


def _onnx(model_dir: Path, cache: Path, int8: bool) -> Path:
    import torch
    from transformers import AutoModelForSequenceClassification

    d = cache / "minilm-ce" / f"onnx-torch{torch.__version__.split('+')[0]}"
    raw, opt, q = d / "model.onnx", d / "model_opt.onnx", d / "model_int8.onnx"
    if not raw.exists():
        d.mkdir(parents=True, exist_ok=True)
        m = AutoModelForSequenceClassification.from_pretrained(
            str(model_dir), attn_implementation="eager"
        ).eval()

        class Logits(torch.nn.Module):
            def __init__(self, m):
                super().__init__()
                self.m = m

            def forward(self, input_ids, attention_mask, token_type_ids):
                return self.m(
                    input_ids=input_ids,
                    attention_mask=attention_mask,
                    token_type_ids=token_type_ids,
                ).logits

        ids = torch.ones(2, 16, dtype=torch.long) * 2000
        axes = {
            k: {0: "batch", 1: "seq"} for k in ("input_ids", "attention_mask", "token_type_ids")
        }
        axes["logits"] = {0: "batch"}
        with torch.no_grad():
            torch.onnx.export(
                Logits(m), (ids, torch.ones_like(ids), torch.zeros_like(ids)), str(raw) + ".partial",
                input_names=["input_ids", "attention_mask", "token_type_ids"], output_names=["logits"],
                dynamic_axes=axes, opset_version=17, dynamo=False,
            )  # fmt: skip
        os.replace(str(raw) + ".partial", raw)
    if not opt.exists():
        from onnxruntime.transformers import optimizer

        o = optimizer.optimize_model(str(raw), model_type="bert", num_heads=12, hidden_size=384)
        o.save_model_to_file(str(opt) + ".partial.onnx")
        os.replace(str(opt) + ".partial.onnx", opt)
    if int8 and not q.exists():
        import onnx
        from onnxruntime.quantization import QuantType, quantize_dynamic

        quantize_dynamic(str(opt), str(q) + ".partial.onnx", per_channel=True, weight_type=QuantType.QInt8,
                         extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})  # fmt: skip
        os.replace(str(q) + ".partial.onnx", q)
    return q if int8 else opt


class _Ort:
    def __init__(self, model_dir, cache, int8, threads):
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        self.sess = ort.InferenceSession(
            str(_onnx(model_dir, cache, int8)), so, providers=["CPUExecutionProvider"]
        )
        self.tk = _hf_pairs(model_dir, 512)

    def __call__(self, query, docs):
        encs = self.tk.encode_batch([(query, d) for d in docs])
        f = {
            "input_ids": np.asarray([e.ids for e in encs], np.int64),
            "attention_mask": np.asarray([e.attention_mask for e in encs], np.int64),
            "token_type_ids": np.asarray([e.type_ids for e in encs], np.int64),
        }
        s = self.sess.run(None, f)[0][:, 0]
        return s, np.argsort(-s, kind="stable")


class _Ct2:
    def __init__(self, model_dir, cache, int8, threads):
        import ctranslate2
        from ctranslate2.converters import TransformersConverter
        from safetensors.numpy import load_file

        d = cache / "minilm-ce" / f"ct2-{ctranslate2.__version__}"
        if not (d / "model.bin").exists():
            TransformersConverter(str(model_dir)).convert(str(d), force=True)
        comp = "int8" if int8 else "float32"
        self.enc = ctranslate2.Encoder(
            str(d), device="cpu", compute_type=comp, intra_threads=threads
        )
        w = load_file(str(model_dir / "model.safetensors"))
        self.w, self.b = (
            w["classifier.weight"].astype(np.float32),
            w["classifier.bias"].astype(np.float32),
        )
        self.tk = _hf_pairs(model_dir, 512)
        self.tk.no_padding()

    def __call__(self, query, docs):
        encs = self.tk.encode_batch([(query, d) for d in docs])
        out = self.enc.forward_batch(
            [e.ids for e in encs], token_type_ids=[e.type_ids for e in encs]
        )
        pooled = np.asarray(out.pooler_output)
        s = (pooled @ self.w.T + self.b)[:, 0]
        return s, np.argsort(-s, kind="stable")


class _Zoi:
    def __init__(self, model_dir, cache, int8, threads):
        import zoi

        os.environ.setdefault("ZOI_NUM_THREADS", str(threads))
        self.eng = zoi.compile(str(model_dir), device="cpu", precision="int8" if int8 else "fp32")

    def __call__(self, query, docs):
        r = self.eng.rerank(query, docs, activation_fn="identity")
        s = np.empty(len(docs), np.float32)
        for x in r:
            s[x["corpus_id"]] = x["score"]
        return s, np.array([x["corpus_id"] for x in r])


PROVIDERS = {
    "zoi-cpu-fp32": (_Zoi, False),
    "zoi-cpu-int8": (_Zoi, True),
    "onnxruntime-fp32": (_Ort, False),
    "onnxruntime-int8": (_Ort, True),
    "ctranslate2-int8": (_Ct2, True),
    "ctranslate2-fp32": (_Ct2, False),
}


def _spearman(a, b) -> float:
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1])


def run(cache_dir: Path, out: Path | None, threads: int = 2, rounds: int = 10, calls: int = 20,
        providers: list[str] | None = None) -> dict:  # fmt: skip
    from zoi.bench.models import get_model

    model = get_model("minilm-ce", cache_dir)
    query, docs = _texts()
    names = providers or list(PROVIDERS)
    loaded, errors = {}, {}
    for n in names:
        cls, int8 = PROVIDERS[n]
        try:
            loaded[n] = cls(model.path, Path(cache_dir), int8, threads)
        except Exception as e:  # a peer that cannot run here is reported, not fatal
            errors[n] = f"{type(e).__name__}: {e}"
    ref = loaded["zoi-cpu-fp32"](query, docs)[0] if "zoi-cpu-fp32" in loaded else None
    for f in loaded.values():  # warm up
        for _ in range(3):
            f(query, docs)
    lat: dict[str, list[float]] = {n: [] for n in loaded}
    load0 = os.getloadavg()
    for _ in range(rounds):
        for n, f in loaded.items():
            for _ in range(calls):
                t0 = time.perf_counter()
                f(query, docs)
                lat[n].append(time.perf_counter() - t0)
    res = {}
    for n, f in loaded.items():
        s, _ = f(query, docs)
        xs = sorted(lat[n])
        res[n] = {
            "median_ms": round(1e3 * statistics.median(xs), 3),
            "p90_ms": round(1e3 * xs[int(0.9 * (len(xs) - 1))], 3),
            "calls": len(xs),
            "spearman_vs_zoi_fp32": None if ref is None else round(_spearman(s, ref), 5),
        }
    peers = [res[n]["median_ms"] for n in res if not n.startswith("zoi")]
    rep = {
        "workload": WORKLOAD,
        "model": "minilm-ce (BertForSequenceClassification L6 H384 heads12 I1536, random init seed 0)",
        "what": "1 query x 32 documents, texts in -> 32 scores out and the order, CPU",
        "query_chars": len(query),
        "doc_chars_mean": float(np.mean([len(d) for d in docs])),
        "threads": threads,
        "rounds": rounds,
        "calls_per_round": calls,
        "results": res,
        "errors": errors,
        "ratio_zoi_int8_vs_best_peer": (
            round(res["zoi-cpu-int8"]["median_ms"] / min(peers), 3)
            if peers and "zoi-cpu-int8" in res
            else None
        ),
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "loadavg_start": load0,
            "loadavg_end": os.getloadavg(),
        },
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(rep, indent=1))
    return rep


def main_rerank(args) -> int:
    from rich.console import Console
    from rich.table import Table

    from zoi.bench.models import default_cache_dir

    cache = Path(args.cache_dir) if args.cache_dir else default_cache_dir()
    out = args.out
    if out is None:
        d = Path(args.out_dir) if args.out_dir else Path("bench/results")
        out = d / f"{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}_{WORKLOAD}.json"
    q = getattr(args, "quick", False)
    names = (
        [p for p in args.providers if p in PROVIDERS] if getattr(args, "providers", None) else None
    )
    rep = run(
        cache,
        out,
        args.threads,
        args.rounds or (2 if q else 10),
        args.calls or (5 if q else 20),
        names or None,
    )
    t = Table(title=f"{WORKLOAD}: {rep['what']} ({rep['threads']} threads)")
    for c in ("provider", "median ms", "p90 ms", "Spearman vs zoi FP32"):
        t.add_column(c)
    for n, r in rep["results"].items():
        t.add_row(n, f"{r['median_ms']:.2f}", f"{r['p90_ms']:.2f}", str(r["spearman_vs_zoi_fp32"]))
    Console().print(t)
    for n, e in rep["errors"].items():
        Console().print(f"[yellow]{n}[/]: {e}")
    Console().print(f"zoi INT8 / best peer: {rep['ratio_zoi_int8_vs_best_peer']}; JSON: {out}")
    return 0
