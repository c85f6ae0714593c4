"""zoi itself: ``zoi.compile(...)`` then the low-level packed call, no padding anywhere."""

from __future__ import annotations

import inspect

import numpy as np

from zoi.bench.providers.base import Provider
from zoi.bench.text import pack


class ZoiProvider(Provider):
    def load(self):
        import zoi

        kw = {"device": self.spec.options["device"], "precision": self.spec.options["precision"]}
        params = inspect.signature(zoi.compile).parameters
        if "max_tokens" in params:
            kw["max_tokens"] = self.max_tokens
        if "max_batch" in params:
            kw["max_batch"] = self.max_batch
        if "threads" in params:
            kw["threads"] = self.threads
        self.engine = zoi.compile(self.model_dir, **kw)

    def prepare(self, seqs, n_batches):
        p = pack(seqs)  # zoi runs every workload as one packed batch
        return p.ids, p.positions, p.cu_seqlens

    def call(self, prepared):
        ids, pos, cu = prepared
        return self.engine.run_packed(ids, pos, cu, normalize=False)

    def embed(self, seqs, batch):
        out = []
        i = 0
        while i < len(seqs):
            j, tokens = i, 0
            while j < len(seqs) and j - i < min(batch, self.max_batch) and tokens + len(seqs[j]) <= self.max_tokens:
                tokens += len(seqs[j])
                j += 1
            if j == i:
                raise ValueError(f"sequence of {len(seqs[i])} tokens > max_tokens {self.max_tokens}")
            out.append(np.asarray(self.call(self.prepare(seqs[i:j], 1)), dtype=np.float32))
            i = j
        return np.concatenate(out)

    def memory(self):
        m = dict(self.engine.memory())
        return {k: int(v) for k, v in m.items() if isinstance(v, (int, np.integer))}
