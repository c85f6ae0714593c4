"""Multi-vector (ColBERT) and lexical (sparse) heads beside an encoder (docs/MULTIVECTOR.md).

| folder | kind | what zoi reads |
|---|---|---|
| BGE-M3 (FlagEmbedding): `sparse_linear` / `colbert_linear` beside the encoder | bge-m3 | `*.safetensors` (`weight`, `bias`): sparse [1, H], colbert [D, H] |
| PyLate / sentence-transformers ColBERT: Transformer + Dense modules, PyLate's keys in config_sentence_transformers.json | colbert | the Dense modules' safetensors; query_prefix, document_prefix, query_length, document_length, do_query_expansion, attend_to_expansion_tokens, skiplist_words |
| Stanford ColBERT (`architectures` HF_ColBERT) | colbert | `linear.weight` [D, H] of the model file; artifact.metadata |

The encoder compiles as an embedding model: its graph ends in a pool whose input, the last
hidden state, every head-running backend hands back (a tap), so one forward gives the pooled
vector and the token states. The heads are a few small linears that zoi.heads.multivector
applies on the host to those token states, in FP32 whatever the encoder's precision. Their
weights travel in the artifact as `mv.sparse.w` / `.b` and `mv.colbert{k}.w` / `.b`, and what
they mean in its meta (`multivector`, checked by `config_from_meta` at every load).

Only safetensors are read. BGE-M3 publishes its heads as PyTorch pickles (`*.pt`); unpickling
can run code, so a folder holding one without its safetensors twin is refused, naming the
one-time conversion `zoi convert FOLDER` (zoi.frontend.convert).
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from zoi.errors import CheckpointError, UnsupportedModelError
from zoi.frontend.paths import check_file, inside
from zoi.frontend.safetensors_io import SafetensorsFile

KINDS = ("bge-m3", "colbert")
OUTPUTS = ("dense", "sparse", "colbert")
M3_FILES = {"sparse": "sparse_linear", "colbert": "colbert_linear"}
PICKLE_SUFFIXES = (".pt", ".pth", ".bin")
# the activations a ColBERT projection may end in (sentence-transformers / PyLate Dense)
LAYER_ACTS = ("none", "tanh", "relu", "sigmoid", "gelu", "gelu_tanh")
# PyLate's defaults where its config leaves a key out (pylate.models.ColBERT)
PYLATE_DEFAULTS = {
    "query_prefix": "[Q] ",
    "document_prefix": "[D] ",
    "query_length": 32,
    "document_length": 180,
    "do_query_expansion": True,
    "attend_to_expansion_tokens": False,
}
PYLATE_KEYS = (*PYLATE_DEFAULTS, "skiplist_words")
# BGE-M3's combined score (FlagEmbedding compute_score): dense, sparse, colbert; the model
# card's weights (FlagEmbedding's own default is [1, 1, 1]); divided by their sum
M3_WEIGHTS = (0.4, 0.2, 0.4)


@dataclass
class MultiVectorModel:
    """What load_multivector gives compile: the encoder's spec and weights (a ColBERT folder's
    projection taken out of its Dense modules), the heads' weights and the artifact's meta."""

    spec: object
    weights: dict[str, np.ndarray]
    heads: dict[str, np.ndarray]
    meta: dict


@dataclass(frozen=True)
class MultiVectorConfig:
    """The validated `multivector` meta of an artifact (docs/MULTIVECTOR.md)."""

    kind: str
    sparse: bool = False
    layers: tuple = ()  # ColBERT projection: (act, out) per layer; () = no ColBERT head
    skip_first: int = 0  # tokens left out of the ColBERT vectors at the start (BGE-M3: [CLS])
    sparse_skip_ids: tuple = ()
    maxsim: str = "mean"  # ColBERT score over the query vectors: mean (BGE-M3) or sum
    query_marker: int | None = None
    document_marker: int | None = None
    query_length: int = 0  # 0: the model's positions (BGE-M3)
    document_length: int = 0
    query_expansion: bool = False
    attend_to_expansion: bool = False
    mask_id: int | None = None
    document_skip_ids: tuple = ()
    source: str = ""

    @property
    def outputs(self) -> tuple[str, ...]:
        out = ["dense"] if self.kind == "bge-m3" else []
        if self.sparse:
            out.append("sparse")
        if self.layers:
            out.append("colbert")
        return tuple(out)

    @property
    def colbert_dim(self) -> int:
        return int(self.layers[-1][1]) if self.layers else 0


# ---- compile: what the folder is -------------------------------------------------------------
def load_multivector(folder, spec, weights: dict, tokenizer_json) -> MultiVectorModel | None:
    """The multi-vector / sparse heads of `folder` (None: a plain model). Refuses a BGE-M3
    head kept only as a pickle, naming `zoi convert`."""
    folder = Path(folder)
    m3 = _m3_files(folder)
    colbert = _colbert_source(folder)
    if m3 and colbert:
        raise UnsupportedModelError(
            f"{folder}: both BGE-M3 heads ({', '.join(p.name for p in m3.values())}) and a "
            f"{colbert} ColBERT configuration; zoi runs one of them. Remove the one the model "
            "was not trained with"
        )
    if not m3 and not colbert:
        return None
    if spec.head:
        raise UnsupportedModelError(
            f"{folder}: multi-vector / sparse heads beside a {spec.head} task head; zoi runs "
            "them on an embedding model's encoder"
        )
    tok = _hf_tokenizer(tokenizer_json)
    if m3:
        return _bge_m3(folder, spec, weights, tok, m3)
    return _colbert(folder, spec, weights, tok, colbert)


def pickle_message(pickle: Path, target: Path) -> str:
    folder = pickle.parent
    return (
        f"{pickle}: a PyTorch pickle, which zoi never loads (unpickling can run arbitrary "
        f"code). Convert it once: `zoi convert {folder}` reads it with torch's weights_only "
        f"loader in a separate process and writes {target.name} beside it; then compile again"
    )


def _m3_files(folder: Path) -> dict[str, Path]:
    found: dict[str, Path] = {}
    for head, stem in M3_FILES.items():
        st = folder / f"{stem}.safetensors"
        if st.exists():
            found[head] = st
            continue
        for suffix in PICKLE_SUFFIXES:
            p = folder / f"{stem}{suffix}"
            if p.exists():
                raise CheckpointError(pickle_message(p, st))
    return found


def _colbert_source(folder: Path) -> str | None:
    """The kind of ColBERT folder: "stanford" (architectures HF_ColBERT), "pylate" (PyLate's
    keys or model_type ColBERT in config_sentence_transformers.json), else None."""
    from zoi.frontend.checkpoint import read_json

    cfg = read_json(folder / "config.json", folder) if (folder / "config.json").is_file() else {}
    archs = cfg.get("architectures") if isinstance(cfg, dict) else None
    if isinstance(archs, list) and "HF_ColBERT" in archs:
        return "stanford"
    p = folder / "config_sentence_transformers.json"
    if p.is_file():
        c = read_json(p, folder)
        if isinstance(c, dict) and (
            str(c.get("model_type", "")).lower() == "colbert" or any(k in c for k in PYLATE_KEYS)
        ):
            return "pylate"
    return None


def _hf_tokenizer(tokenizer_json):
    from tokenizers import Tokenizer as HFTokenizer

    try:
        return HFTokenizer.from_file(str(tokenizer_json))
    except Exception as e:  # tokenizers raises its own Exception type
        raise CheckpointError(f"{tokenizer_json}: not a valid tokenizer.json ({e})") from e


def _special_names(folder: Path) -> dict[str, str]:
    """The tokenizer's named special tokens (cls_token, eos_token, ...): special_tokens_map.json,
    then tokenizer_config.json, as transformers' tokenizer reports them."""
    from zoi.frontend.checkpoint import read_json

    names: dict[str, str] = {}
    for fname in ("special_tokens_map.json", "tokenizer_config.json"):
        p = folder / fname
        if not p.is_file():
            continue
        c = read_json(p, folder)
        if not isinstance(c, dict):
            continue
        for key, v in c.items():
            if not key.endswith("_token"):
                continue
            if isinstance(v, dict):
                v = v.get("content")
            if isinstance(v, str) and v:
                names.setdefault(key, v)
    return names


