"""Providers: one way of running a model (library x device x precision).

The registry below is import-free (it names modules, it does not import them), so the parent
process can list and check providers without loading any peer library; a worker process
imports only the one it runs, so its peak RSS is that provider's own.
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Spec:
    name: str  # stable id used in the JSON, e.g. "onnxruntime-int8"
    label: str  # human name for tables and plots
    device: str  # "cpu" | "cuda"
    precision: str  # "fp32" | "int8" | "fp16"
    module: str  # zoi.bench.providers.<module>
    cls: str
    requires: tuple[str, ...]  # importable modules this provider needs
    options: dict = field(default_factory=dict)
    baseline: bool = False  # the provider speed-ups are computed against (per device)
    default: bool = True  # run unless --providers names others (False: only when named exactly)
    texts_only: bool = False  # runs the text workloads only (no token-id path)
    text_baseline: bool = False  # the baseline of the text workloads (per device)

    @property
    def family(self) -> str:
        return self.name.split("-")[0]


_P = "zoi.bench.providers."

SPECS: list[Spec] = [
    Spec(
        "zoi-cpu-fp32",
        "zoi CPU FP32",
        "cpu",
        "fp32",
        _P + "zoi_engine",
        "ZoiProvider",
        ("zoi",),
        {"device": "cpu", "precision": "fp32"},
    ),
    Spec(
        "zoi-cpu-int8",
        "zoi CPU INT8",
        "cpu",
        "int8",
        _P + "zoi_engine",
        "ZoiProvider",
        ("zoi",),
        {"device": "cpu", "precision": "int8"},
    ),
    Spec(
        "torch-fp32",
        "PyTorch eager FP32",
        "cpu",
        "fp32",
        _P + "torch_cpu",
        "TorchProvider",
        ("torch", "transformers"),
        {},
        baseline=True,
    ),
    Spec(
        "torch-int8",
        "PyTorch dynamic INT8",
        "cpu",
        "int8",
        _P + "torch_cpu",
        "TorchProvider",
        ("torch", "transformers"),
        {"quantize": True},
    ),
    Spec(
        "onnxruntime-fp32",
        "ONNX Runtime FP32 (fused)",
        "cpu",
        "fp32",
        _P + "onnxrt",
        "OrtProvider",
        ("onnxruntime", "onnx", "torch", "transformers"),
    ),
    Spec(
        "onnxruntime-int8",
        "ONNX Runtime INT8 (dynamic, per-channel)",
        "cpu",
        "int8",
        _P + "onnxrt",
        "OrtProvider",
        ("onnxruntime", "onnx", "torch", "transformers"),
    ),
    Spec(
        "openvino-fp32",
        "OpenVINO FP32",
        "cpu",
        "fp32",
        _P + "openvino_p",
        "OvProvider",
        ("openvino", "onnx", "torch", "transformers"),
    ),
    Spec(
        "openvino-int8",
        "OpenVINO INT8 (NNCF PTQ)",
        "cpu",
        "int8",
        _P + "openvino_p",
        "OvProvider",
        ("openvino", "nncf", "onnx", "torch", "transformers"),
    ),
    Spec(
        "ctranslate2-fp32",
        "CTranslate2 FP32",
        "cpu",
        "fp32",
        _P + "ct2",
        "Ct2Provider",
        ("ctranslate2", "torch", "transformers"),
    ),
    Spec(
        "ctranslate2-int8",
        "CTranslate2 INT8",
        "cpu",
        "int8",
        _P + "ct2",
        "Ct2Provider",
        ("ctranslate2", "torch", "transformers"),
    ),
    # zoi's numpy reference backend: a correctness check of the harness, far too slow to rank
    Spec(
        "zoi-reference-fp32",
        "zoi reference (numpy) FP32",
        "cpu",
        "fp32",
        _P + "zoi_engine",
        "ZoiProvider",
        ("zoi",),
        {"device": "reference", "precision": "fp32"},
        default=False,
    ),
    # text workloads only: the end-to-end baseline and the tokenizers alone
    Spec(
        "st-fp32",
        "sentence-transformers FP32",
        "cpu",
        "fp32",
        _P + "text_only",
        "SentenceTransformerProvider",
        ("torch", "sentence_transformers"),
        {"device": "cpu"},
        texts_only=True,
        text_baseline=True,
    ),
    Spec(
        "tokenizer-zoi",
        "tokenizer only: zoi native WordPiece (1 thread)",
        "cpu",
        "fp32",
        _P + "text_only",
        "TokenizerProvider",
        ("zoi",),
        {"impl": "zoi"},
        texts_only=True,
    ),
    Spec(
        "tokenizer-hf",
        "tokenizer only: HF tokenizers (1 thread)",
        "cpu",
        "fp32",
        _P + "text_only",
        "TokenizerProvider",
        ("tokenizers",),
        {"impl": "hf"},
        texts_only=True,
    ),
    Spec(
        "st-cuda-fp16",
        "sentence-transformers FP16 (CUDA)",
        "cuda",
        "fp16",
        _P + "text_only",
        "SentenceTransformerProvider",
        ("torch", "sentence_transformers"),
        {"device": "cuda", "dtype": "float16"},
        texts_only=True,
        text_baseline=True,
    ),
    # GPU (run when torch.cuda is available)
    Spec(
        "zoi-cuda-fp16",
        "zoi CUDA FP16",
        "cuda",
        "fp16",
        _P + "zoi_engine",
        "ZoiProvider",
        ("zoi",),
        {"device": "cuda", "precision": "fp16"},
    ),
    Spec(
        "zoi-cuda-int8",
        "zoi CUDA INT8",
        "cuda",
        "int8",
        _P + "zoi_engine",
        "ZoiProvider",
        ("zoi",),
        {"device": "cuda", "precision": "int8"},
    ),
    Spec(  # issue 21: an FP8 GPU (sm_89+) only, so not run unless named
        "zoi-cuda-fp8",
        "zoi CUDA FP8 (E4M3)",
        "cuda",
        "fp8",
        _P + "zoi_engine",
        "ZoiProvider",
        ("zoi",),
        {"device": "cuda", "precision": "fp8"},
        default=False,
    ),
    Spec(
        "torch-cuda-fp32",
        "PyTorch eager FP32 (CUDA)",
        "cuda",
        "fp32",
        _P + "torch_cuda",
        "TorchCudaProvider",
        ("torch", "transformers"),
        {"dtype": "float32"},
        baseline=True,
    ),
    Spec(
        "torch-cuda-fp16",
        "PyTorch eager FP16 (CUDA)",
        "cuda",
        "fp16",
        _P + "torch_cuda",
        "TorchCudaProvider",
        ("torch", "transformers"),
        {"dtype": "float16"},
    ),
    Spec(
        "torch-cuda-fp16-graph",
        "PyTorch FP16 + CUDA graph",
        "cuda",
        "fp16",
        _P + "torch_cuda",
        "TorchCudaProvider",
        ("torch", "transformers"),
        {"dtype": "float16", "graph": True},
    ),
    Spec(
        "torch-cuda-compile",
        "torch.compile reduce-overhead FP16",
        "cuda",
        "fp16",
        _P + "torch_cuda",
        "TorchCudaProvider",
        ("torch", "transformers"),
        {"dtype": "float16", "compile": True},
    ),
]

BY_NAME = {s.name: s for s in SPECS}


def missing(spec: Spec) -> str | None:
    """Why this provider cannot run here (None when it can), without importing it."""
    for mod in spec.requires:
        if importlib.util.find_spec(mod) is None:
            return f"python package `{mod}` is not installed (pip install 'zoi[bench]')"
    return None


def instantiate(spec: Spec, **kw):
    mod = importlib.import_module(spec.module)
    return getattr(mod, spec.cls)(spec, **kw)
