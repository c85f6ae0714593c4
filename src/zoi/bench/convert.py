"""Peer model conversions, built offline from the local model folder and cached.

Layout: ``<cache>/<model>/<tool>-<version>/...``; each artifact is written to a temporary
name and renamed when complete, so an interrupted conversion is redone, never half-used.
Calibration / export inputs are real text (the shipped corpus), never zeros.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np

from zoi.bench.head import FULL_HEAD_TYPES, bidirectional_masks, head_module, model_type
from zoi.bench.models import ModelRef
from zoi.bench.text import Tok, corpus_lines


def _ver(mod: str) -> str:
    from importlib.metadata import version

    return version(mod)


def _done(path: Path, build: Callable[[Path], None]) -> Path:
    """Build ``path`` (file or folder) through a temporary sibling unless it exists."""
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".partial")
    if tmp.is_dir():
        shutil.rmtree(tmp)
    elif tmp.exists():
        tmp.unlink()
    build(tmp)
    tmp.rename(path)
    return path


def model_inputs(model: ModelRef) -> tuple[str, ...]:
    """The ONNX graph's inputs: MPNet, ModernBERT and the decoder architectures take no token
    types (their forward has no ``token_type_ids``), the BERT family does."""
    return INPUTS[:2] if model_type(model.path) in NO_TOKEN_TYPES else INPUTS


NO_TOKEN_TYPES = ("mpnet", "modernbert", "qwen3", "gemma3_text")


def _pooled_module(model_dir: Path, with_types: bool = True):
    """The HF encoder + the benchmark's head (zoi.bench.head: mean pooling for the BERT family;
    the folder's pooling, Dense and Normalize for the decoder architectures), as one torch
    module (eager attention: the graph ONNX Runtime's transformer optimiser recognises and
    fuses; for the decoders, causal or bidirectional and sliding-window masks built from the
    attention mask inside the graph)."""
    import torch
    from transformers import AutoModel

    enc = AutoModel.from_pretrained(str(model_dir), attn_implementation="eager").eval()
    head = head_module(model_dir)
    decoder = model_type(model_dir) in FULL_HEAD_TYPES
    masks = bidirectional_masks(enc.config) if decoder else None

    class Pooled(torch.nn.Module):
        def __init__(self, m, head):
            super().__init__()
            self.m = m
            self.head = head

        def encode(self, input_ids, attention_mask, **kw):
            am = masks(attention_mask) if masks else attention_mask
            if decoder:
                kw["use_cache"] = False  # one forward pass: no KV cache in the graph
            h = self.m(input_ids=input_ids, attention_mask=am, **kw).last_hidden_state
            return self.head(h, attention_mask)

        def forward(self, input_ids, attention_mask, token_type_ids):
            return self.encode(input_ids, attention_mask, token_type_ids=token_type_ids)

    class PooledNoTypes(Pooled):
        def forward(self, input_ids, attention_mask):
            return self.encode(input_ids, attention_mask)

    return (Pooled if with_types else PooledNoTypes)(enc, head).eval()


def _example(
    model: ModelRef, n: int, max_len: int = 128, seed: int = 0
) -> list[dict[str, np.ndarray]]:
    """``n`` single-sequence feeds of real text (natural lengths), for export and calibration."""
    tok = Tok(model.path)
    names = model_inputs(model)
    lines = corpus_lines()
    rng = np.random.default_rng(seed)
    idx = rng.choice(len(lines), size=n, replace=False)
    feeds = []
    for ids in tok.encode([lines[i] for i in idx], max_len):
        ids = ids[None, :].astype(np.int64)
        f = {
            "input_ids": ids,
            "attention_mask": np.ones_like(ids),
            "token_type_ids": np.zeros_like(ids),
        }
        feeds.append({k: f[k] for k in names})
    return feeds


INPUTS = ("input_ids", "attention_mask", "token_type_ids")

# a graph with more weight bytes than this keeps them in one file next to it (``<graph>.data``):
# ONNX's protobuf stops at 2 GiB (Qwen3-Embedding-0.6B in FP32 is 2.4 GB)
EXTERNAL_DATA_BYTES = 1_500_000_000


def external_data(onnx_file: Path | str) -> Path | None:
    """The file holding the weights of ``onnx_file`` (None: they are inside the graph)."""
    p = Path(str(onnx_file) + ".data")
    return p if p.exists() else None


def _done_onnx(path: Path, build: Callable[[Path], None]) -> Path:
    """``_done`` for an ONNX graph whose weights may sit in ``<graph>.data``: ``build(dst)``
    writes the graph at ``dst`` (named as ``path``, in a scratch folder) and, when external,
    its weights at ``<dst>.data`` (the name the graph refers to). The weights move in first,
    the graph last: a graph in place says both are complete."""
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    scratch = path.with_name(path.name + ".partial")
    if scratch.is_dir():
        shutil.rmtree(scratch)
    elif scratch.exists():
        scratch.unlink()
    scratch.mkdir()
    dst = scratch / path.name
    build(dst)
    data = external_data(dst)
    if data is not None:
        data.replace(path.with_name(data.name))
    dst.replace(path)
    shutil.rmtree(scratch)
    return path


def _one_external_file(dst: Path) -> None:
    """Rewrite the graph at ``dst`` with all its weights in ``<dst>.data`` (the TorchScript
    exporter writes one file per tensor past 2 GiB; those stay behind in the scratch folder)."""
    import onnx

    proto = onnx.load(str(dst))  # external tensors included
    onnx.save_model(
        proto,
        str(dst),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location=dst.name + ".data",
        size_threshold=1024,
    )


def onnx_raw(model: ModelRef, cache: Path) -> Path:
    """Plain ONNX export (opset 17, dynamic batch and sequence), output = mean-pooled [B, H]."""

    def build(tmp: Path) -> None:
        import torch

        names = model_inputs(model)
        m = _pooled_module(model.path, with_types="token_type_ids" in names)
        big = sum(t.numel() * t.element_size() for t in m.state_dict().values())
        ex = _example(model, 1)[0]
        args = tuple(torch.from_numpy(np.repeat(ex[k], 2, axis=0)) for k in names)
        axes = {k: {0: "batch", 1: "seq"} for k in names}
        axes["embedding"] = {0: "batch"}
        with torch.no_grad():
            torch.onnx.export(
                m,
                args,
                str(tmp),
                input_names=list(names),
                output_names=["embedding"],
                dynamic_axes=axes,
                opset_version=17,
                dynamo=False,
            )
        del m
        if big > EXTERNAL_DATA_BYTES:
            _one_external_file(tmp)

    d = cache / model.name / f"onnx-torch{_ver('torch').split('+')[0]}"
    return _done_onnx(d / "model.onnx", build)


# the architectures ONNX Runtime's transformer optimiser has no attention fusion for (MPNet's
# relative position bias, ModernBERT's RoPE + local window, the decoders' RoPE + grouped KV
# heads + q / k norms): their graph keeps the fusions it does find (LayerNorm, RMSNorm,
# Gelu, ...) and the stats say so (``fusion_stats``)
UNFUSED_ATTENTION_OK = ("mpnet-base", "modernbert-base", "gemma-embed", "qwen3-embed")


def fusion_stats_path(onnx_file: Path | str) -> Path:
    return Path(str(onnx_file) + ".fusions.json")


# the decoder-architecture embedders: the offline optimiser finds no attention to fuse in them
# (above), and on the 0.6B graph (2.4 GB of weights) it grew past 21 GB and was killed on a
# 24 GB host; ONNX Runtime's session applies its LayerNorm / Gelu / MatMul fusions itself when
# it loads a graph (graph optimisation level "all", the provider's setting), so a graph of these
# past SESSION_FUSIONS_BYTES of weights is used as exported
SESSION_FUSIONS_ONLY = ("gemma-embed", "qwen3-embed")
SESSION_FUSIONS_BYTES = 1 << 30


def onnx_fp32(model: ModelRef, cache: Path) -> Path:
    """ONNX Runtime's transformer optimiser (Attention, SkipLayerNorm, BiasGelu fusions)."""
    import json

    raw = onnx_raw(model, cache)
    data = external_data(raw)
    size = raw.stat().st_size + (data.stat().st_size if data else 0)
    if model.name in SESSION_FUSIONS_ONLY and size > SESSION_FUSIONS_BYTES:
        return raw
    out = raw.parent / f"model_opt_ort{_ver('onnxruntime')}.onnx"

    def build(tmp: Path) -> None:
        from onnxruntime.transformers import optimizer

        opt = optimizer.optimize_model(
            str(raw), model_type="bert", num_heads=model.heads, hidden_size=model.hidden
        )
        stats = {k: int(v) for k, v in opt.get_fused_operator_statistics().items() if v}
        fused = bool(stats.get("Attention") or stats.get("MultiHeadAttention"))
        if not fused and model.name not in UNFUSED_ATTENTION_OK:
            raise RuntimeError(f"ONNX Runtime optimiser fused no attention: {stats}")
        opt.save_model_to_file(str(tmp), use_external_data_format=bool(external_data(raw)))
        fusion_stats_path(out).write_text(
            json.dumps({"fused_ops": stats, "attention_fused": fused}, indent=1)
        )

    return _done_onnx(out, build)


