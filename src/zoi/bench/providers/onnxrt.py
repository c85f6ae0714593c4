"""ONNX Runtime, CPU execution provider: the transformer-optimised (fused) graph in FP32, and
its ``quantize_dynamic`` per-channel INT8 version. The graph includes mean pooling."""

from __future__ import annotations

import numpy as np

from zoi.bench import convert
from zoi.bench.providers.base import PaddedProvider, file_bytes


class OrtProvider(PaddedProvider):
    @classmethod
    def convert(cls, spec, model, cache):
        f = (
            convert.onnx_int8(model, cache)
            if spec.precision == "int8"
            else convert.onnx_fp32(model, cache)
        )
        return {"onnx": str(f)}

    def load(self):
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads = self.threads
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self.sess = ort.InferenceSession(
            self.artifacts["onnx"], so, providers=["CPUExecutionProvider"]
        )
        self.names = {i.name for i in self.sess.get_inputs()}

    def feed(self, ids, mask):
        f = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
        return {k: v for k, v in f.items() if k in self.names}

    def run(self, feed):
        return self.sess.run(None, feed)[0]

    def memory(self):
        # MLAS picks its kernels by cpuid (AVX-512 / VNNI where present); no switch caps it
        f = self.artifacts["onnx"]
        weights = file_bytes(f, *([convert.external_data(f)] if convert.external_data(f) else []))
        out = {"weights_bytes": weights, "isa": "native (MLAS, cpuid)"}
        fs = convert.fusion_stats(self.artifacts["onnx"])
        if fs is not None:  # MPNet / ModernBERT: attention left unfused (convert.onnx_fp32)
            out["ort_fusions"] = fs
        return out
