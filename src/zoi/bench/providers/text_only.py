"""Providers of the text workloads only: sentence-transformers (the baseline a user would
otherwise run: its own tokenisation, batching and pooling) and the tokenizers alone (zoi's
native WordPiece and HF `tokenizers`, one thread each, texts -> packed ids)."""

from __future__ import annotations

import numpy as np

from zoi.bench.providers.base import Provider, file_bytes, hf_tokenizer


class _TextOnly(Provider):
    def prepare(self, seqs, n_batches):
        raise NotImplementedError(f"{self.spec.name} runs the text workloads only")

    def embed(self, seqs, batch):
        raise NotImplementedError(f"{self.spec.name} runs the text workloads only")


class SentenceTransformerProvider(_TextOnly):
    def load(self):
        import torch
        from sentence_transformers import SentenceTransformer

        torch.set_num_threads(self.threads)
        self.torch = torch
        dev = self.spec.options.get("device", "cpu")
        m = SentenceTransformer(self.model_dir, device=dev)
        if self.spec.options.get("dtype") == "float16":
            m = m.half()
        self.m = m.eval()
        self.batch_size = int(self.spec.options.get("batch_size", 32))

    def call_texts(self, prepared):
        texts, _ = prepared
        with self.torch.inference_mode():
            return self.m.encode(
                texts,
                batch_size=self.batch_size,
                convert_to_numpy=True,
                normalize_embeddings=False,
                show_progress_bar=False,
            ).astype(np.float32, copy=False)

    def memory(self):
        return {
            "weights_bytes": file_bytes(
                *__import__("pathlib").Path(self.model_dir).glob("*.safetensors")
            )
        }


class TokenizerProvider(_TextOnly):
    """Texts -> packed ids (the output is the token count of each text, [B, 1])."""

    def load(self):
        from zoi.frontend.tokenizer import Tokenizer

        self.max_len = min(512, self.max_tokens)
        if self.spec.options["impl"] == "zoi":
            from pathlib import Path

            t = Tokenizer.from_file(Path(self.model_dir) / "tokenizer.json", self.max_len)
            if t.native is None:
                raise RuntimeError(f"the native tokenizer does not run this model: {t.kind}")
            self.nat = t.native
        else:
            self.tk = hf_tokenizer(self.model_dir, self.max_len, pad=False)

    def call_texts(self, prepared):
        texts, _ = prepared
        if self.spec.options["impl"] == "zoi":
            _, _, cu, _ = self.nat.encode_packed(texts, True, 0, 1)  # one thread
            return np.diff(cu).astype(np.float32)[:, None]
        encs = self.tk.encode_batch(texts)  # TOKENIZERS_PARALLELISM=false in the worker
        lens = np.fromiter((len(e.ids) for e in encs), dtype=np.float32, count=len(encs))
        return lens[:, None]

    def memory(self):
        return {"weights_bytes": 0}
