"""Hugging Face checkpoint folder -> (ModelSpec, canonical float32 weights, tokenizer.json path).

Supported: BertModel (all-MiniLM, BGE/E5/GTE, BERT-base), DistilBertModel, RobertaModel /
XLMRobertaModel, with or without a task prefix (`bert.`, `roberta.` ...). Sentence-transformers
folders: pooling from `modules.json` + `1_Pooling/config.json`, `Normalize`, `max_seq_length`.
Only safetensors are read: a pickle checkpoint can execute code when loaded.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from zoi.errors import CheckpointError, UnsupportedModelError
from zoi.frontend import archs_decoder, archs_rotary
from zoi.frontend.adapters import PARAM, load_adapters
from zoi.frontend.archs import NEW_ARCHS, derive, source_shapes
from zoi.frontend.archs import expected_shapes as arch_expected_shapes
from zoi.frontend.archs import mapping as arch_mapping
from zoi.frontend.archs import spec_fields as arch_spec_fields
from zoi.frontend.heads import (
    apply_task,
    head_from_config,
    head_shapes,
    load_head_weights,
    load_score_rows,
    st_head,
)
from zoi.frontend.paths import check_file, inside, read_json
from zoi.frontend.safetensors_io import SafetensorsFile
from zoi.frontend.spec import DECODER_ARCHS, ROTARY_ARCHS, ModelSpec

SUPPORTED_TYPES = {
    "bert": "bert",
    "distilbert": "distilbert",
    "roberta": "roberta",
    "xlm-roberta": "roberta",
    "camembert": "roberta",
    "mpnet": "mpnet",
    "modernbert": "modernbert",
    "electra": "electra",
    "albert": "albert",
    **archs_rotary.MODEL_TYPES,
    **archs_decoder.MODEL_TYPES,
}
SUPPORTED_TEXT = "BertModel, DistilBertModel, RobertaModel / XLMRobertaModel, MPNetModel, ModernBertModel, ElectraModel, AlbertModel, NomicBertModel, GteModel (and GTE's original NewModel), JinaEmbeddingsV3Model (and its hub folder with task adapters), and as encoders LlamaModel, MistralModel, Qwen2Model, Qwen3Model, Gemma3TextModel (model_type bert, distilbert, roberta, xlm-roberta, camembert, mpnet, modernbert, electra, albert, nomic_bert, gte, new, jina_embeddings_v3, llama, mistral, qwen2, qwen3, gemma3_text)"
_ACTS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "relu": "relu"}


def _field(cfg: dict, path: Path, *names: str, kind: type = int, default: Any = ...) -> Any:
    for n in names:
        if n in cfg and cfg[n] is not None:
            v = cfg[n]
            ok = (
                isinstance(v, (int, float)) and not isinstance(v, bool)
                if kind in (int, float)
                else isinstance(v, kind)
            )
            if ok and kind in (int, float) and not math.isfinite(v):
                ok = False  # inf / nan: int(v) would raise OverflowError / ValueError
            if not ok or (kind is int and (float(v) != int(v) or v < 0)):
                raise CheckpointError(
                    f"{path}: field {n!r} should be a {kind.__name__} >= 0, got {v!r}"
                )
            return kind(v)
    if default is ...:
        raise CheckpointError(f"{path}: missing field {names[0]!r}")
    return default


# config.json's names of the sizes a spec takes (DistilBERT has its own)
_CONFIG_NAMES = {
    "bert": {
        "hidden": "hidden_size",
        "layers": "num_hidden_layers",
        "heads": "num_attention_heads",
        "intermediate": "intermediate_size",
        "vocab_size": "vocab_size",
        "max_positions": "max_position_embeddings",
        "embed_size": "embedding_size",
    },
    "distilbert": {
        "hidden": "dim",
        "layers": "n_layers",
        "heads": "n_heads",
        "intermediate": "hidden_dim",
        "vocab_size": "vocab_size",
        "max_positions": "max_position_embeddings",
    },
}
# the plausible range of each size: a value outside is a corrupt or mistyped config.json,
# refused here by its own name, before anything is sized from it
_SIZE_RANGES = {
    "hidden": (1, 1 << 16),
    "layers": (1, 1024),
    "heads": (1, 1024),
    "intermediate": (1, 1 << 18),
    "vocab_size": (1, 1 << 24),
    "max_positions": (2, 1 << 20),
    "embed_size": (1, 1 << 16),
}


def _check_sizes(cpath: Path, sizes: dict, names: dict, offset: int = 0) -> None:
    """Each size of config.json within its range, the error naming the config field."""
    for key, v in sizes.items():
        lo, hi = _SIZE_RANGES[key]
        if key == "max_positions":
            lo += offset  # RoBERTa / MPNet positions start past the padding index
        name = names.get(key, key)
        if v > hi:
            raise CheckpointError(
                f"{cpath}: {name} {v} is implausibly large (limit {hi}); is config.json "
                "corrupt? It must describe the checkpoint's weights"
            )
        if v < lo:
            why = (
                " ([CLS] and [SEP]"
                + (f", after the {offset} positions before the first token" if offset else "")
                + ")"
                if key == "max_positions"
                else ""
            )
            raise CheckpointError(
                f"{cpath}: {name} is {v}; it must be an integer in [{lo}, {hi}]{why}. Fix "
                "config.json to describe the checkpoint's weights"
            )


def _spec_from_config(folder: Path, cfg: dict) -> ModelSpec:
    cpath = folder / "config.json"
    if not isinstance(cfg, dict):
        raise CheckpointError(f"{cpath}: expected a JSON object")
    mtype = cfg.get("model_type")
    if not isinstance(mtype, str) or mtype not in SUPPORTED_TYPES:
        archs = cfg.get("architectures")
        raise UnsupportedModelError(
            f"{cpath}: model_type {mtype!r} (architectures {archs}) is not supported; zoi supports {SUPPORTED_TEXT}"
        )
    arch = SUPPORTED_TYPES[mtype]
    if archs_rotary.is_original_jina(cfg):  # jina-embeddings-v3's hub config: XLM-R with RoPE
        arch = "jina_v3"
    if arch in DECODER_ARCHS:
        return _new_arch_spec(folder, cfg, arch)
    if arch in NEW_ARCHS or arch in ROTARY_ARCHS:
        if head_from_config(folder, cfg, arch):
            raise UnsupportedModelError(
                f"{folder / 'config.json'}: architectures {cfg.get('architectures')}: task heads "
                f"on {arch} are not supported yet; use the base model's checkpoint for embeddings"
            )
        return _new_arch_spec(folder, cfg, arch)
    head = head_from_config(folder, cfg, arch)  # refuses the heads zoi does not run
    if arch == "distilbert":
        hidden = _field(cfg, cpath, "dim")
        layers = _field(cfg, cpath, "n_layers")
        heads = _field(cfg, cpath, "n_heads")
        inter = _field(cfg, cpath, "hidden_dim")
        act_name = cfg.get("activation", "gelu")
        maxpos = _field(cfg, cpath, "max_position_embeddings")
        tv, offset, eps = 0, 0, 1e-12
    else:
        hidden = _field(cfg, cpath, "hidden_size")
        layers = _field(cfg, cpath, "num_hidden_layers")
        heads = _field(cfg, cpath, "num_attention_heads")
        inter = _field(cfg, cpath, "intermediate_size")
        act_name = cfg.get("hidden_act", "gelu")
        maxpos = _field(cfg, cpath, "max_position_embeddings")
        tv = _field(cfg, cpath, "type_vocab_size", default=0)
        eps = _field(cfg, cpath, "layer_norm_eps", kind=float, default=1e-12)
        pet = cfg.get("position_embedding_type", "absolute")
        if pet not in (None, "absolute"):
            raise UnsupportedModelError(
                f"{cpath}: position_embedding_type {pet!r} is not supported (only 'absolute')"
            )
        offset = 0
        if arch == "roberta":
            offset = _field(cfg, cpath, "pad_token_id", default=1) + 1
    vocab = _field(cfg, cpath, "vocab_size")
    if not isinstance(act_name, str) or act_name not in _ACTS:
        raise UnsupportedModelError(
            f"{cpath}: activation {act_name!r} is not supported (supported: {sorted(_ACTS)})"
        )
    names = _CONFIG_NAMES["distilbert" if arch == "distilbert" else "bert"]
    sizes = {"hidden": hidden, "layers": layers, "heads": heads, "intermediate": inter}
    sizes.update(vocab_size=vocab, max_positions=maxpos)
    _check_sizes(cpath, sizes, names, offset)
    if hidden % heads:
        raise CheckpointError(
            f"{cpath}: {names['hidden']} {hidden} is not a multiple of {names['heads']} {heads} "
            f"(each attention head takes {names['hidden']} / {names['heads']} dimensions); "
            "fix config.json to describe the checkpoint"
        )
    usable = maxpos - offset
    spec = ModelSpec(
        arch=arch,
        vocab_size=vocab,
        hidden=hidden,
        layers=layers,
        heads=heads,
        intermediate=inter,
        max_positions=usable,
        position_offset=offset,
        type_vocab_size=tv,
        eps=float(eps),
        act=_ACTS[act_name],
        name=folder.resolve().name,
        **head,
    )
    try:
        spec.validate()
    except ValueError as e:
        raise CheckpointError(f"{cpath}: {e}") from None
    return spec


def _new_arch_spec(folder: Path, cfg: dict, arch: str) -> ModelSpec:
    """MPNet / ModernBERT / Electra / ALBERT (zoi.frontend.archs), NomicBERT / GTE
    (zoi.frontend.archs_rotary), the decoder archs, with the same sanity caps."""
    cpath = folder / "config.json"
    # the counts first: a per-layer setting checked against a zero layer count would blame it
    names = _CONFIG_NAMES["bert"]
    counts = {k: _field(cfg, cpath, names[k], default=None) for k in ("hidden", "layers", "heads")}
    _check_sizes(cpath, {k: v for k, v in counts.items() if v is not None}, names)
    if arch in DECODER_ARCHS:
        kw = archs_decoder.spec_fields(arch, cfg, cpath, _field)
    elif arch in ROTARY_ARCHS:  # sets vocab_size (NomicBERT's original pads it)
        kw = archs_rotary.spec_fields(arch, cfg, cpath, _field)
    else:
        kw = arch_spec_fields(arch, cfg, cpath, _field, _ACTS)
    if "vocab_size" not in kw:
        kw["vocab_size"] = _field(cfg, cpath, "vocab_size")
    offset = kw.get("position_offset", 0)
    sizes = {k: kw[k] for k in ("hidden", "layers", "heads", "intermediate", "vocab_size")}
    sizes["max_positions"] = kw["max_positions"] + offset  # the config's own number
    if kw.get("embed_size") or cfg.get("embedding_size") is not None:
        sizes["embed_size"] = kw.get("embed_size") or _field(cfg, cpath, "embedding_size")
    _check_sizes(cpath, sizes, _CONFIG_NAMES["bert"], offset)
    if kw.get("head_size"):  # an explicit head width: hidden need not divide
        pass
    elif kw["hidden"] % kw["heads"]:
        raise CheckpointError(
            f"{cpath}: hidden_size {kw['hidden']} is not a multiple of num_attention_heads "
            f"{kw['heads']} (each attention head takes hidden_size / num_attention_heads "
            "dimensions); fix config.json to describe the checkpoint"
        )
    try:
        spec = ModelSpec(arch=arch, name=folder.resolve().name, **kw)
        spec.validate()
    except ValueError as e:
        raise CheckpointError(f"{cpath}: {e}") from None
    return spec


# sentence-transformers pooling modes: legacy boolean keys and the names of `pooling_mode`
_ST_POOLING_KEYS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}


def _pooling_mode(pcfg: Any, path: Path) -> str:
    """The one pooling mode of a sentence-transformers Pooling config, or a clear refusal.

    sentence-transformers concatenates every enabled mode (mean + mean_sqrt_len_tokens gives
    2H dims); zoi pools exactly one of mean, cls, max, so anything else is refused rather
    than answered with fewer dimensions."""
    if not isinstance(pcfg, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    modes: list[str] = []
    pm = pcfg.get("pooling_mode")  # sentence-transformers >= 6: a name or a list of names
    if isinstance(pm, str):
        modes.append(pm)
    elif isinstance(pm, list) and all(isinstance(x, str) for x in pm):
        modes.extend(pm)
    elif pm is not None:
        raise CheckpointError(f"{path}: pooling_mode should be a name or a list, got {pm!r}")
    modes += [mode for key, mode in _ST_POOLING_KEYS.items() if pcfg.get(key)]
    modes = [
        {"mean_tokens": "mean", "cls_token": "cls", "max_tokens": "max", "lasttoken": "last"}.get(
            m, m
        )
        for m in modes
    ]
    modes = sorted(set(modes), key=modes.index)
    if len(modes) != 1 or modes[0] not in ("mean", "cls", "max", "last"):
        extra = (
            f"; sentence-transformers concatenates them into {len(modes)} x hidden dimensions"
            if len(modes) > 1
            else ""
        )
        raise UnsupportedModelError(
            f"{path}: pooling modes {modes or 'none'}{extra}. zoi supports exactly one of "
            "mean, cls, max, lasttoken; edit the Pooling config to one of them if that is what "
            "you want"
        )
    return modes[0]


def default_pooling(cfg: Any) -> str:
    """The pooling sentence-transformers builds for a plain transformers folder (no
    modules.json): last token for a causal language model (architectures[0] ends with
    ForCausalLM and is_causal is not false), mean for everything else, whatever a
    classification head's own setting (ModernBERT's classifier_pooling) says."""
    archs = cfg.get("architectures") if isinstance(cfg, dict) else None
    first = archs[0] if isinstance(archs, list) and archs else None
    causal_lm = isinstance(first, str) and first.endswith("ForCausalLM")
    return "last" if causal_lm and bool(cfg.get("is_causal", True)) else "mean"


def pooling_origin(folder: str | Path) -> str:
    """Where a model folder's pooling comes from, in words (the compile log, `zoi info`):
    its sentence-transformers Pooling config, or sentence-transformers' default."""
    folder = Path(folder)
    modules_path = folder / "modules.json"
    if modules_path.exists():
        modules = read_json(modules_path, folder)
        for m in modules if isinstance(modules, list) else []:
            if isinstance(m, dict) and str(m.get("type", "")).endswith("Pooling"):
                rel = Path(str(m.get("path", "")) or ".") / "config.json"
                return f"from {rel.as_posix()}"
        why = "modules.json has no Pooling module"
    else:
        why = "no sentence-transformers config in the folder"
    cfg = read_json(folder / "config.json", folder)
    out = f"{why}: sentence-transformers' default for a plain transformers folder"
    cp = cfg.get("classifier_pooling") if isinstance(cfg, dict) else None
    if isinstance(cp, str) and cp != default_pooling(cfg):
        out += f"; config.json's classifier_pooling {cp!r} is the classification head's"
    return out