# transformers' defaults where a folder names no special tokens (XLM-R / RoBERTa, BERT)
_DEFAULT_SPECIALS = {
    "roberta": {"cls_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>",
                "unk_token": "<unk>", "mask_token": "<mask>"},
    "": {"cls_token": "[CLS]", "pad_token": "[PAD]", "unk_token": "[UNK]",
         "mask_token": "[MASK]"},
}  # fmt: skip


def _special_ids(folder: Path, tok, arch: str) -> dict[str, int]:
    names = _special_names(folder) or _DEFAULT_SPECIALS.get(arch, _DEFAULT_SPECIALS[""])
    out = {}
    for key, name in names.items():
        i = tok.token_to_id(name)
        if i is not None:
            out[key] = int(i)
    return out


def _read_linear(path: Path, folder: Path, hidden: int, rows: int | None, what: str):
    """(weight [N, hidden], bias [N]) of a Linear's state dict saved as safetensors."""
    check_file(path, folder)
    f = SafetensorsFile(path)
    names = set(f.names())
    if "weight" not in names or not names <= {"weight", "bias"}:
        raise CheckpointError(
            f"{path}: expected the tensors of one torch Linear ('weight' and optionally "
            f"'bias'), found {sorted(names)}"
        )
    w = np.asarray(f.get("weight"), dtype=np.float32)
    n = w.shape[0] if w.ndim == 2 else -1
    if w.ndim != 2 or w.shape[1] != hidden or (rows is not None and n != rows) or n < 1:
        want = f"[{rows if rows is not None else 'D'}, {hidden}]"
        raise CheckpointError(
            f"{path}: {what} weight has shape {list(w.shape)}, expected {want} (config.json "
            "hidden size)"
        )
    b = np.zeros(n, np.float32)
    if "bias" in names:
        b = np.asarray(f.get("bias"), dtype=np.float32)
        if b.shape != (n,):
            raise CheckpointError(f"{path}: {what} bias has shape {list(b.shape)}, expected [{n}]")
    if not (np.isfinite(w).all() and np.isfinite(b).all()):
        raise CheckpointError(f"{path}: {what} contains NaN or Inf values")
    return np.ascontiguousarray(w), np.ascontiguousarray(b)


