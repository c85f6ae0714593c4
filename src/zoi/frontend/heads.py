"""Task heads of a Hugging Face folder: which head, its labels, its weights.

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

LLM rerankers (Qwen3-Reranker and the like): a causal LM whose score of a (query, document)
pair is read from the last token's logits, `logit[true] - logit[false]`, as
sentence-transformers' LogitScore module computes it. A CrossEncoder folder (modules.json:
Transformer + LogitScore, whose config names the tokens), or a plain *ForCausalLM folder
compiled with task="rerank" (the tokenizer's "yes" / "no", as CrossEncoder picks them), gives
a seq_cls head with `score_tokens`: `head.out.w` holds only the LM head's rows of those tokens
(`lm_head.weight`, or `embed_tokens` when tie_word_embeddings), never the [vocab, hidden] table.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from zoi.errors import CheckpointError, UnsupportedModelError
from zoi.frontend.spec import DECODER_ARCHS

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
    splade head; a CrossEncoder of a causal LM (Transformer + LogitScore): the LLM reranker
    head (score_tokens); None when the folder is another kind (embeddings)."""
    types = [str(m.get("type", "")) for m in modules if isinstance(m, dict)]
    if any(t.endswith("LogitScore") for t in types):
        return _logit_score_head(folder, modules, types, cfg, arch)
    if not any(t.endswith("SpladePooling") for t in types):
        return None
    from zoi.frontend.paths import read_json

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


# ---- LLM rerankers (score_tokens) -----------------------------------------------------------
# the true / false tokens CrossEncoder takes for a plain *ForCausalLM folder
DEFAULT_SCORE_TOKENS = ("yes", "no")


def _head_fn(folder: Path, cfg: dict) -> str:
    """predict's default activation as CrossEncoder reads it: config_sentence_transformers.json
    `activation_fn` (sentence-transformers 5+), else config.json's `sentence_transformers`
    block; "" (sigmoid for one score) when neither names one."""
    from zoi.frontend.paths import read_json

    where, fn = None, None
    p = folder / "config_sentence_transformers.json"
    if p.is_file():
        c = read_json(p, folder)
        fn = c.get("activation_fn") if isinstance(c, dict) else None
        where = p
    if fn is None:
        st = cfg.get("sentence_transformers")
        fn = st.get("activation_fn") if isinstance(st, dict) else None
        fn = fn or cfg.get("sbert_ce_default_activation_function")
        where = folder / "config.json"
    if fn is None:
        return ""
    if fn not in _ACT_FNS:
        raise UnsupportedModelError(
            f"{where}: activation_fn {fn!r} is not supported; zoi applies "
            f"{', '.join(sorted(_ACT_FNS))} (predict(activation_fn=...) takes a callable "
            "for anything else)"
        )
    return _ACT_FNS[fn]


def _causal_lm(cfg: dict) -> bool:
    archs = cfg.get("architectures")
    return isinstance(archs, list) and any(
        isinstance(a, str) and a.endswith("ForCausalLM") for a in archs
    )