def _sentence_transformers_options(folder: Path, spec: ModelSpec) -> ModelSpec:
    """Pooling / Normalize / max_seq_length from a sentence-transformers folder, if it is one."""
    modules_path = folder / "modules.json"
    cfg = read_json(folder / "config.json", folder)
    # without a Pooling config, pool as SentenceTransformer(folder) would (never the
    # classification head's own pooling): the same folder gives the same embeddings in both
    pooling, normalize, maxlen = default_pooling(cfg), False, spec.max_positions
    dense: list[tuple] = []
    if modules_path.exists():
        modules = read_json(modules_path, folder)
        if not isinstance(modules, list):
            raise CheckpointError(f"{modules_path}: expected a JSON list of modules")
        head = st_head(folder, modules, cfg, spec.arch)
        # a SparseEncoder folder (MLMTransformer + SpladePooling), a CrossEncoder of a causal
        # LM (Transformer + LogitScore: the last token's logits)
        if head is not None:
            spec = spec.replace(**head)
            pooling = head.get("pooling", pooling)
            modules = []
        for m in modules:
            if not isinstance(m, dict):
                raise CheckpointError(f"{modules_path}: each module should be a JSON object")
            mtype = str(m.get("type", ""))
            if mtype.endswith("Pooling"):
                ppath = inside(folder, str(m.get("path", "")) or ".", modules_path) / "config.json"
                pooling = _pooling_mode(read_json(ppath, folder), ppath)
            elif mtype.endswith("Normalize"):
                normalize = True
            elif mtype.endswith("Dense"):
                dense.append(_dense_module(folder, m, modules_path, dense, spec.hidden))
        st_cfg = folder / "sentence_bert_config.json"
        if st_cfg.exists():
            c = read_json(st_cfg, folder)
            ms = c.get("max_seq_length") if isinstance(c, dict) else None
            if ms is not None:  # null: the model's own limit, as sentence-transformers reads it
                if type(ms) is not int or ms < 2:
                    raise CheckpointError(
                        f"{st_cfg}: max_seq_length is {ms!r}; it must be an integer in "
                        f"[2, {spec.max_positions}] ([CLS] and [SEP] at least; the model's "
                        "positions at most), or null for the model's limit. Fix "
                        "sentence_bert_config.json"
                    )
                maxlen = min(maxlen, ms)
    return spec.replace(
        pooling=pooling, normalize=normalize, max_positions=maxlen, dense=tuple(dense)
    )