def _bge_m3(folder: Path, spec, weights: dict, tok, files: dict[str, Path]) -> MultiVectorModel:
    H = spec.hidden
    if spec.dense:
        # the heads read the pool's input, which the Dense modules after the pool may reuse
        raise UnsupportedModelError(
            f"{folder / 'modules.json'}: Dense modules after the pooling beside BGE-M3's heads "
            "are not supported"
        )
    heads: dict[str, np.ndarray] = {}
    meta: dict = {"kind": "bge-m3", "source": "FlagEmbedding BGE-M3", "maxsim": "mean"}
    specials = _special_ids(folder, tok, spec.arch)
    if "sparse" in files:
        heads["mv.sparse.w"], heads["mv.sparse.b"] = _read_linear(
            files["sparse"], folder, H, 1, "the sparse head's"
        )
        # FlagEmbedding drops these ids from the lexical weights (cls, eos, pad, unk)
        skip = {specials[k] for k in ("cls_token", "eos_token", "pad_token", "unk_token")
                if k in specials}  # fmt: skip
        meta["sparse"] = True
        meta["sparse_skip_ids"] = sorted(skip)
    if "colbert" in files:
        w, b = _read_linear(files["colbert"], folder, H, None, "the ColBERT head's")
        heads["mv.colbert0.w"], heads["mv.colbert0.b"] = w, b
        meta["layers"] = [["none", int(w.shape[0])]]
        meta["skip_first"] = 1  # the vectors of the tokens after [CLS]
    if not (folder / "modules.json").exists():
        # FlagEmbedding's dense vector: [CLS], normalised (a folder without a
        # sentence-transformers config would pool by mean)
        spec = spec.replace(pooling="cls", normalize=True)
    return MultiVectorModel(spec, weights, heads, meta)


