"""Task heads of a Hugging Face folder (issue 20): which head, its labels, its weights.

Supported (`config.json` `architectures`, the first `*For*` entry decides):

| architectures | head | zoi weights |
|---|---|---|
| BertForSequenceClassification | seq_cls, pooler dense + tanh on [CLS], classifier | head.dense, head.out |
| (XLM)RobertaForSequenceClassification | seq_cls, classifier.dense + tanh on <s>, out_proj | head.dense, head.out |
| DistilBertForSequenceClassification | seq_cls, pre_classifier + relu, classifier | head.dense, head.out |
| *ForTokenClassification | token_cls, classifier on every token | head.out |
| *ForMaskedLM (+ SpladePooling) | splade: transform dense + act + LayerNorm, decoder (tied) | mlm.dense, mlm.ln, mlm.dec |

A *ForMaskedLM checkpoint compiles to the SPLADE head (`log1p(relu(logits))` max-pooled
over the tokens): zoi has no fill-mask API. Anything else `*For*` (QuestionAnswering,
MultipleChoice, PreTraining, CausalLM ...) is refused with the field named.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from zoi.errors import CheckpointError, UnsupportedModelError

_TASKS = {
    "ForSequenceClassification": "seq_cls",
    "ForTokenClassification": "token_cls",
    "ForMaskedLM": "splade",
}
_ACT_FNS = {
    "torch.nn.modules.activation.Sigmoid": "sigmoid",
    "torch.nn.modules.linear.Identity": "identity",
    "torch.nn.modules.activation.Softmax": "softmax",
}
_MLM_ACTS = {
    "gelu": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "relu": "relu",
}


def _labels(cfg: dict, cpath: Path) -> tuple[str, ...]:
    id2 = cfg.get("id2label")
    n = cfg.get("num_labels")
    if isinstance(id2, dict) and id2:
        try:
            items = sorted((int(k), str(v)) for k, v in id2.items())
        except (TypeError, ValueError):
            raise CheckpointError(
                f"{cpath}: id2label keys must be integers, got {list(id2)[:5]}"
            ) from None
        if [k for k, _ in items] != list(range(len(items))):
            raise CheckpointError(
                f"{cpath}: id2label keys must be 0..n-1, got {[k for k, _ in items]}"
            )
        return tuple(v for _, v in items)
    if isinstance(n, int) and not isinstance(n, bool) and n >= 1:
        return tuple(f"LABEL_{i}" for i in range(n))
    return ("LABEL_0", "LABEL_1")  # transformers' default num_labels


def head_from_config(folder: Path, cfg: dict, arch: str) -> dict[str, Any]:
    """The head fields of ModelSpec (head, head_act, labels, head_fn) for a config.json; {}
    for a base model (or a sentence-transformers folder, whose modules decide: st_head)."""
    cpath = folder / "config.json"
    archs = cfg.get("architectures")
    if not isinstance(archs, list) or (folder / "modules.json").exists():
        return {}
    heads = [a for a in archs if isinstance(a, str) and "For" in a]
    if not heads:
        return {}
    name = heads[0]
    task = next((t for suffix, t in _TASKS.items() if name.endswith(suffix)), None)
    if task is None:
        raise UnsupportedModelError(
            f"{cpath}: architectures {heads}: the task head {name!r} is not supported. zoi runs "
            "*ForSequenceClassification (cross-encoders, classifiers), *ForTokenClassification "
            "(NER), *ForMaskedLM (SPLADE sparse vectors) and base models (embeddings); use the "
            "base model's checkpoint for embeddings"
        )
    if task == "seq_cls":
        labels = _labels(cfg, cpath)
        st = cfg.get("sentence_transformers")
        fn_path = st.get("activation_fn") if isinstance(st, dict) else None
        fn_path = fn_path or cfg.get("sbert_ce_default_activation_function")
        head_fn = _ACT_FNS.get(fn_path, "") if isinstance(fn_path, str) else ""
        return {
            "head": "seq_cls",
            "head_act": "relu" if arch == "distilbert" else "tanh",
            "labels": labels,
            "head_fn": head_fn,
        }
    if task == "token_cls":
        return {"head": "token_cls", "labels": _labels(cfg, cpath)}
    return {"head": "splade", "head_act": _mlm_act(cfg, arch, cpath)}


def _mlm_act(cfg: dict, arch: str, cpath: Path) -> str:
    if arch == "roberta":
        return "gelu"  # RobertaLMHead: gelu whatever hidden_act says
    name = cfg.get("activation" if arch == "distilbert" else "hidden_act", "gelu")
    if name not in _MLM_ACTS:
        raise UnsupportedModelError(f"{cpath}: MLM head activation {name!r} is not supported")
    return _MLM_ACTS[name]


def st_head(folder: Path, modules: list, cfg: dict, arch: str) -> dict[str, Any] | None:
    """A sentence-transformers SparseEncoder folder (MLMTransformer + SpladePooling): the
    splade head; None when the folder is another kind (embeddings)."""
    types = [str(m.get("type", "")) for m in modules if isinstance(m, dict)]
    if not any(t.endswith("SpladePooling") for t in types):
        return None
    from zoi.frontend.checkpoint import read_json

    m = next(m for m in modules if str(m.get("type", "")).endswith("SpladePooling"))
    ppath = folder / str(m.get("path", "")) / "config.json"
    pc = read_json(ppath, folder) if ppath.exists() else {}
    strat = pc.get("pooling_strategy", "max")
    act = pc.get("activation_function", "relu")
    if strat != "max" or act != "relu":
        raise UnsupportedModelError(
            f"{ppath}: SpladePooling pooling_strategy={strat!r}, activation_function={act!r}; "
            "zoi runs pooling_strategy 'max' with activation_function 'relu' (SPLADE v2 and later)"
        )
    for t in types:
        if not t.endswith(("Transformer", "SpladePooling")):
            raise UnsupportedModelError(
                f"{folder / 'modules.json'}: module {t!r} after SPLADE pooling is not supported"
            )
    return {"head": "splade", "head_act": _mlm_act(cfg, arch, folder / "config.json")}


def head_shapes(spec) -> dict[str, tuple[int, ...]]:
    H, NL, V = spec.hidden, spec.num_labels, spec.vocab_size
    if spec.head == "seq_cls":
        return {
            "head.dense.w": (H, H),
            "head.dense.b": (H,),
            "head.out.w": (NL, H),
            "head.out.b": (NL,),
        }
    if spec.head == "token_cls":
        return {"head.out.w": (NL, H), "head.out.b": (NL,)}
    if spec.head == "splade":
        return {
            "mlm.dense.w": (H, H),
            "mlm.dense.b": (H,),
            "mlm.ln.w": (H,),
            "mlm.ln.b": (H,),
            "mlm.dec.w": (V, H),
            "mlm.dec.b": (V,),
        }
    return {}


def _sources(spec, prefix: str) -> dict[str, list[str]]:
    """canonical head weight -> candidate source names, first found wins."""
    a = spec.arch
    if spec.head == "seq_cls":
        if a == "bert":
            dense, out = [prefix + "pooler.dense"], ["classifier"]
        elif a == "roberta":
            dense, out = ["classifier.dense"], ["classifier.out_proj"]
        else:
            dense, out = ["pre_classifier"], ["classifier"]
        m = {"head.dense": dense, "head.out": out}
    elif spec.head == "token_cls":
        m = {"head.out": ["classifier"]}
    else:
        if a == "bert":
            m = {
                "mlm.dense": ["cls.predictions.transform.dense"],
                "mlm.ln": ["cls.predictions.transform.LayerNorm"],
                "mlm.dec": ["cls.predictions.decoder"],
            }
        elif a == "roberta":
            m = {
                "mlm.dense": ["lm_head.dense"],
                "mlm.ln": ["lm_head.layer_norm"],
                "mlm.dec": ["lm_head.decoder"],
            }
        else:
            m = {
                "mlm.dense": ["vocab_transform"],
                "mlm.ln": ["vocab_layer_norm"],
                "mlm.dec": ["vocab_projector"],
            }
    out = {}
    for canon, srcs in m.items():
        out[canon + ".w"] = [s + ".weight" for s in srcs]
        out[canon + ".b"] = [s + ".bias" for s in srcs]
    if spec.head == "splade":  # the decoder bias lives beside it; the weight is tied to the words
        out["mlm.dec.b"] += {"bert": ["cls.predictions.bias"], "roberta": ["lm_head.bias"]}.get(
            a, []
        )
        out["mlm.dec.w"] += [prefix + "embeddings.word_embeddings.weight"]
        out["mlm.ln.w"] += [s.replace(".weight", ".gamma") for s in out["mlm.ln.w"]]
        out["mlm.ln.b"] += [s.replace(".bias", ".beta") for s in out["mlm.ln.b"]]
    return out


def load_head_weights(
    folder: Path, spec, get, names: set[str], prefix: str
) -> dict[str, np.ndarray]:
    """The head's weights in zoi's names; get(name) reads a tensor as float32."""
    if not spec.head:
        return {}
    shapes = head_shapes(spec)
    out: dict[str, np.ndarray] = {}
    for canon, cands in _sources(spec, prefix).items():
        found = next((c for c in cands if c in names), None)
        if found is None:
            raise CheckpointError(
                f"{folder}: the {spec.head} head needs tensor {cands[0]!r}, missing from the "
                "safetensors file(s); is the checkpoint complete (saved with save_pretrained)?"
            )
        arr = np.asarray(get(found), dtype=np.float32)
        if arr.shape != shapes[canon]:
            raise CheckpointError(
                f"{folder}: {found!r} has shape {arr.shape}, expected {shapes[canon]} (num_labels "
                f"{spec.num_labels} from config.json id2label)"
            )
        if not np.isfinite(arr).all():
            raise CheckpointError(f"{folder}: tensor {found!r} contains NaN or Inf values")
        out[canon] = arr
    return out