# sentence-transformers Dense activations zoi runs (the IR's names); Tanh is its default
_DENSE_ACTS = {
    "torch.nn.modules.linear.Identity": "none",
    "torch.nn.modules.activation.Tanh": "tanh",
    "torch.nn.modules.activation.ReLU": "relu",
    "torch.nn.modules.activation.Sigmoid": "sigmoid",
    "torch.nn.modules.activation.GELU": "gelu",
}


def _dense_module(folder: Path, m: dict, modules_path: Path, before: list, hidden: int) -> tuple:
    """(in, out, bias, act) of a sentence-transformers Dense module after pooling."""
    path = inside(folder, str(m.get("path", "")) or ".", modules_path)
    cpath = path / "config.json"
    c = read_json(cpath, folder)
    if not isinstance(c, dict):
        raise CheckpointError(f"{cpath}: expected a JSON object")
    din = c.get("in_features")
    dout = c.get("out_features")
    width = before[-1][1] if before else hidden
    if type(din) is not int or type(dout) is not int or din != width or not 0 < dout <= 1 << 16:
        raise CheckpointError(
            f"{cpath}: in_features / out_features should be integers, in_features = the width "
            f"before it ({width}), got {din!r} / {dout!r}"
        )
    bias = c.get("bias", True)
    if not isinstance(bias, bool):
        raise CheckpointError(f"{cpath}: bias should be true or false, got {bias!r}")
    for key in ("use_residual",):
        if c.get(key):
            raise UnsupportedModelError(f"{cpath}: {key} true is not supported")
    fn = c.get("activation_function", "torch.nn.modules.activation.Tanh")
    if fn not in _DENSE_ACTS:
        raise UnsupportedModelError(
            f"{cpath}: activation_function {fn!r} is not supported; zoi runs "
            f"{', '.join(sorted(_DENSE_ACTS))}"
        )
    return (din, dout, bias, _DENSE_ACTS[fn])


