"""Which graphs a backend runs: what the CUDA backend does not implement is refused up front,
naming the missing piece, instead of being run wrong (an attention without its bias, window or
RoPE would still give plausible vectors).

The CUDA backend runs BERT-family encoders, Electra / ALBERT (a projection of narrower
embeddings), MPNet (relative position bias: kernels/attention.py), ModernBERT (RoPE,
sliding-window local layers, GeGLU: kernels/glu.py, no position table, pre-norm LNs without a
residual, residual adds on the linears), NomicBERT / GTE (BERT's post-norm layers with RoPE,
no position table and a SwiGLU / GeGLU MLP: the same kernels), the decoder architectures run
as encoders (Qwen3,
Gemma3, Llama, Qwen2, Mistral: RMSNorm and the post-norm residual in kernels/layernorm.py,
causal / grouped-KV / q-k-norm attention, SwiGLU, embeddings without a norm, last-token
pooling, sentence-transformers' Dense modules as linears over the pooled rows), and the
per-token heads (token classification logits [T, labels], SPLADE: the MLM head +
kernels/sparse_pool.py) plus the token embeddings. Sequence classifiers run through
zoi.heads.hybrid (GPU encoder, host head). Task adapters chosen per request (jina-embeddings-v3's
LoRA) are refused: the CPU core and the reference run them.
"""

from __future__ import annotations

from zoi.errors import UnsupportedModelError

# the activations of kernels/common.py (kept here: this module must import without triton)
KERNEL_ACTS = ("none", "gelu", "gelu_tanh", "relu", "sigmoid", "silu")
KINDS = ("embed", "linear", "attention", "add_layernorm", "glu", "pool")
POOL_MODES = ("mean", "cls", "max", "splade", "last")
ATTENTION_INPUTS = {"rel_bias", "rope_cos", "rope_sin", "q_norm", "k_norm"}


def cuda_missing(graph) -> list[str]:
    """Features of `graph` the CUDA backend lacks (empty: it runs the graph)."""
    missing: set[str] = set()
    pooled = False  # past the pool: linears over the B pooled rows (Dense modules)
    for op in graph.ops:
        if "lora_a" in op.weights:  # jina-embeddings-v3's adapters (zoi.frontend.adapters)
            missing.add("per-request LoRA on the GPU (the task adapters)")
        if op.kind not in KINDS:
            missing.add(f"the {op.kind} op")
        elif op.kind in ("glu", "linear") and op.attrs.get("act", "none") not in KERNEL_ACTS:
            missing.add(f"the {op.attrs['act']} activation in a {op.kind} kernel")
        elif op.kind == "attention":
            if "rope_cos" in op.weights and op.attrs["head_dim"] % 2:
                missing.add("RoPE with an odd head_dim")
            extra = set(op.weights) - ATTENTION_INPUTS
            if extra:
                missing.add(f"attention inputs {sorted(extra)}")
            if ("q_norm" in op.weights) != ("k_norm" in op.weights):
                missing.add("a norm of q without one of k (or k without q)")
            kv = op.attrs.get("kv_heads", 0) or op.attrs["heads"]
            if op.attrs["heads"] % kv:
                missing.add("KV heads that do not divide the query heads")
        elif op.kind == "add_layernorm" and op.attrs.get("residual") not in (None, "post"):
            missing.add(f"a {op.attrs['residual']} residual of a norm")
        elif op.kind == "embed" and ("ln_w" in op.weights) != ("ln_b" in op.weights):
            missing.add("an embedding norm without its bias")
        elif op.kind == "pool" and op.attrs.get("mode") not in POOL_MODES:
            missing.add(f"{op.attrs.get('mode')} pooling")
        elif (
            op.kind == "linear"
            and graph.buffers[op.output].rows == "B"
            and not _pooled_chain(graph, op, pooled)
        ):
            missing.add("head linears on pooled rows (zoi.heads.hybrid runs them on the host)")
        if op.kind == "pool":
            pooled = op.attrs.get("mode") != "splade"
    return sorted(missing)


def _pooled_chain(graph, op, pooled: bool) -> bool:
    """Whether a linear over B rows is one of the Dense modules the backend runs: a chain from
    the pool (mean / cls / max / last) to the graph's output, one input (no residual)."""
    return pooled and len(op.inputs) == 1 and graph.buffers[op.inputs[0]].rows == "B"


def check_cuda(model) -> None:
    missing = cuda_missing(model.graph)
    if missing:
        raise UnsupportedModelError(
            f"the cuda backend does not run {model.spec.arch} yet (missing: {', '.join(missing)}); "
            "use device='cpu' (or 'reference')"
        )
