"""PyTorch eager (transformers ``AutoModel``, default SDPA attention) FP32 and dynamic INT8,
then the benchmark's head (zoi.bench.head: mean pooling, or the decoder embedders' pooling,
Dense and Normalize) in FP32."""

from __future__ import annotations

import io

from zoi.bench.head import FULL_HEAD_TYPES, head_module, model_type
from zoi.bench.providers.base import PaddedProvider


class TorchProvider(PaddedProvider):
    def load(self):
        import torch
        from transformers import AutoModel

        torch.set_num_threads(self.threads)
        self.torch = torch
        m = AutoModel.from_pretrained(self.model_dir).eval()
        if self.spec.options.get("quantize"):
            from torch.ao.quantization import quantize_dynamic

            m = quantize_dynamic(m, {torch.nn.Linear}, dtype=torch.qint8)
        self.m = m
        self.head = head_module(self.model_dir)
        # decoders: one forward pass, no KV cache kept
        self.kw = {"use_cache": False} if model_type(self.model_dir) in FULL_HEAD_TYPES else {}

    def run(self, feed):
        torch = self.torch
        ids, mask = feed
        with torch.inference_mode():
            t_ids = torch.from_numpy(ids)
            t_mask = torch.from_numpy(mask)
            h = self.m(input_ids=t_ids, attention_mask=t_mask, **self.kw).last_hidden_state
            return self.head(h, t_mask).numpy()

    def memory(self):
        buf = io.BytesIO()
        self.torch.save({**self.m.state_dict(), **self.head.state_dict()}, buf)
        return {"weights_bytes": buf.getbuffer().nbytes, "isa": self.isa()}

    def isa(self) -> str:
        """ATen's CPU capability and MKL's instruction cap (from MKL_ENABLE_INSTRUCTIONS)."""
        import os

        cap = self.torch.backends.cpu.get_cpu_capability()
        mkl = os.environ.get("MKL_ENABLE_INSTRUCTIONS")
        return f"aten {cap}" + (f", mkl <= {mkl}" if mkl else "")