def load_dense_weights(folder: Path, spec: ModelSpec) -> dict[str, np.ndarray]:
    """dense{k}.w / .b of the Dense modules (their own model.safetensors), in module order."""
    modules_path = folder / "modules.json"
    mods = [
        m
        for m in read_json(modules_path, folder)
        if isinstance(m, dict) and str(m.get("type", "")).endswith("Dense")
    ]
    out: dict[str, np.ndarray] = {}
    for k, (m, (din, dout, bias, _act)) in enumerate(zip(mods, spec.dense, strict=True)):
        path = inside(folder, str(m.get("path", "")) or ".", modules_path)
        wpath = path / "model.safetensors"
        if not wpath.exists():
            extra = (
                " (a PyTorch pickle is never loaded: convert it to safetensors once with "
                "`zoi convert`)"
                if (path / "pytorch_model.bin").exists()
                else ""
            )
            raise CheckpointError(f"{wpath}: file not found{extra}")
        check_file(wpath, folder)
        f = SafetensorsFile(wpath)
        for name, want, key in (
            ("linear.weight", (dout, din), "w"),
            ("linear.bias", (dout,), "b"),
        ):
            if key == "b" and not bias:
                out[f"dense{k}.b"] = np.zeros(dout, np.float32)
                continue
            if name not in f.names():
                raise CheckpointError(f"{wpath}: tensor {name!r} is missing")
            arr = np.asarray(f.get(name), dtype=np.float32)
            if arr.shape != want:
                raise CheckpointError(f"{wpath}: {name} has shape {arr.shape}, expected {want}")
            if not np.isfinite(arr).all():
                raise CheckpointError(f"{wpath}: tensor {name!r} contains NaN or Inf values")
            out[f"dense{k}.{key}"] = arr
    return out