def _logit_score_head(folder: Path, modules: list, types: list[str], cfg: dict, arch: str) -> dict:
    """The LLM reranker head of a CrossEncoder folder: Transformer (text-generation) + LogitScore."""
    from zoi.frontend.paths import inside, read_json

    mpath = folder / "modules.json"
    for t in types:
        if not t.endswith(("Transformer", "LogitScore")):
            raise UnsupportedModelError(
                f"{mpath}: module {t!r} beside LogitScore is not supported; zoi runs a "
                "CrossEncoder of a causal LM as Transformer + LogitScore"
            )
    if not _causal_lm(cfg) or arch not in DECODER_ARCHS:
        raise UnsupportedModelError(
            f"{folder / 'config.json'}: LogitScore reads a causal language model's logits, but "
            f"architectures is {cfg.get('architectures')!r}; zoi runs it on a *ForCausalLM "
            f"checkpoint of {', '.join(DECODER_ARCHS)} (save that checkpoint with the "
            "CrossEncoder)"
        )
    m = next(m for m in modules if str(m.get("type", "")).endswith("LogitScore"))
    cpath = inside(folder, str(m.get("path", "")) or ".", mpath) / "config.json"
    c = read_json(cpath, folder) if cpath.is_file() else None
    if not isinstance(c, dict):
        raise CheckpointError(
            f"{cpath}: LogitScore needs its config (true_token_id, false_token_id); save the "
            "CrossEncoder again with sentence-transformers"
        )
    true_id, false_id = c.get("true_token_id"), c.get("false_token_id")
    name = c.get("module_input_name", "causal_logits")
    if name != "causal_logits":
        raise UnsupportedModelError(
            f"{cpath}: module_input_name {name!r} is not supported; zoi reads the causal LM's "
            "logits ('causal_logits')"
        )
    ids = (true_id,) if false_id is None else (true_id, false_id)
    if any(type(t) is not int or t < 0 for t in ids):
        raise CheckpointError(
            f"{cpath}: true_token_id / false_token_id should be token ids (integers >= 0; "
            f"false_token_id may be null), got {true_id!r} / {false_id!r}"
        )
    return llm_head(ids, _head_fn(folder, cfg))


def llm_head(ids: tuple[int, ...], head_fn: str = "") -> dict[str, Any]:
    """The ModelSpec fields of an LLM reranker scoring with the tokens `ids` (true[, false])."""
    return {
        "head": "seq_cls",
        "head_act": "",
        "labels": ("LABEL_0",),
        "head_fn": head_fn,
        "score_tokens": tuple(int(i) for i in ids),
        "pooling": "last",
    }


TASKS = ("rerank",)  # compile's `task` (None: what the folder says it is)


def apply_task(folder: Path, spec, task: str | None, tokenizer_json: Path):
    """The spec compiled for `task` (zoi.compile(path, task=...)): "rerank" makes a causal LM
    an LLM reranker (rerank_task); None keeps the folder's own head."""
    if task is None:
        return spec
    if task not in TASKS:
        raise ValueError(f"task must be one of {', '.join(map(repr, TASKS))} or None, got {task!r}")
    from zoi.frontend.paths import read_json

    extra = rerank_task(folder, spec, read_json(folder / "config.json", folder), tokenizer_json)
    if not extra:
        return spec
    out = spec.replace(**extra)
    try:
        out.validate()
    except ValueError as e:
        raise CheckpointError(f"{folder}: {e}") from None
    return out


def rerank_task(folder: Path, spec, cfg: dict, tokenizer_json: Path) -> dict[str, Any]:
    """task="rerank": the spec fields that make `spec` an LLM reranker. A plain *ForCausalLM
    folder scores with its tokenizer's "yes" / "no" tokens, as CrossEncoder(folder) does; a
    model that is a one-label reranker already stays as it is ({})."""
    if spec.head == "seq_cls" and spec.num_labels == 1:
        return {}
    if spec.head or spec.arch not in DECODER_ARCHS or not _causal_lm(cfg):
        what = f"a {spec.head} head" if spec.head else f"architectures {cfg.get('architectures')}"
        raise UnsupportedModelError(
            f"{folder}: task='rerank' makes a reranker of a causal language model (a "
            f"*ForCausalLM folder of {', '.join(DECODER_ARCHS)}) or keeps a one-label "
            f"cross-encoder; this folder has {what}. Compile it without task"
        )
    if (folder / "modules.json").is_file():
        raise UnsupportedModelError(
            f"{folder / 'modules.json'}: task='rerank' on a sentence-transformers embedding "
            "folder; compile the plain *ForCausalLM folder (without modules.json), or save "
            "the reranker as a CrossEncoder (its LogitScore module names the tokens)"
        )
    from tokenizers import Tokenizer as HFTokenizer

    try:
        tok = HFTokenizer.from_file(str(tokenizer_json))
    except Exception as e:  # tokenizers raises its own Exception type
        raise CheckpointError(f"{tokenizer_json}: not a valid tokenizer.json ({e})") from e
    ids = [tok.token_to_id(t) for t in DEFAULT_SCORE_TOKENS]
    missing = [t for t, i in zip(DEFAULT_SCORE_TOKENS, ids, strict=True) if i is None]
    if missing:
        raise UnsupportedModelError(
            f"{tokenizer_json}: the tokenizer has no {' / '.join(map(repr, missing))} token, "
            "which an LLM reranker without a LogitScore config scores with (logit['yes'] - "
            "logit['no'], as sentence-transformers' CrossEncoder). Save the model as a "
            "CrossEncoder whose LogitScore module names its true / false token ids"
        )
    return llm_head(tuple(ids), _head_fn(folder, cfg))


