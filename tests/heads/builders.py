"""Random-init task-head checkpoints of awkward sizes, built with transformers."""

from __future__ import annotations

import os
from pathlib import Path

from tests.conftest import (
    HF_PREFIX,
    random_hf_model,
    save_checkpoint,
    small_vocab_size,
    small_vocab_tokenizer,
)

# hidden 40, 5 heads (head_dim 8), odd vocab (the MiniLM tokenizer's 30522 ids + 7)
HEAD_CONFIGS = {
    "bert": dict(
        hidden_size=40,
        num_hidden_layers=2,
        num_attention_heads=5,
        intermediate_size=74,
        max_position_embeddings=48,
        type_vocab_size=2,
    ),
    "roberta": dict(
        hidden_size=40,
        num_hidden_layers=2,
        num_attention_heads=5,
        intermediate_size=66,
        max_position_embeddings=50,
        type_vocab_size=1,
        pad_token_id=1,
    ),
    "xlm-roberta": dict(
        hidden_size=36,
        num_hidden_layers=1,
        num_attention_heads=3,
        intermediate_size=50,
        max_position_embeddings=42,
        type_vocab_size=1,
        pad_token_id=1,
    ),
    "distilbert": dict(dim=40, n_layers=2, n_heads=5, hidden_dim=70, max_position_embeddings=48),
}
VOCAB = 30529
SMALL_VOCAB = small_vocab_size() + 6  # 177: rows no token id reaches, odd, not a power of 2
TASKS = {
    "seq": "ForSequenceClassification",
    "tok": "ForTokenClassification",
    "mlm": "ForMaskedLM",
}


def build_head_model(arch: str, task: str, num_labels: int = 3, seed: int = 0, **overrides):
    kw = {**HEAD_CONFIGS[arch], **overrides}
    if task != "mlm":
        kw["num_labels"] = num_labels
        if task == "tok":
            names = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC", "B-ORG", "I-ORG"][:num_labels]
            kw["id2label"] = dict(enumerate(names))
            kw["label2id"] = {v: k for k, v in kw["id2label"].items()}
    p = HF_PREFIX[arch]
    return random_hf_model(p + "Config", p + TASKS[task], seed, 0.05, **{"vocab_size": VOCAB, **kw})


def head_checkpoint(
    folder: Path, arch: str, task: str, num_labels: int = 3, seed: int = 0, vocab="minilm", **kw
):
    """vocab "minilm": the MiniLM tokenizer (30522 ids, VOCAB rows); "small": its cut-down
    copy (tests.conftest.small_vocab_tokenizer: 171 ids, SMALL_VOCAB rows), for the MLM
    decoder [T, vocab] under the Triton interpreter."""
    tj = None
    if vocab == "small":
        tj, kw = small_vocab_tokenizer(), {"vocab_size": SMALL_VOCAB, **kw}
    model = build_head_model(arch, task, num_labels, seed, **kw)
    save_checkpoint(model, folder, tokenizer_json=tj)
    return folder, model


PAIRS = [
    ("what is the capital of france?", "Paris is the capital and largest city of France."),
    ("how do plants make food", "Photosynthesis converts light energy into chemical energy."),
    ("a", "b"),
    ("Who wrote Hamlet?", "William Shakespeare wrote the tragedy Hamlet around 1600. " * 6),
    ("query " * 40, "short doc"),
    ("un été à Zürich", "naïve café — ünïcödé text with 中文 characters"),
    ("", "empty query"),
]


os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