def _weight_files(folder: Path) -> list[Path]:
    single = folder / "model.safetensors"
    index = folder / "model.safetensors.index.json"
    if single.exists():
        check_file(single, folder)
        return [single]
    if index.exists():
        idx = read_json(index, folder)
        wm = idx.get("weight_map") if isinstance(idx, dict) else None
        if not isinstance(wm, dict) or not wm:
            raise CheckpointError(f"{index}: missing or empty 'weight_map'")
        files = []
        for f in wm.values():
            if not isinstance(f, str):
                raise CheckpointError(f"{index}: weight_map values should be file names, got {f!r}")
            p = inside(folder, f, index)
            if p not in files:
                files.append(p)
        for p in files:
            if not p.exists():
                raise CheckpointError(f"{p}: shard named in {index.name} is missing")
            check_file(p, folder)
        return files
    pickles = (
        [p.name for p in folder.glob("*.bin")]
        + [p.name for p in folder.glob("*.pt")]
        + [p.name for p in folder.glob("*.pth")]
    )
    if pickles:
        raise CheckpointError(
            f"{folder}: only pickle weights ({', '.join(sorted(pickles))}) found. zoi loads safetensors only, "
            "because unpickling can execute arbitrary code. Convert once in a trusted environment: "
            "python -c \"from transformers import AutoModel; AutoModel.from_pretrained('DIR').save_pretrained('DIR', safe_serialization=True)\""
        )
    raise CheckpointError(f"{folder}: no model.safetensors (or model.safetensors.index.json) found")


