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
# (module, class, required modules) of each library's providers
_ZOI = (_P + "zoi_engine", "ZoiProvider", ("zoi",))
_TORCH = (_P + "torch_cpu", "TorchProvider", ("torch", "transformers"))
_TCUDA = (_P + "torch_cuda", "TorchCudaProvider", ("torch", "transformers"))
_ORT = (_P + "onnxrt", "OrtProvider", ("onnxruntime", "onnx", "torch", "transformers"))
_OV = (_P + "openvino_p", "OvProvider", ("openvino", "onnx", "torch", "transformers"))
_CT2 = (_P + "ct2", "Ct2Provider", ("ctranslate2", "torch", "transformers"))
_ST = (_P + "text_only", "SentenceTransformerProvider", ("torch", "sentence_transformers"))
_TOK = (_P + "text_only", "TokenizerProvider")


def _zoi(name: str, label: str, dev: str, precision: str, default=True, **options) -> Spec:
    """A zoi engine: zoi.compile(device=dev, precision=precision, **options)."""
    options = {"device": dev, "precision": precision, **options}
    return Spec(name, label, dev, precision, *_ZOI, options, default=default)


SPECS: list[Spec] = [
    _zoi("zoi-cpu-fp32", "zoi CPU FP32", "cpu", "fp32"),
    _zoi("zoi-cpu-int8", "zoi CPU INT8", "cpu", "int8"),
    # the quantiser's per-linear 7-bit weights (docs/QUANT.md "7-bit weights"): on request
    _zoi(
        "zoi-cpu-int8-w7",
        "zoi CPU INT8 (7-bit weights where chosen)",
        "cpu",
        "int8",
        False,
        weight_bits="auto",
    ),
    Spec("torch-fp32", "PyTorch eager FP32", "cpu", "fp32", *_TORCH, {}, baseline=True),
    Spec("torch-int8", "PyTorch dynamic INT8", "cpu", "int8", *_TORCH, {"quantize": True}),
    Spec("onnxruntime-fp32", "ONNX Runtime FP32 (fused)", "cpu", "fp32", *_ORT),
    Spec("onnxruntime-int8", "ONNX Runtime INT8 (dynamic, per-channel)", "cpu", "int8", *_ORT),
    Spec("openvino-fp32", "OpenVINO FP32", "cpu", "fp32", *_OV),
    Spec(
        "openvino-int8",
        "OpenVINO INT8 (NNCF PTQ)",
        "cpu",
        "int8",
        _P + "openvino_p",
        "OvProvider",
        ("openvino", "nncf", "onnx", "torch", "transformers"),
    ),
    Spec("ctranslate2-fp32", "CTranslate2 FP32", "cpu", "fp32", *_CT2),
    Spec("ctranslate2-int8", "CTranslate2 INT8", "cpu", "int8", *_CT2),
    # zoi's numpy reference backend: a correctness check of the harness, far too slow to rank
    _zoi(
        "zoi-reference-fp32", "zoi reference (numpy) FP32", "cpu", "fp32", False, device="reference"
    ),
    # text workloads only: the end-to-end baseline and the tokenizers alone
    Spec(
        "st-fp32",
        "sentence-transformers FP32",
        "cpu",
        "fp32",
        *_ST,
        {"device": "cpu"},
        texts_only=True,
        text_baseline=True,
    ),
    Spec(
        "tokenizer-zoi",
        "tokenizer only: zoi native WordPiece (1 thread)",
        "cpu",
        "fp32",
        *_TOK,
        ("zoi",),
        {"impl": "zoi"},
        texts_only=True,
    ),
    Spec(
        "tokenizer-hf",
        "tokenizer only: HF tokenizers (1 thread)",
        "cpu",
        "fp32",
        *_TOK,
        ("tokenizers",),
        {"impl": "hf"},
        texts_only=True,
    ),
    Spec(
        "st-cuda-fp16",
        "sentence-transformers FP16 (CUDA)",
        "cuda",
        "fp16",
        *_ST,
        {"device": "cuda", "dtype": "float16"},
        texts_only=True,
        text_baseline=True,
    ),
    # GPU (run when torch.cuda is available)
    _zoi("zoi-cuda-fp16", "zoi CUDA FP16", "cuda", "fp16"),
    _zoi("zoi-cuda-int8", "zoi CUDA INT8", "cuda", "int8"),
    # an FP8 GPU (sm_89+) only: run when named
    _zoi("zoi-cuda-fp8", "zoi CUDA FP8 (E4M3)", "cuda", "fp8", False),
    Spec(
        "torch-cuda-fp32",
        "PyTorch eager FP32 (CUDA)",
        "cuda",
        "fp32",
        *_TCUDA,
        {"dtype": "float32"},
        baseline=True,
    ),
    Spec(
        "torch-cuda-fp16",
        "PyTorch eager FP16 (CUDA)",
        "cuda",
        "fp16",
        *_TCUDA,
        {"dtype": "float16"},
    ),
    Spec(
        "torch-cuda-fp16-graph",
        "PyTorch FP16 + CUDA graph",
        "cuda",
        "fp16",
        *_TCUDA,
        {"dtype": "float16", "graph": True},
    ),
    Spec(
        "torch-cuda-compile",
        "torch.compile reduce-overhead FP16",
        "cuda",
        "fp16",
        *_TCUDA,
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


# --peer-isa: restrict the peer libraries to an ISA where each allows it, so that zoi forced
# to AVX2 (ZOI_CPU_ISA=avx2) is compared with peers on the same vector width on a machine
# that has more. Per library family: the environment its worker process gets, and what is
# known of the restriction ("verified": checked on an AVX-512 host, see lab/cpu/peer_isa.py;
# "native": the library picks its kernels by cpuid alone and cannot be restricted).
PEER_ISAS = ("native", "avx2")

_ISA_ENV: dict[str, dict[str, dict]] = {
    "avx2": {
        "torch": {
            "env": {
                "ATEN_CPU_CAPABILITY": "avx2",  # ATen's own vectorised kernels
                "ONEDNN_MAX_CPU_ISA": "AVX2",  # oneDNN (mkldnn) primitives
                "DNNL_MAX_CPU_ISA": "AVX2",  # the same, older oneDNN name
                "MKL_ENABLE_INSTRUCTIONS": "AVX2",  # MKL sgemm (the FP32 linears)
            },
            "restriction": "ATen avx2 + oneDNN AVX2 + MKL AVX2",
        },
        "ctranslate2": {
            "env": {
                "CT2_FORCE_CPU_ISA": "AVX2",  # CTranslate2's own kernels
                "ONEDNN_MAX_CPU_ISA": "AVX2",  # its oneDNN GEMMs (the INT8 path on AMD)
                "DNNL_MAX_CPU_ISA": "AVX2",
                "MKL_ENABLE_INSTRUCTIONS": "AVX2",  # its MKL GEMMs (Intel CPUs)
            },
            "restriction": "CT2_FORCE_CPU_ISA=AVX2 + oneDNN/MKL AVX2",
        },
        "openvino": {
            "env": {"ONEDNN_MAX_CPU_ISA": "AVX2", "DNNL_MAX_CPU_ISA": "AVX2"},
            # verified: FullyConnected brgemm_avx512_amx_I8 -> jit_gemm_I8, Eltwise/Softmax
            # jit_avx2; its LayerNorm (MVN) kernel stays jit_avx512 (not oneDNN-capped)
            "restriction": "ONEDNN_MAX_CPU_ISA=AVX2 (GEMMs; its MVN stays AVX-512)",
        },
        "onnxruntime": {
            "env": {},
            "restriction": "native ISA (MLAS dispatches by cpuid; no switch)",
        },
    },
}


def isa_env(spec: Spec, peer_isa: str) -> tuple[dict[str, str], str | None]:
    """(environment variables, description) that restrict ``spec``'s library to ``peer_isa``;
    "native" restricts nobody. zoi's CPU providers run ZOI_CPU_ISA's kernels: the caller's
    when set, else ``peer_isa`` (explicitly, so that both sides run the same vector width).
    The description is None when nothing applies."""
    import os

    if peer_isa not in PEER_ISAS:
        raise ValueError(f"--peer-isa {peer_isa!r}: expected one of {', '.join(PEER_ISAS)}")
    if peer_isa == "native" or spec.device != "cpu":
        return {}, None
    if spec.family == "zoi":
        if spec.options.get("device") != "cpu":
            return {}, None
        own = os.environ.get("ZOI_CPU_ISA")
        if own:
            return {}, f"ZOI_CPU_ISA={own} (the caller's)"
        return {"ZOI_CPU_ISA": peer_isa}, f"ZOI_CPU_ISA={peer_isa}"
    fam = {"st": "torch"}.get(spec.family, spec.family)
    e = _ISA_ENV[peer_isa].get(fam)
    if e is None:
        return {}, f"native ISA (no known restriction for {fam})"
    return dict(e["env"]), e["restriction"]
