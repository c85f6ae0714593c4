"""Which graphs a backend runs: the ops of MPNet / ModernBERT (zoi.graph.build_archs) that the
CUDA backend does not implement yet are refused up front, naming them, instead of being run
wrong (an attention without its bias, window or RoPE would still give plausible vectors).
Electra / ALBERT (BERT layers after a projection of narrower embeddings) run on it."""

from __future__ import annotations

from zoi.errors import UnsupportedModelError


def cuda_missing(graph) -> list[str]:
    """Features of `graph` the CUDA backend lacks (empty: it runs the graph)."""
    missing: set[str] = set()
    for op in graph.ops:
        if op.kind == "glu":
            missing.add("the glu op (GeGLU)")
        elif op.kind == "attention":
            if "rel_bias" in op.weights:
                missing.add("relative position bias (MPNet)")
            if "rope_cos" in op.weights:
                missing.add("RoPE")
            if op.attrs.get("window", 0):
                missing.add("local-window attention")
        elif op.kind == "embed" and "pos" not in op.weights:
            missing.add("embeddings without a position table")
        elif op.kind == "add_layernorm" and len(op.inputs) == 1:
            missing.add("LayerNorm without a residual (pre-norm)")
        elif op.kind == "linear" and len(op.inputs) > 1:
            missing.add("linear with a residual input")
    return sorted(missing)


def check_cuda(model) -> None:
    missing = cuda_missing(model.graph)
    if missing:
        raise UnsupportedModelError(
            f"the cuda backend does not run {model.spec.arch} yet (missing: {', '.join(missing)}); "
            "use device='cpu' (or 'reference')"
        )