def _mapping(arch: str, layers: int) -> dict[str, list[str]]:
    """canonical name -> list of source names (concatenated along rows for qkv)."""
    m: dict[str, list[str]] = {}
    if arch == "distilbert":
        m["embed.word"] = ["embeddings.word_embeddings.weight"]
        m["embed.pos"] = ["embeddings.position_embeddings.weight"]
        m["embed.ln.w"] = ["embeddings.LayerNorm.weight"]
        m["embed.ln.b"] = ["embeddings.LayerNorm.bias"]
        for i in range(layers):
            p = f"transformer.layer.{i}."
            for t in ("w", "b"):
                s = "weight" if t == "w" else "bias"
                m[f"l{i}.qkv.{t}"] = [p + f"attention.{x}_lin.{s}" for x in "qkv"]
                m[f"l{i}.o.{t}"] = [p + f"attention.out_lin.{s}"]
                m[f"l{i}.ln1.{t}"] = [p + f"sa_layer_norm.{s}"]
                m[f"l{i}.ffn1.{t}"] = [p + f"ffn.lin1.{s}"]
                m[f"l{i}.ffn2.{t}"] = [p + f"ffn.lin2.{s}"]
                m[f"l{i}.ln2.{t}"] = [p + f"output_layer_norm.{s}"]
        return m
    m["embed.word"] = ["embeddings.word_embeddings.weight"]
    m["embed.pos"] = ["embeddings.position_embeddings.weight"]
    m["embed.type"] = ["embeddings.token_type_embeddings.weight"]
    m["embed.ln.w"] = ["embeddings.LayerNorm.weight"]
    m["embed.ln.b"] = ["embeddings.LayerNorm.bias"]
    for i in range(layers):
        p = f"encoder.layer.{i}."
        for t in ("w", "b"):
            s = "weight" if t == "w" else "bias"
            m[f"l{i}.qkv.{t}"] = [p + f"attention.self.{x}.{s}" for x in ("query", "key", "value")]
            m[f"l{i}.o.{t}"] = [p + f"attention.output.dense.{s}"]
            m[f"l{i}.ln1.{t}"] = [p + f"attention.output.LayerNorm.{s}"]
            m[f"l{i}.ffn1.{t}"] = [p + f"intermediate.dense.{s}"]
            m[f"l{i}.ffn2.{t}"] = [p + f"output.dense.{s}"]
            m[f"l{i}.ln2.{t}"] = [p + f"output.LayerNorm.{s}"]
    return m


