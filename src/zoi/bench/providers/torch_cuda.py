"""PyTorch on a CUDA GPU: eager FP32 / FP16, FP16 captured in a CUDA graph (one graph per
padded batch shape), and ``torch.compile(mode="reduce-overhead")`` FP16.

The timed call starts from token ids in (pageable) host memory and ends with the pooled FP32
result in host memory; ``.cpu()`` synchronises the device before the clock is read."""

from __future__ import annotations

from zoi.bench.head import FULL_HEAD_TYPES, bidirectional_masks, head_module, model_type
from zoi.bench.providers.base import PaddedProvider


class TorchCudaProvider(PaddedProvider):
    def load(self):
        import torch
        from transformers import AutoModel

        if not torch.cuda.is_available():
            raise RuntimeError("torch.cuda is not available")
        torch.set_num_threads(self.threads)
        self.torch = torch
        dtype = getattr(torch, self.spec.options.get("dtype", "float32"))
        self.m = AutoModel.from_pretrained(self.model_dir, dtype=dtype).eval().cuda()
        # the benchmark's head in the model's dtype (FP16: a token count clamped at 1, not 1e-9)
        self.head = head_module(self.model_dir, clamp=1.0).to(dtype).cuda()
        self.kw = {"use_cache": False} if model_type(self.model_dir) in FULL_HEAD_TYPES else {}
        # bidirectional Gemma3's masks, made on the device (transformers' own copy a CPU tensor
        # in, which a CUDA graph cannot capture)
        graph = self.spec.options.get("graph")
        self.masks = bidirectional_masks(self.m.config, additive=False) if graph else None
        self.graphs = {}
        self.fn = self._forward
        if self.spec.options.get("compile"):
            self.fn = torch.compile(self._forward, mode="reduce-overhead", dynamic=False)

    def _forward(self, ids, mask):
        am = self.masks(mask) if self.masks else mask
        h = self.m(input_ids=ids, attention_mask=am, **self.kw).last_hidden_state
        return self.head(h, mask).float()

    def feed(self, ids, mask):
        torch = self.torch
        if not self.spec.options.get("graph"):
            return torch.from_numpy(ids), torch.from_numpy(mask)
        key = ids.shape
        if key not in self.graphs:
            s_ids = torch.from_numpy(ids).cuda()
            s_mask = torch.from_numpy(mask).cuda()
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.no_grad(), torch.cuda.stream(side):
                for _ in range(3):
                    self._forward(s_ids, s_mask)
            torch.cuda.current_stream().wait_stream(side)
            g = torch.cuda.CUDAGraph()
            with torch.no_grad(), torch.cuda.graph(g):
                out = self._forward(s_ids, s_mask)
            # pinned host staging, as a careful user of CUDA graphs would do
            self.graphs[key] = (
                g,
                s_ids,
                s_mask,
                out,
                s_ids.cpu().pin_memory(),
                s_mask.cpu().pin_memory(),
            )
        return torch.from_numpy(ids), torch.from_numpy(mask), self.graphs[key]

    def run(self, feed):
        torch = self.torch
        with torch.no_grad():
            if len(feed) == 3:
                ids, mask, (g, s_ids, s_mask, out, h_ids, h_mask) = feed
                h_ids.copy_(ids)
                h_mask.copy_(mask)
                s_ids.copy_(h_ids, non_blocking=True)
                s_mask.copy_(h_mask, non_blocking=True)
                g.replay()
                return out.cpu().numpy()
            ids, mask = feed
            return self.fn(ids.cuda(), mask.cuda()).cpu().numpy()

    def memory(self):
        torch = self.torch
        w = 0
        for mod in (self.m, self.head):
            w += sum(p.numel() * p.element_size() for p in mod.parameters())
            w += sum(b.numel() * b.element_size() for b in mod.buffers())
        return {
            "weights_bytes": int(w),
            "gpu_reserved_bytes": int(torch.cuda.max_memory_reserved()),
        }
