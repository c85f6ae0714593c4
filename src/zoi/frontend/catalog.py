"""What runs where: one row per architecture zoi compiles, with the precisions of each device and
the outputs (`zoi info --archs`, the README's table). tests/test_catalog.py checks that every
architecture the checkpoint loader accepts has a row, so a new one cannot go unlisted.

"interpreter" marks what is checked under the Triton interpreter only (the kernels' numbers
are the compiled ones' on a GPU; the compiled run is scripts/gpu_check.sh).
"""

from __future__ import annotations

from dataclasses import dataclass

BERT_HEADS = ("embeddings", "token embeddings", "rerank / classify", "NER", "SPLADE", "ColBERT")


@dataclass(frozen=True)
class Row:
    arch: str  # ModelSpec.arch
    model_types: tuple[str, ...]  # config.json model_type values
    examples: str
    cpu: str = "FP32, INT8"
    cuda: str = "FP16, INT8"
    outputs: tuple[str, ...] = ("embeddings", "token embeddings")


ROWS: tuple[Row, ...] = (
    Row("bert", ("bert",), "all-MiniLM-L6-v2, BGE / E5 small-base", outputs=BERT_HEADS),
    Row("distilbert", ("distilbert",), "msmarco-distilbert", outputs=BERT_HEADS[:5]),
    Row(
        "roberta",
        ("roberta", "xlm-roberta", "camembert"),
        "all-roberta, BGE-M3, XLM-R",
        cuda="FP16, INT8 (BGE-M3 / ColBERT heads: CPU)",
        outputs=(*BERT_HEADS, "BGE-M3 dense + sparse + ColBERT"),
    ),
    Row("mpnet", ("mpnet",), "all-mpnet-base-v2"),
    Row("modernbert", ("modernbert",), "ModernBERT-base embedders"),
    Row("electra", ("electra",), "Electra embedders"),
    Row("albert", ("albert",), "paraphrase-albert"),
    Row(
        "nomic_bert",
        ("nomic_bert",),
        "nomic-embed-text v1 / v1.5",
        outputs=("embeddings", "token embeddings", "prompts"),
    ),
    Row("gte", ("gte", "new"), "gte-base-en-v1.5, gte-multilingual-base"),
    Row(
        "jina_v3",
        ("jina_embeddings_v3",),  # and the hub's folder: xlm-roberta with rotary positions
        "jina-embeddings-v3 (5 task LoRA adapters chosen per request)",
        cpu="FP32, INT8 (adapters FP32)",
        cuda="FP16 (interpreter) without adapters; per-request LoRA refused",
        outputs=("embeddings", "embeddings per task", "token embeddings (base weights)"),
    ),
    Row(
        "qwen3",
        ("qwen3",),
        "Qwen3-Embedding, Qwen3-Reranker",
        outputs=("embeddings (last token)", "LLM rerank", "prompts"),
    ),
    Row(
        "gemma3",
        ("gemma3_text",),
        "EmbeddingGemma-300m",
        outputs=("embeddings (+ Dense)", "prompts"),
    ),
    Row("qwen2", ("qwen2",), "gte-Qwen2 style embedders", outputs=("embeddings", "LLM rerank")),
    Row("llama", ("llama",), "Llama-based embedders", outputs=("embeddings", "LLM rerank")),
    Row(
        "mistral", ("mistral",), "E5-Mistral style embedders", outputs=("embeddings", "LLM rerank")
    ),
)


def rows() -> tuple[Row, ...]:
    return ROWS
