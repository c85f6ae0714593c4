"""PyTorch eager (transformers ``AutoModel``, default SDPA attention) FP32 and dynamic INT8."""

from __future__ import annotations

import io

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

    def run(self, feed):
        torch = self.torch
        ids, mask = feed
        with torch.inference_mode():
            t_ids = torch.from_numpy(ids)
            t_mask = torch.from_numpy(mask)
            h = self.m(input_ids=t_ids, attention_mask=t_mask).last_hidden_state
            mk = t_mask.unsqueeze(-1).to(h.dtype)
            return ((h * mk).sum(1) / mk.sum(1).clamp(min=1e-9)).numpy()

    def memory(self):
        buf = io.BytesIO()
        self.torch.save(self.m.state_dict(), buf)
        return {"weights_bytes": buf.getbuffer().nbytes, "isa": self.isa()}

    def isa(self) -> str:
        """ATen's CPU capability and MKL's instruction cap (from MKL_ENABLE_INSTRUCTIONS)."""
        import os

        cap = self.torch.backends.cpu.get_cpu_capability()
        mkl = os.environ.get("MKL_ENABLE_INSTRUCTIONS")
        return f"aten {cap}" + (f", mkl <= {mkl}" if mkl else "")
