"""OpenVINO CPU plugin: FP32 IR (converted from the ONNX export) and NNCF PTQ INT8.

``INFERENCE_PRECISION_HINT=f32`` pins the non-quantised ops to FP32 (OpenVINO would otherwise
pick bf16 on CPUs that have it, which is a different precision)."""

from __future__ import annotations

import numpy as np

from zoi.bench import convert
from zoi.bench.providers.base import PaddedProvider, file_bytes


class OvProvider(PaddedProvider):
    @classmethod
    def convert(cls, spec, model, cache):
        f = (
            convert.openvino_int8(model, cache)
            if spec.precision == "int8"
            else convert.openvino_fp32(model, cache)
        )
        return {"xml": str(f)}

    def load(self):
        import openvino as ov

        core = ov.Core()
        self.compiled = core.compile_model(
            self.artifacts["xml"],
            "CPU",
            {
                "INFERENCE_NUM_THREADS": self.threads,
                "NUM_STREAMS": 1,
                "PERFORMANCE_HINT": "LATENCY",
                "INFERENCE_PRECISION_HINT": "f32",
            },
        )
        self.req = self.compiled.create_infer_request()
        self.names = {n for i in self.compiled.inputs for n in i.get_names()}

    def feed(self, ids, mask):
        f = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
        return {k: v for k, v in f.items() if k in self.names}

    def run(self, feed):
        res = self.req.infer(feed)
        return np.array(res[self.compiled.output(0)], copy=True)

    def memory(self):
        xml = self.artifacts["xml"]
        return {"weights_bytes": file_bytes(xml[:-4] + ".bin"), "isa": self.isa()}

    def isa(self) -> str:
        """The kernels OpenVINO ran (the runtime model's primitive types, known once a call
        has run: e.g. FullyConnected ``brgemm_avx512_amx_I8`` natively on a Xeon with AMX,
        ``jit_gemm_I8`` under ONEDNN_MAX_CPU_ISA=AVX2): evidence of --peer-isa."""
        kinds = set()
        try:
            for n in self.compiled.get_runtime_model().get_ordered_ops():
                rt = n.get_rt_info()
                if "primitiveType" in rt and "layerType" in rt:
                    lt = str(rt["layerType"].astype(str))
                    if lt in ("FullyConnected", "MatMul", "MVN", "Softmax", "Subgraph"):
                        kinds.add(f"{lt}:{rt['primitiveType'].astype(str)}")
        except Exception as e:  # an OpenVINO without the runtime model's rt_info
            return f"unknown ({type(e).__name__})"
        return ",".join(sorted(kinds)) or "unknown"