def expected_shapes(spec: ModelSpec) -> dict[str, tuple[int, ...]]:
    if spec.arch in DECODER_ARCHS:  # an LLM reranker's score rows beside the layers
        return {**archs_decoder.expected_shapes(spec), **head_shapes(spec)}
    if spec.arch in NEW_ARCHS:
        return arch_expected_shapes(spec)
    if spec.arch in ROTARY_ARCHS:
        return archs_rotary.expected_shapes(spec)
    H, I, L = spec.hidden, spec.intermediate, spec.layers
    s: dict[str, tuple[int, ...]] = {
        "embed.word": (spec.vocab_size, H),
        "embed.pos": (spec.max_positions + spec.position_offset, H),
        "embed.ln.w": (H,),
        "embed.ln.b": (H,),
    }
    if spec.type_vocab_size:
        s["embed.type"] = (spec.type_vocab_size, H)
    s.update(head_shapes(spec))
    for i in range(L):
        s.update(
            {
                f"l{i}.qkv.w": (3 * H, H),
                f"l{i}.qkv.b": (3 * H,),
                f"l{i}.o.w": (H, H),
                f"l{i}.o.b": (H,),
                f"l{i}.ln1.w": (H,),
                f"l{i}.ln1.b": (H,),
                f"l{i}.ffn1.w": (I, H),
                f"l{i}.ffn1.b": (I,),
                f"l{i}.ffn2.w": (H, I),
                f"l{i}.ffn2.b": (H,),
                f"l{i}.ln2.w": (H,),
                f"l{i}.ln2.b": (H,),
            }
        )
    return s


def _find_prefix(names: list[str], anchor: str) -> str:
    for n in names:
        if n.endswith(anchor) and (n == anchor or n[: -len(anchor)].endswith(".")):
            return n[: -len(anchor)]
    return ""


def _legacy(name: str) -> list[str]:
    return [
        name,
        name.replace("LayerNorm.weight", "LayerNorm.gamma").replace(
            "LayerNorm.bias", "LayerNorm.beta"
        ),
    ]