def _colbert(folder: Path, spec, weights: dict, tok, source: str) -> MultiVectorModel:
    from zoi.frontend.checkpoint import read_json

    weights = dict(weights)
    specials = _special_ids(folder, tok, spec.arch)
    heads: dict[str, np.ndarray] = {}
    layers: list = []
    if source == "pylate":
        cpath = folder / "config_sentence_transformers.json"
        c = read_json(cpath, folder)
        cfg = {k: (c.get(k) if c.get(k) is not None else v) for k, v in PYLATE_DEFAULTS.items()}
        skip_words = c.get("skiplist_words")
        if skip_words is None:
            skip_words = list(string.punctuation)
        if not spec.dense:
            raise UnsupportedModelError(
                f"{folder / 'modules.json'}: a ColBERT folder without a Dense module: PyLate would "
                "add a randomly initialised projection. Save the trained model with its Dense "
                "module"
            )
        for k, (_din, dout, _bias, act) in enumerate(spec.dense):
            heads[f"mv.colbert{k}.w"] = weights.pop(f"dense{k}.w")
            heads[f"mv.colbert{k}.b"] = weights.pop(f"dense{k}.b")
            if act not in LAYER_ACTS:
                raise UnsupportedModelError(f"{folder}: Dense activation {act!r} is not supported")
            layers.append([act, int(dout)])
    else:
        cpath = folder / "artifact.metadata"
        c = read_json(cpath, folder) if cpath.is_file() else {}
        if not isinstance(c, dict):
            raise CheckpointError(f"{cpath}: expected a JSON object")
        cfg = {
            "query_prefix": c.get("query_token_id") or "[unused0]",
            "document_prefix": c.get("doc_token_id") or "[unused1]",
            "query_length": c.get("query_maxlen") or 32,
            "document_length": c.get("doc_maxlen") or 180,
            "do_query_expansion": True,
            "attend_to_expansion_tokens": bool(c.get("attend_to_mask_tokens", False)),
        }
        skip_words = list(string.punctuation) if c.get("mask_punctuation", True) else []
        w = _stanford_linear(folder, spec.hidden)
        heads["mv.colbert0.w"], heads["mv.colbert0.b"] = w, np.zeros(w.shape[0], np.float32)
        layers.append(["none", int(w.shape[0])])
        cpath = folder / "config.json" if not cpath.is_file() else cpath
    for key in ("query_prefix", "document_prefix"):
        if not isinstance(cfg[key], str):
            raise CheckpointError(f"{cpath}: {key} should be a string, got {cfg[key]!r}")
    for key in ("query_length", "document_length"):
        v = cfg[key]
        if type(v) is not int or not 3 <= v <= 1 << 20:
            raise CheckpointError(f"{cpath}: {key} should be an integer >= 3, got {v!r}")
    for key in ("do_query_expansion", "attend_to_expansion_tokens"):
        if not isinstance(cfg[key], bool):
            raise CheckpointError(f"{cpath}: {key} should be true or false, got {cfg[key]!r}")
    if not isinstance(skip_words, list) or not all(isinstance(x, str) for x in skip_words):
        raise CheckpointError(f"{cpath}: skiplist_words should be a list of strings")

    def marker(prefix: str, key: str) -> int | None:
        if prefix == "":
            return None
        i = tok.token_to_id(prefix)
        if i is None or i >= spec.vocab_size:
            raise CheckpointError(
                f"{cpath}: {key} {prefix!r} is not a token of the tokenizer (or lies outside the "
                f"model's {spec.vocab_size} embeddings); PyLate adds it to the tokenizer and the "
                "embeddings when it saves a model: save the trained model with PyLate"
            )
        return int(i)

    expansion = cfg["do_query_expansion"]
    mask_id = None
    if expansion:  # PyLate pads queries with the mask token, else EOS, else the pad token
        mask_id = next(
            (specials[k] for k in ("mask_token", "eos_token", "pad_token") if k in specials), None
        )
        if mask_id is None:
            raise CheckpointError(
                f"{folder}: query expansion pads queries with the tokenizer's mask token, and "
                "it has none (nor an EOS or pad token)"
            )
    unk = specials.get("unk_token")
    skip_ids = set()
    for word in skip_words:  # as transformers' convert_tokens_to_ids: unknown words give unk
        i = tok.token_to_id(word)
        i = unk if i is None else i
        if i is not None:
            skip_ids.add(int(i))
    meta = {
        "kind": "colbert",
        "source": "PyLate" if source == "pylate" else "Stanford ColBERT (HF_ColBERT)",
        "layers": layers,
        "skip_first": 0,
        "maxsim": "sum",
        "query_marker": marker(cfg["query_prefix"], "query_prefix"),
        "document_marker": marker(cfg["document_prefix"], "document_prefix"),
        "query_length": cfg["query_length"],
        "document_length": cfg["document_length"],
        "query_expansion": expansion,
        "attend_to_expansion": bool(expansion and cfg["attend_to_expansion_tokens"]),
        "mask_id": mask_id,
        "document_skip_ids": sorted(skip_ids),
    }
    # PyLate sets the tokenizer's limit per call (query_length / document_length, less one for
    # the marker), whatever max_seq_length says: the model's own positions bound the texts
    spec = spec.replace(
        dense=(), pooling="mean", normalize=False, max_positions=_positions(folder, spec, weights)
    )
    return MultiVectorModel(spec, weights, heads, meta)