def _tied(spec, cfg: dict) -> bool:
    t = cfg.get("tie_word_embeddings")
    if t is None:  # transformers' default per architecture
        return spec.arch == "gemma3"
    return bool(t)


def load_score_rows(
    folder: Path, spec, cfg: dict, where: dict, prefix: str
) -> dict[str, np.ndarray]:
    """head.out.w [n, H]: the LM head's rows of the score tokens (embed_tokens' rows when the
    embeddings are tied: Gemma3's unscaled table, as its LM head reads it), head.out.b zeros.
    Only those rows are read from the memory-mapped file."""
    if not spec.score_tokens:
        return {}
    names = [prefix + "embed_tokens.weight"] if _tied(spec, cfg) else ["lm_head.weight"]
    found = next((n for n in names if n in where), None)
    if found is None:
        raise CheckpointError(
            f"{folder}: the LM head {names[0]!r} is missing from the safetensors file(s) "
            f"(config.json tie_word_embeddings is {cfg.get('tie_word_embeddings')!r}); an LLM "
            "reranker reads its score from that table: save the *ForCausalLM checkpoint whole"
        )
    f = where[found]
    dtype, shape = f.meta(found)
    H, V = spec.hidden, spec.vocab_size
    if tuple(shape) != (V, H):
        raise CheckpointError(
            f"{folder}: {found!r} has shape {tuple(shape)}, expected [{V}, {H}] (config.json "
            "vocab_size, hidden_size)"
        )
    if dtype not in ("F32", "F16", "BF16", "F64"):
        raise CheckpointError(f"{f.path}: tensor {found!r} has dtype {dtype}; expected a float")
    bad = [t for t in spec.score_tokens if t >= V]
    if bad:
        raise CheckpointError(
            f"{folder}: score token ids {bad} are outside the vocabulary of {V} (config.json "
            "vocab_size); the LogitScore config (true_token_id / false_token_id) does not "
            "belong to this model"
        )
    rows = _rows(f, found, list(spec.score_tokens))
    if not np.isfinite(rows).all():
        raise CheckpointError(f"{folder}: the score rows of {found!r} contain NaN or Inf values")
    return {"head.out.w": rows, "head.out.b": np.zeros(len(rows), np.float32)}


def _rows(f, name: str, idx: list[int]) -> np.ndarray:
    """Rows `idx` of a 2-D tensor as float32, read from the mapped file alone (a BF16 table is
    not widened whole: get() would)."""
    dtype, shape = f.meta(name)
    if dtype != "BF16":
        return np.asarray(f.get(name, float32=False)[idx], dtype=np.float32)
    _, _, begin, end = f._info[name]  # the frontend's own reader: the raw bytes of the table
    raw = np.frombuffer(f._map()[begin:end], dtype=np.uint16).reshape(shape)
    return (raw[idx].astype(np.uint32) << 16).view(np.float32)


def head_shapes(spec) -> dict[str, tuple[int, ...]]:
    H, NL, V = spec.hidden, spec.num_labels, spec.vocab_size
    if spec.score_tokens:
        n = len(spec.score_tokens)
        return {"head.out.w": (n, H), "head.out.b": (n,)}
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
