"""CTranslate2 ``Encoder``: FP32 model, and the model converted with INT8 weights run with
``compute_type="int8"``. CTranslate2 returns the last hidden state; mean pooling is done in
numpy inside the timed call (the caller needs the pooled vector)."""

from __future__ import annotations

import numpy as np

from zoi.bench import convert
from zoi.bench.head import FULL_HEAD_TYPES, model_type
from zoi.bench.providers.base import PaddedProvider, file_bytes, masked_mean


class Ct2Provider(PaddedProvider):
    @classmethod
    def convert(cls, spec, model, cache):
        if model_type(model.path) in FULL_HEAD_TYPES:
            # its converter takes Gemma3 / Qwen3, but as decoder-only language models, which
            # ctranslate2.Generator runs to logits; the Encoder (hidden states) cannot load them
            raise RuntimeError(
                f"CTranslate2 has no encoder for {model_type(model.path)}: it converts the "
                "architecture as a language model (Generator, logits out), not the hidden "
                "states a sentence embedding pools"
            )
        q = "int8" if spec.precision == "int8" else "float32"
        return {"dir": str(convert.ctranslate2_model(model, cache, q)), "compute_type": q}

    def load(self):
        import ctranslate2

        self.ct2 = ctranslate2
        self.enc = ctranslate2.Encoder(
            self.artifacts["dir"],
            device="cpu",
            compute_type=self.artifacts["compute_type"],
            intra_threads=self.threads,
            inter_threads=1,
        )

    def feed(self, ids, mask):
        return ids.astype(np.int32), mask.sum(1).astype(np.int32), mask

    def run(self, feed):
        ids, lengths, mask = feed
        sv = self.ct2.StorageView.from_array
        out = self.enc.forward_batch(sv(ids), sv(lengths))
        h = np.asarray(out.last_hidden_state)
        return masked_mean(h, mask).astype(np.float32)

    def memory(self):
        import os

        # CTranslate2's own kernels follow CT2_FORCE_CPU_ISA (CT2_VERBOSE=1 logs "Selected
        # ISA"); its GEMMs are MKL's on Intel CPUs (MKL_VERBOSE=1 logs MKL's ISA)
        isa = os.environ.get("CT2_FORCE_CPU_ISA", "auto")
        mkl = os.environ.get("MKL_ENABLE_INSTRUCTIONS", "native")
        return {
            "weights_bytes": file_bytes(self.artifacts["dir"] + "/model.bin"),
            "isa": f"ct2 {isa}, mkl <= {mkl}",
        }