def _positions(folder: Path, spec, weights: dict) -> int:
    from zoi.frontend.checkpoint import read_json

    cfg = read_json(folder / "config.json", folder)
    n = cfg.get("max_position_embeddings") if isinstance(cfg, dict) else None
    if type(n) is not int or n - spec.position_offset < 2:
        return spec.max_positions
    usable = n - spec.position_offset
    for name in ("embed.pos", "rope.g.cos"):
        if name in weights:
            usable = min(usable, int(weights[name].shape[0]) - spec.position_offset)
    return max(usable, spec.max_positions)


def _stanford_linear(folder: Path, hidden: int) -> np.ndarray:
    """`linear.weight` [D, hidden] of a Stanford ColBERT checkpoint (ColBERT's projection, no
    bias), from model.safetensors or the shard the index names."""
    from zoi.frontend.checkpoint import read_json

    name = "linear.weight"
    single, index = folder / "model.safetensors", folder / "model.safetensors.index.json"
    if single.exists():
        path = single
    elif index.exists():
        wm = read_json(index, folder).get("weight_map", {})
        if not isinstance(wm, dict) or not isinstance(wm.get(name), str):
            raise CheckpointError(f"{index}: {name!r} is not in the weight_map")
        path = inside(folder, wm[name], index)
    else:
        raise CheckpointError(f"{folder}: no model.safetensors (or model.safetensors.index.json)")
    check_file(path, folder)
    f = SafetensorsFile(path)
    if name not in f.names():
        raise CheckpointError(
            f"{path}: {name!r} (the ColBERT projection of an HF_ColBERT checkpoint) is missing"
        )
    w = np.asarray(f.get(name), dtype=np.float32)
    if w.ndim != 2 or w.shape[1] != hidden or not np.isfinite(w).all():
        raise CheckpointError(
            f"{path}: {name} has shape {list(w.shape)}, expected finite [D, {hidden}]"
        )
    return np.ascontiguousarray(w)