def fusion_stats(onnx_file: Path | str) -> dict | None:
    """What the optimiser fused into the graph ``onnx_file`` derives from (None: unknown)."""
    import json
    import re

    p = Path(onnx_file)
    opt = re.sub(r"model_int8(_w7)?_ort", "model_opt_ort", p.name)
    for cand in (p, p.parent / opt):
        f = fusion_stats_path(cand)
        if f.exists():
            return json.loads(f.read_text())
    return None


def int8_saturates(cpuinfo: str | None = None) -> bool:
    """True on an x86 CPU without VNNI (AVX2 / AVX-512 only): there ONNX Runtime's U8S8
    kernels add pairs of u8 x s8 products in int16 with saturation (vpmaddubsw), and its
    quantisation guide asks for 7-bit weights (reduce_range) on such CPUs. Elsewhere (VNNI,
    ARM) the products are exact. cpuinfo: /proc/cpuinfo's text (tests)."""
    import platform

    if cpuinfo is None:
        if platform.machine().lower() not in ("x86_64", "amd64"):
            return False
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return False
    flags = next((ln for ln in cpuinfo.splitlines() if ln.startswith("flags")), "").split()
    return "avx2" in flags and not {"avx512_vnni", "avx_vnni"} & set(flags)


def onnx_int8(model: ModelRef, cache: Path) -> Path:
    """``quantize_dynamic`` (INT8 weights per channel, dynamic activations) of the fused graph,
    with 7-bit weights where the CPU's INT8 products saturate (``int8_saturates``: ONNX
    Runtime's own advice for such CPUs; the file name says which)."""
    fused = onnx_fp32(model, cache)
    reduce = int8_saturates()

    def build(tmp: Path) -> None:
        import onnx
        from onnxruntime.quantization import QuantType, quantize_dynamic

        quantize_dynamic(
            str(fused),
            str(tmp),
            per_channel=True,
            reduce_range=reduce,
            weight_type=QuantType.QInt8,
            extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
            use_external_data_format=bool(external_data(fused)),
        )

    name = f"model_int8{'_w7' if reduce else ''}_ort{_ver('onnxruntime')}.onnx"
    return _done_onnx(raw_sibling(fused, name), build)