def load_weights(folder: Path, spec: ModelSpec) -> dict[str, np.ndarray]:
    files = [SafetensorsFile(p) for p in _weight_files(folder)]
    where: dict[str, SafetensorsFile] = {}
    real: dict[str, str] = {}  # a name read under another name -> the file's name
    for f in files:
        for n in f.names():
            where[n] = f
            if n.endswith(PARAM):  # a module with torch parametrizations (jina's adapters)
                alias = n[: -len(PARAM)] + ".weight"
                where[alias], real[alias] = f, n
    names = list(where)
    optional: set[str] = set()
    if spec.arch in DECODER_ARCHS:
        mapping, optional = archs_decoder.mapping(spec, {})
        shapes = archs_decoder.source_shapes(spec)
    elif spec.arch in NEW_ARCHS:
        cfg = read_json(folder / "config.json", folder)
        mapping, optional = arch_mapping(spec, cfg)
        shapes = source_shapes(spec)
    elif spec.arch in ROTARY_ARCHS:  # the names tell the layout (the hub's or transformers')
        mapping, optional = archs_rotary.mapping(spec, names)
        shapes = archs_rotary.source_shapes(spec)
    else:
        mapping, shapes = _mapping(spec.arch, spec.layers), expected_shapes(spec)
    prefix = _find_prefix(names, mapping["embed.word"][0])
    # max positions in the table may exceed what the tokenizer limit uses: keep the whole table
    out: dict[str, np.ndarray] = {}
    for canon, sources in mapping.items():
        if canon == "embed.type" and not spec.type_vocab_size:
            continue
        if canon in optional and not any(c in where for c in _legacy(prefix + sources[0])):
            continue  # a bias the config leaves out (zero, zoi.frontend.archs.derive)
        parts = []
        for src in sources:
            found = None
            for cand in _legacy(prefix + src):
                if cand in where:
                    found = cand
                    break
            if found is None:
                raise CheckpointError(
                    f"{folder}: tensor {prefix + src!r} is missing from the safetensors file(s) "
                    f"({', '.join(p.path.name for p in files)}); is this a complete {spec.arch} checkpoint?"
                )
            f = where[found]
            dtype, _ = f.meta(real.get(found, found))
            if dtype not in ("F32", "F16", "BF16", "F64"):
                raise CheckpointError(
                    f"{f.path}: tensor {found!r} has dtype {dtype}; expected F32, F16 or BF16"
                )
            parts.append(f.get(real.get(found, found)))
        arr = parts[0] if len(parts) == 1 else np.concatenate(parts, axis=0)
        want = shapes[canon]
        if canon == "embed.pos":
            if arr.ndim != 2 or arr.shape[1] != want[1] or arr.shape[0] < want[0]:
                raise CheckpointError(
                    f"{folder}: {sources[0]!r} has shape {arr.shape}, expected at least {want}"
                )
        elif arr.shape != want:
            raise CheckpointError(
                f"{folder}: {', '.join(prefix + s for s in sources)} has shape {arr.shape}, expected {want} from config.json"
            )
        arr = np.asarray(arr, dtype=np.float32)
        if not np.isfinite(arr).all():
            raise CheckpointError(
                f"{folder}: tensor {prefix + sources[0]!r} contains NaN or Inf values"
            )
        out[canon] = arr
    if spec.dense:
        out.update(load_dense_weights(folder, spec))
    if spec.arch in DECODER_ARCHS:
        out = archs_decoder.derive(spec, out)
        if spec.score_tokens:  # an LLM reranker: the LM head's rows of its tokens
            cfg = read_json(folder / "config.json", folder)
            out.update(load_score_rows(folder, spec, cfg, where, prefix))
        return out
    if spec.arch in NEW_ARCHS:
        return derive(spec, out)
    if spec.arch in ROTARY_ARCHS:
        return archs_rotary.derive(spec, out)
    out.update(load_head_weights(folder, spec, lambda n: where[n].get(n), set(names), prefix))
    return out


def load_spec(path: str | Path) -> ModelSpec:
    folder = Path(path)
    if not folder.is_dir():
        raise CheckpointError(f"{folder}: not a directory (expected a Hugging Face model folder)")
    spec = _spec_from_config(folder, read_json(folder / "config.json", folder))
    return _sentence_transformers_options(folder, spec)


def load_checkpoint(
    path: str | Path, task: str | None = None
) -> tuple[ModelSpec, dict[str, np.ndarray], Path]:
    """Load a Hugging Face folder. Returns (spec, canonical float32 weights, tokenizer.json path).
    task: None (what the folder is) or "rerank" (a *ForCausalLM folder as an LLM reranker:
    zoi.frontend.heads.apply_task)."""
    folder = Path(path)
    spec = load_spec(folder)
    tok = folder / "tokenizer.json"
    if not tok.exists():
        raise CheckpointError(
            f"{tok}: file not found; zoi needs the fast tokenizer file (save it with "
            "AutoTokenizer.from_pretrained(DIR).save_pretrained(DIR))"
        )
    check_file(tok, folder)
    spec = apply_task(folder, spec, task, tok)
    weights = load_weights(folder, spec)
    if spec.arch == "jina_v3":  # its task LoRA adapters, when the folder has them
        spec, lora = _load_adapters(folder, spec)
        weights.update(lora)
    return spec, weights, tok


def _load_adapters(folder: Path, spec: ModelSpec) -> tuple[ModelSpec, dict[str, np.ndarray]]:
    files = [SafetensorsFile(p) for p in _weight_files(folder)]
    where = {n: f for f in files for n in f.names()}
    cfg = read_json(folder / "config.json", folder)
    return load_adapters(spec, cfg, folder / "config.json", list(where), lambda n: where[n].get(n))
