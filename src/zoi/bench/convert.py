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


def _pooled_module(model_dir: Path):
    """The HF encoder + attention-mask mean pooling, as one torch module (eager attention:
    the graph ONNX Runtime's transformer optimiser recognises and fuses)."""
    import torch
    from transformers import AutoModel

    enc = AutoModel.from_pretrained(str(model_dir), attn_implementation="eager").eval()

    class Pooled(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input_ids, attention_mask, token_type_ids):
            h = self.m(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
            ).last_hidden_state
            mk = attention_mask.unsqueeze(-1).to(h.dtype)
            return (h * mk).sum(1) / mk.sum(1).clamp(min=1e-9)

    return Pooled(enc).eval()


def _example(
    model: ModelRef, n: int, max_len: int = 128, seed: int = 0
) -> list[dict[str, np.ndarray]]:
    """``n`` single-sequence feeds of real text (natural lengths), for export and calibration."""
    tok = Tok(model.path)
    lines = corpus_lines()
    rng = np.random.default_rng(seed)
    idx = rng.choice(len(lines), size=n, replace=False)
    feeds = []
    for ids in tok.encode([lines[i] for i in idx], max_len):
        ids = ids[None, :].astype(np.int64)
        feeds.append(
            {
                "input_ids": ids,
                "attention_mask": np.ones_like(ids),
                "token_type_ids": np.zeros_like(ids),
            }
        )
    return feeds


INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def onnx_raw(model: ModelRef, cache: Path) -> Path:
    """Plain ONNX export (opset 17, dynamic batch and sequence), output = mean-pooled [B, H]."""

    def build(tmp: Path) -> None:
        import torch

        m = _pooled_module(model.path)
        ex = _example(model, 1)[0]
        args = tuple(torch.from_numpy(np.repeat(ex[k], 2, axis=0)) for k in INPUTS)
        axes = {k: {0: "batch", 1: "seq"} for k in INPUTS}
        axes["embedding"] = {0: "batch"}
        with torch.no_grad():
            torch.onnx.export(
                m,
                args,
                str(tmp),
                input_names=list(INPUTS),
                output_names=["embedding"],
                dynamic_axes=axes,
                opset_version=17,
                dynamo=False,
            )

    d = cache / model.name / f"onnx-torch{_ver('torch').split('+')[0]}"
    return _done(d / "model.onnx", build)


def onnx_fp32(model: ModelRef, cache: Path) -> Path:
    """ONNX Runtime's transformer optimiser (Attention, SkipLayerNorm, BiasGelu fusions)."""
    raw = onnx_raw(model, cache)

    def build(tmp: Path) -> None:
        from onnxruntime.transformers import optimizer

        opt = optimizer.optimize_model(
            str(raw), model_type="bert", num_heads=model.heads, hidden_size=model.hidden
        )
        stats = opt.get_fused_operator_statistics()
        if not stats.get("Attention") and not stats.get("MultiHeadAttention"):
            raise RuntimeError(f"ONNX Runtime optimiser fused no attention: {stats}")
        opt.save_model_to_file(str(tmp))

    return _done(raw.parent / f"model_opt_ort{_ver('onnxruntime')}.onnx", build)


def onnx_int8(model: ModelRef, cache: Path) -> Path:
    """``quantize_dynamic`` (INT8 weights per channel, dynamic activations) of the fused graph."""
    fused = onnx_fp32(model, cache)

    def build(tmp: Path) -> None:
        import onnx
        from onnxruntime.quantization import QuantType, quantize_dynamic

        quantize_dynamic(
            str(fused),
            str(tmp) + ".onnx",
            per_channel=True,
            weight_type=QuantType.QInt8,
            extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
        )
        Path(str(tmp) + ".onnx").rename(tmp)

    return _done(raw_sibling(fused, f"model_int8_ort{_ver('onnxruntime')}.onnx"), build)


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
    """NNCF post-training quantisation (transformer preset), calibrated on real text."""
    fp32 = openvino_fp32(model, cache)

    def build(tmp: Path) -> None:
        import nncf
        import openvino as ov

        tmp.mkdir()
        m = ov.Core().read_model(str(fp32))
        data = _example(model, subset, seed=1)
        q = nncf.quantize(
            m, nncf.Dataset(data), model_type=nncf.ModelType.TRANSFORMER, subset_size=subset
        )
        ov.save_model(q, str(tmp / "model.xml"), compress_to_fp16=False)

    d = _done(fp32.parent.parent / f"int8-nncf{_ver('nncf')}", build)
    return d / "model.xml"


def ctranslate2_model(model: ModelRef, cache: Path, quantization: str) -> Path:
    """``quantization``: "float32" or "int8" (weights stored INT8 at conversion)."""

    def build(tmp: Path) -> None:
        from ctranslate2.converters import TransformersConverter

        TransformersConverter(str(model.path)).convert(str(tmp), quantization=quantization)

    return _done(cache / model.name / f"ctranslate2-{_ver('ctranslate2')}" / quantization, build)
