"""zoi itself, timed through the low-level packed call (one packed batch, no padding).

Like the peers' conversions, compiling happens once, outside the timed process: the parent
compiles the model (INT8 includes calibration) and saves the artifact into the cache, keyed
by a hash of zoi's own source, so a code change never reuses a stale artifact; the worker
loads it with ``zoi.load`` on its device. An artifact is device-independent, so the CUDA
INT8 / FP8 providers load the same one (calibrating in every GPU worker made a three-round
``zoi bench --device cuda`` overrun a 300 s device call); FP16, which compiles for the GPU
only and has nothing to calibrate, is compiled in the worker.
"""

from __future__ import annotations

import hashlib
import inspect
from pathlib import Path

import numpy as np

from zoi.bench.head import read_head
from zoi.bench.providers.base import Provider
from zoi.bench.text import pack

ARTIFACT_MAX_BATCH = 256  # the largest batch of any workload


def source_hash() -> str:
    """Hash of zoi's Python sources (the benchmark excluded) and its native core."""
    import zoi

    root = Path(zoi.__file__).resolve().parent
    h = hashlib.sha256()
    files = sorted(p for p in root.rglob("*.py") if "bench" not in p.relative_to(root).parts)
    try:
        import zoi._cpu as native

        files.append(Path(native.__file__))
    except Exception:
        pass
    for p in files:
        h.update(str(p.relative_to(root) if p.is_relative_to(root) else p.name).encode())
        h.update(p.read_bytes())
    return h.hexdigest()[:12]


class ZoiProvider(Provider):
    @classmethod
    def convert(cls, spec, model, cache):
        if spec.options["device"] == "cuda" and spec.precision == "fp16":
            return {}  # GPU-only precision: compiled in the worker (no calibration)
        import zoi

        wbits = spec.options.get("weight_bits")  # zoi.compile's weight_bits ("auto": per linear)
        dst = Path(cache) / model.name / f"zoi-{zoi.__version__}-{source_hash()}" / spec.precision
        if wbits:
            dst = dst.with_name(f"{spec.precision}-w{wbits}")
        if not (dst / "zoi.json").exists():
            engine = zoi.compile(
                str(model.path),
                device="reference",
                precision=spec.precision,
                max_tokens=model.max_len,
                # a batch takes a token per sequence at least: zoi refuses more sequences
                # than max_tokens (a model whose max_len is under 256, as in the tests)
                max_batch=min(ARTIFACT_MAX_BATCH, model.max_len),
                **({"weight_bits": wbits} if wbits else {}),
            )
            engine.save(dst)
        return {"artifact": str(dst)}

    def load(self):
        import zoi

        # the decoder embedders' head normalises (zoi.bench.head), as the peers' does
        self.normalize = read_head(self.model_dir).normalize
        dev = self.spec.options["device"]
        if self.artifacts.get("artifact"):
            self.engine = zoi.load(
                self.artifacts["artifact"], device=dev, max_tokens=self.max_tokens
            )
            return
        kw = {"device": dev, "precision": self.spec.options["precision"]}
        params = inspect.signature(zoi.compile).parameters
        if "max_tokens" in params:
            kw["max_tokens"] = self.max_tokens
        if "max_batch" in params:
            kw["max_batch"] = self.max_batch
        self.engine = zoi.compile(self.model_dir, **kw)

    def prepare(self, seqs, n_batches):
        p = pack(seqs)  # zoi runs every workload as one packed batch
        return p.ids, p.positions, p.cu_seqlens

    def call(self, prepared):
        ids, pos, cu = prepared
        return self.engine.run_packed(ids, pos, cu, normalize=self.normalize)

    def call_texts(self, prepared):
        texts, _ = prepared  # one call: zoi chunks by token budget itself
        return self.engine.encode(texts, normalize_embeddings=False)

    def embed(self, seqs, batch):
        out = []
        i = 0
        cap = min(batch, getattr(self.engine, "max_batch", batch) or batch)
        while i < len(seqs):
            j, tokens = i, 0
            while j < len(seqs) and j - i < cap and tokens + len(seqs[j]) <= self.max_tokens:
                tokens += len(seqs[j])
                j += 1
            if j == i:
                raise ValueError(
                    f"sequence of {len(seqs[i])} tokens > max_tokens {self.max_tokens}"
                )
            out.append(np.asarray(self.call(self.prepare(seqs[i:j], 1)), dtype=np.float32))
            i = j
        return np.concatenate(out)

    def memory(self):
        m = dict(self.engine.memory())
        m = {
            k: (int(v) if isinstance(v, (int, np.integer)) else v)
            for k, v in m.items()
            if isinstance(v, (int, np.integer, str, float))
        }
        if "torch_reserved_bytes" in m:
            # GPU: the device buffers zoi owns (weights + arena), taken through torch's allocator
            # at compile time: the same measure as the torch peers' max_memory_reserved. The
            # cuMemGetInfo delta (device_bytes_used) is kept too, but in the harness other
            # workers share the GPU, so it is not this engine's alone.
            m["gpu_reserved_bytes"] = int(m["torch_reserved_bytes"])
        m["max_tokens"] = int(self.engine.max_tokens)
        m["max_batch"] = int(self.engine.max_batch)
        return m