def raw_sibling(p: Path, name: str) -> Path:
    return p.parent / name


def openvino_fp32(model: ModelRef, cache: Path) -> Path:
    raw = onnx_raw(model, cache)

    def build(tmp: Path) -> None:
        import openvino as ov

        tmp.mkdir()
        ov.save_model(ov.convert_model(str(raw)), str(tmp / "model.xml"), compress_to_fp16=False)

    d = _done(cache / model.name / f"openvino-{_ver('openvino')}" / "fp32", build)
    return d / "model.xml"


def openvino_int8(model: ModelRef, cache: Path, subset: int = 300) -> Path:
    """NNCF post-training quantisation (transformer preset), calibrated on real text; where the
    CPU's INT8 products saturate (``int8_saturates``), NNCF's overflow fix on every layer
    (7-bit weights: its answer to the same AVX2 / AVX-512 without VNNI kernels)."""
    fp32 = openvino_fp32(model, cache)
    fix_all = int8_saturates()

    def build(tmp: Path) -> None:
        import nncf
        import openvino as ov
        from nncf.quantization.advanced_parameters import (
            AdvancedQuantizationParameters,
            OverflowFix,
        )

        tmp.mkdir()
        m = ov.Core().read_model(str(fp32))
        data = _example(model, subset, seed=1)
        adv = AdvancedQuantizationParameters(overflow_fix=OverflowFix.ENABLE) if fix_all else None
        q = nncf.quantize(
            m,
            nncf.Dataset(data),
            model_type=nncf.ModelType.TRANSFORMER,
            subset_size=subset,
            advanced_parameters=adv,
        )
        ov.save_model(q, str(tmp / "model.xml"), compress_to_fp16=False)

    tag = f"int8{'-w7' if fix_all else ''}-nncf{_ver('nncf')}"
    d = _done(fp32.parent.parent / tag, build)
    return d / "model.xml"


def ctranslate2_model(model: ModelRef, cache: Path, quantization: str) -> Path:
    """``quantization``: "float32" or "int8" (weights stored INT8 at conversion)."""

    def build(tmp: Path) -> None:
        from ctranslate2.converters import TransformersConverter

        TransformersConverter(str(model.path)).convert(str(tmp), quantization=quantization)

    return _done(cache / model.name / f"ctranslate2-{_ver('ctranslate2')}" / quantization, build)
