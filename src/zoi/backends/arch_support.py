"""Which graphs a backend runs: what the CUDA backend does not implement is refused up front,
naming the missing piece, instead of being run wrong (an attention without its bias, window or
RoPE would still give plausible vectors).

The CUDA backend runs (issue 20) BERT-family encoders, Electra / ALBERT (a projection of
narrower embeddings), MPNet (relative position bias: kernels/attention_ext.py), ModernBERT
(RoPE, sliding-window local layers, GeGLU: kernels/glu.py, no position table, pre-norm LNs
without a residual, residual adds on the linears), and the per-token heads (token
classification logits [T, labels], SPLADE: the MLM head + kernels/sparse_pool.py) plus the
token embeddings. Sequence classifiers run through zoi.heads.hybrid (GPU encoder, host head).
"""

from __future__ import annotations

from zoi.errors import UnsupportedModelError

# the activations of kernels/common.py (kept here: this module must import without triton)
KERNEL_ACTS = ("none", "gelu", "gelu_tanh", "relu", "sigmoid")
KINDS = ("embed", "linear", "attention", "add_layernorm", "glu", "pool")


def cuda_missing(graph) -> list[str]:
    """Features of `graph` the CUDA backend lacks (empty: it runs the graph)."""
    missing: set[str] = set()
    for op in graph.ops:
        if op.kind not in KINDS:
            missing.add(f"the {op.kind} op")
        elif op.kind in ("glu", "linear") and op.attrs.get("act", "none") not in KERNEL_ACTS:
            missing.add(f"the {op.attrs['act']} activation in a {op.kind} kernel")
        elif op.kind == "attention":
            if "rope_cos" in op.weights and op.attrs["head_dim"] % 2:
                missing.add("RoPE with an odd head_dim")
            extra = set(op.weights) - {"rel_bias", "rope_cos", "rope_sin"}
            if extra:
                missing.add(f"attention inputs {sorted(extra)}")
            if op.attrs.get("causal"):
                missing.add("causal attention")
            if op.attrs.get("kv_heads", 0) not in (0, op.attrs["heads"]):
                missing.add("grouped KV heads")
        elif op.kind == "add_layernorm" and (op.attrs.get("rms") or op.attrs.get("residual")):
            missing.add("RMSNorm" if op.attrs.get("rms") else "a post-norm residual")
        elif op.kind == "embed" and "ln_w" not in op.weights:
            missing.add("embeddings without a LayerNorm")
        elif op.kind == "pool" and op.attrs.get("mode") not in ("mean", "cls", "max", "splade"):
            missing.add(f"{op.attrs.get('mode')} pooling")
        elif op.kind == "linear" and graph.buffers[op.output].rows == "B":
            missing.add("head linears on pooled rows (zoi.heads.hybrid runs them on the host)")
    return sorted(missing)


def check_cuda(model) -> None:
    missing = cuda_missing(model.graph)
    if missing:
        raise UnsupportedModelError(
            f"the cuda backend does not run {model.spec.arch} yet (missing: {', '.join(missing)}); "
            "use device='cpu' (or 'reference')"
        )
