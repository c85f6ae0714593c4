"""Task heads on the compiled encoder: cross-encoders / classifiers, token
classification (NER), SPLADE sparse vectors, token embeddings. `HeadsMixin` gives the Engine
predict / rerank / predict_tokens / ner / encode_sparse; everything runs through the same IR,
plan and kernels as the embeddings (zoi.graph.heads, the backends' run_outputs)."""

from zoi.heads.api import (
    HeadsMixin,
    check_head_device,
    default_max_tokens,
    head_backend,
    quantize_heads,
)
from zoi.heads.names import HEAD_NAMES
from zoi.heads.options import st_meta

__all__ = [
    "HEAD_NAMES",
    "HeadsMixin",
    "check_head_device",
    "default_max_tokens",
    "head_backend",
    "quantize_heads",
    "st_meta",
]