# ---- load: the artifact's record, checked ------------------------------------------------------
def head_shapes(cfg: MultiVectorConfig, hidden: int) -> dict[str, tuple[int, ...]]:
    s: dict[str, tuple[int, ...]] = {}
    if cfg.sparse:
        s["mv.sparse.w"], s["mv.sparse.b"] = (1, hidden), (1,)
    width = hidden
    for k, (_act, out) in enumerate(cfg.layers):
        s[f"mv.colbert{k}.w"], s[f"mv.colbert{k}.b"] = (out, width), (out,)
        width = out
    return s


def config_from_meta(meta, weights: dict, spec, where) -> MultiVectorConfig:
    """The validated MultiVectorConfig of an artifact's `multivector` meta; CheckpointError
    naming `where` when the record or the weights it names do not hold together."""

    def bad(msg: str):
        return CheckpointError(
            f"{where}: malformed multivector record ({msg}); re-compile the model"
        )

    if not isinstance(meta, dict) or meta.get("kind") not in KINDS:
        raise bad(f"kind must be one of {KINDS}")

    def ids(name) -> tuple:
        v = meta.get(name, [])
        if not isinstance(v, list) or any(
            type(i) is not int or not 0 <= i < spec.vocab_size for i in v
        ):
            raise bad(f"{name} must be token ids")
        return tuple(v)

    def opt_id(name):
        v = meta.get(name)
        if v is not None and (type(v) is not int or not 0 <= v < spec.vocab_size):
            raise bad(f"{name} must be a token id or null")
        return v

    layers = meta.get("layers", [])
    if not isinstance(layers, list) or any(
        not isinstance(x, list) or len(x) != 2 or x[0] not in LAYER_ACTS
        or type(x[1]) is not int or not 0 < x[1] <= 1 << 16 for x in layers
    ):  # fmt: skip
        raise bad("layers must be [act, out] pairs")
    lengths = {k: meta.get(k, 0) for k in ("query_length", "document_length", "skip_first")}
    if any(type(v) is not int or v < 0 for v in lengths.values()):
        raise bad("query_length, document_length and skip_first must be integers >= 0")
    flags = {k: meta.get(k, False) for k in ("sparse", "query_expansion", "attend_to_expansion")}
    if any(not isinstance(v, bool) for v in flags.values()):
        raise bad("sparse, query_expansion and attend_to_expansion must be true or false")
    if meta.get("maxsim", "mean") not in ("mean", "sum"):
        raise bad("maxsim must be mean or sum")
    cfg = MultiVectorConfig(
        kind=meta["kind"],
        sparse=flags["sparse"],
        layers=tuple((a, o) for a, o in layers),
        skip_first=lengths["skip_first"],
        sparse_skip_ids=ids("sparse_skip_ids"),
        maxsim=meta.get("maxsim", "mean"),
        query_marker=opt_id("query_marker"),
        document_marker=opt_id("document_marker"),
        query_length=lengths["query_length"],
        document_length=lengths["document_length"],
        query_expansion=flags["query_expansion"],
        attend_to_expansion=flags["attend_to_expansion"],
        mask_id=opt_id("mask_id"),
        document_skip_ids=ids("document_skip_ids"),
        source=str(meta.get("source", "")),
    )
    if not cfg.outputs or (cfg.kind == "colbert" and not cfg.layers):
        raise bad("no head")
    if cfg.query_expansion and cfg.mask_id is None:
        raise bad("query_expansion needs mask_id")
    for name, shp in head_shapes(cfg, spec.hidden).items():
        w = weights.get(name)
        if w is None or tuple(w.shape) != shp or w.dtype != np.float32:
            got = None if w is None else f"{w.dtype} {list(w.shape)}"
            raise CheckpointError(
                f"{where}: the multivector head tensor {name} should be float32 {list(shp)}, "
                f"got {got}; re-compile the model"
            )
    return cfg
