"""Random-init multi-vector checkpoints (docs/MULTIVECTOR.md): BGE-M3-like folders (an XLM-R
encoder with an XLM-R-style SentencePiece tokenizer, sparse / ColBERT heads saved as torch
pickles or safetensors), PyLate and Stanford ColBERT folders; and straightforward torch
implementations of FlagEmbedding's and PyLate's formulas to test them against."""

from __future__ import annotations

import functools
import json
import shutil
import string
from pathlib import Path

import numpy as np
from tests.conftest import minilm_path, random_hf_model, real_sentences

XLMR = dict(
    hidden_size=36,
    num_hidden_layers=2,
    num_attention_heads=3,
    intermediate_size=50,
    max_position_embeddings=42,  # 40 usable (pad_token_id 1: positions start at 2)
    type_vocab_size=1,
    pad_token_id=1,
    bos_token_id=0,
    eos_token_id=2,
)
XLMR_SPECIALS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]  # ids 0..4, as XLM-R's
M3_TOKENIZER_CONFIG = {
    "bos_token": "<s>",
    "cls_token": "<s>",
    "eos_token": "</s>",
    "mask_token": {"content": "<mask>", "lstrip": True, "normalized": True, "rstrip": False,
                   "single_word": False},
    "pad_token": "<pad>",
    "sep_token": "</s>",
    "unk_token": "<unk>",
    "model_max_length": 8192,
}  # fmt: skip


@functools.lru_cache(maxsize=1)
def xlmr_tokenizer_json(vocab: int = 211) -> str:
    """A small SentencePiece-style Unigram tokenizer with XLM-R's specials and template
    (<s> text </s>), trained on zoi's sentences: the HF tokenizers path, ids 0..3 special."""
    from tokenizers import (
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
        trainers,
    )

    tok = Tokenizer(models.Unigram())
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tr = trainers.UnigramTrainer(
        vocab_size=vocab, special_tokens=XLMR_SPECIALS, unk_token="<unk>", show_progress=False
    )
    tok.train_from_iterator(real_sentences() * 2, tr)
    tok.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
    return _canonical_unigram(tok.to_str(), len(XLMR_SPECIALS))


def _canonical_unigram(tj: str, n_special: int) -> str:
    """The trainer gives the single characters it must keep scores just below the learnt pieces'
    in the order of a hash map seeded per process, and its scores differ in the last bits, so the
    same corpus gave another tokenizer.json (other ids, other embedding rows) in every test
    process; here those scores go to the characters in sorted order, every score is rounded and
    the ids follow the scores (ties by piece): one tokenizer for every run."""
    j = json.loads(tj)
    vocab = j["model"]["vocab"]
    head = vocab[:n_special]
    # the learnt scores themselves differ in the last bits (summation order): rounded
    rest = [[p, round(sc, 6)] for p, sc in vocab[n_special:]]
    floor = min((sc for p, sc in rest if len(p) > 1), default=float("inf"))
    band = [i for i, (p, sc) in enumerate(rest) if len(p) == 1 and sc < floor]
    scores = sorted((rest[i][1] for i in band), reverse=True)
    pieces = sorted(rest[i][0] for i in band)
    for i, piece, sc in zip(band, pieces, scores, strict=True):
        rest[i] = [piece, sc]
    rest.sort(key=lambda e: (-e[1], e[0]))
    j["model"]["vocab"] = head + rest
    if j["model"].get("unk_id") is not None:
        j["model"]["unk_id"] = [p for p, _ in j["model"]["vocab"]].index("<unk>")
    return json.dumps(j, ensure_ascii=False)


def _linear(n_in: int, n_out: int, seed: int, bias: bool = True):
    import torch

    torch.manual_seed(seed)
    lin = torch.nn.Linear(n_in, n_out, bias=bias).eval()
    with torch.no_grad():
        for p in lin.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return lin


def bge_m3_folder(
    folder: Path, seed: int = 0, heads=("sparse", "colbert"), pickles: bool = False,
    colbert_dim: int | None = None, st: bool = True,
):  # fmt: skip
    """An XLM-R encoder + BGE-M3's heads: sparse Linear(H, 1), ColBERT Linear(H, D) (D = H as
    BGE-M3, or colbert_dim), saved as torch pickles (`pickles`) or safetensors; with
    sentence-transformers modules (cls pooling + Normalize, as BAAI/bge-m3) unless st=False.
    Returns (folder, encoder, {head: torch Linear})."""
    import torch

    folder.mkdir(parents=True, exist_ok=True)
    tj = xlmr_tokenizer_json()
    V = json.loads(tj)["model"]["vocab"].__len__() + 5  # rows no token reaches
    model = random_hf_model("XLMRobertaConfig", "XLMRobertaModel", seed, 0.05, vocab_size=V, **XLMR)
    model.save_pretrained(str(folder), safe_serialization=True)
    (folder / "tokenizer.json").write_text(tj, encoding="utf-8")
    (folder / "tokenizer_config.json").write_text(json.dumps(M3_TOKENIZER_CONFIG))
    if st:
        mods = [
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
            {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
        ]  # fmt: skip
        (folder / "modules.json").write_text(json.dumps(mods))
        (folder / "1_Pooling").mkdir(exist_ok=True)
        (folder / "1_Pooling" / "config.json").write_text(
            json.dumps(
                {"word_embedding_dimension": XLMR["hidden_size"], "pooling_mode_cls_token": True}
            )
        )
    H = XLMR["hidden_size"]
    lins = {}
    for head in heads:
        n_out = 1 if head == "sparse" else (colbert_dim or H)
        lin = _linear(H, n_out, seed + (11 if head == "sparse" else 23))
        if head == "sparse":
            with torch.no_grad():  # about half the tokens above zero after the relu
                lin.bias.fill_(0.02)
        lins[head] = lin
        stem = "sparse_linear" if head == "sparse" else "colbert_linear"
        if pickles:
            torch.save(lin.state_dict(), folder / f"{stem}.pt")
        else:
            from safetensors.torch import save_file

            save_file(
                {k: v.contiguous() for k, v in lin.state_dict().items()},
                folder / f"{stem}.safetensors",
            )
    return folder, model, lins


# ---- FlagEmbedding's formulas (BGE-M3), one text at a time --------------------------------------
def m3_reference(model, lins, folder: Path, texts, max_len: int = 40):
    """{"dense": [n, H], "sparse": [{id: w}], "colbert": [[n_i, D]]} as FlagEmbedding's
    M3Embedder computes them (unused tokens: cls, eos, pad, unk)."""
    import torch
    import torch.nn.functional as F
    from tests.heads.helpers import hf_tokenizer

    tok = hf_tokenizer(folder, max_len)
    unused = {0, 1, 2, 3}
    dense, sparse, colbert = [], [], []
    for t in texts:
        ids = torch.tensor([tok.encode(t).ids])
        with torch.no_grad():
            h = model(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state
            dense.append(F.normalize(h[:, 0], dim=-1)[0].numpy())
            if "sparse" in lins:
                w = torch.relu(lins["sparse"](h))[0, :, 0].numpy()
                d: dict = {}
                for wi, idx in zip(w, ids[0].tolist(), strict=True):
                    if idx not in unused and wi > 0 and wi > d.get(idx, 0):
                        d[idx] = float(wi)
                sparse.append(d)
            if "colbert" in lins:
                v = lins["colbert"](h[:, 1:])
                colbert.append(F.normalize(v, dim=-1)[0].numpy())
    return {"dense": np.stack(dense), "sparse": sparse, "colbert": colbert}


def flag_colbert_score(q, p) -> float:
    """FlagEmbedding's colbert_score: einsum, max over the passage, sum / query vectors."""
    import torch

    q, p = torch.from_numpy(np.asarray(q)), torch.from_numpy(np.asarray(p))
    s = torch.einsum("in,jn->ij", q, p).max(-1).values
    return float(torch.sum(s) / q.size(0))


def flag_lexical_score(a: dict, b: dict) -> float:
    return float(sum(w * b[t] for t, w in a.items() if t in b))


# ---- ColBERT folders -------------------------------------------------------------------------------
BERT = dict(
    hidden_size=40,
    num_hidden_layers=2,
    num_attention_heads=5,
    intermediate_size=74,
    max_position_embeddings=48,
    type_vocab_size=2,
)
VOCAB = 30529  # MiniLM's 30522 ids + the two markers PyLate adds + rows no token reaches


def _minilm_with_markers(markers=("[Q] ", "[D] ")) -> str:
    from tokenizers import AddedToken, Tokenizer

    tok = Tokenizer.from_file(str(minilm_path() / "tokenizer.json"))
    tok.add_tokens([AddedToken(m, normalized=True) for m in markers])  # as PyLate's add_tokens
    return tok.to_str()


def pylate_folder(
    folder: Path, seed: int = 0, dim: int = 13, query_length: int = 12,
    document_length: int = 29, expansion: bool = True, attend: bool = False,
    skiplist=None, prefixes=("[Q] ", "[D] "), max_seq_length: int | None = 20,
):  # fmt: skip
    """A PyLate ColBERT folder: BertModel + Dense(H, dim, no bias) module, the markers added
    to the tokenizer, PyLate's keys in config_sentence_transformers.json (a sentence_bert_config
    max_seq_length below the lengths: PyLate sets the limit per call). Returns
    (folder, encoder, dense torch Linear, config)."""
    folder.mkdir(parents=True, exist_ok=True)
    model = random_hf_model("BertConfig", "BertModel", seed, 0.05, vocab_size=VOCAB, **BERT)
    model.save_pretrained(str(folder), safe_serialization=True)
    (folder / "tokenizer.json").write_text(_minilm_with_markers(), encoding="utf-8")
    shutil.copy(minilm_path() / "tokenizer_config.json", folder / "tokenizer_config.json")
    mods = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Dense", "type": "pylate.models.Dense.Dense"},
    ]
    (folder / "modules.json").write_text(json.dumps(mods))
    H = BERT["hidden_size"]
    lin = _linear(H, dim, seed + 5, bias=False)
    d = folder / "1_Dense"
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(json.dumps({
        "in_features": H, "out_features": dim, "bias": False,
        "activation_function": "torch.nn.modules.linear.Identity",
    }))  # fmt: skip
    from safetensors.torch import save_file

    save_file({"linear.weight": lin.weight.detach().contiguous()}, d / "model.safetensors")
    cfg = {
        "query_prefix": prefixes[0],
        "document_prefix": prefixes[1],
        "query_length": query_length,
        "document_length": document_length,
        "attend_to_expansion_tokens": attend,
        "skiplist_words": list(string.punctuation) if skiplist is None else skiplist,
        "do_query_expansion": expansion,
        "model_type": "ColBERT",
    }
    (folder / "config_sentence_transformers.json").write_text(json.dumps(cfg))
    if max_seq_length:
        (folder / "sentence_bert_config.json").write_text(
            json.dumps({"max_seq_length": max_seq_length})
        )
    return folder, model, lin, cfg


def stanford_folder(folder: Path, seed: int = 0, dim: int = 11, query_maxlen: int = 10,
                    doc_maxlen: int = 25, attend: bool = False):  # fmt: skip
    """A Stanford ColBERT (HF_ColBERT) folder: bert.* + linear.weight in model.safetensors,
    artifact.metadata with the markers and lengths. Returns (folder, encoder, linear, cfg)
    with cfg in PyLate's terms."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    model = random_hf_model("BertConfig", "BertModel", seed, 0.05, vocab_size=30522, **BERT)
    lin = _linear(BERT["hidden_size"], dim, seed + 7, bias=False)
    sd = {f"bert.{k}": v.contiguous() for k, v in model.state_dict().items()}
    sd["linear.weight"] = lin.weight.detach().contiguous()
    save_file(sd, folder / "model.safetensors")
    conf = model.config.to_dict()
    conf["architectures"] = ["HF_ColBERT"]
    (folder / "config.json").write_text(json.dumps(conf))
    shutil.copy(minilm_path() / "tokenizer.json", folder / "tokenizer.json")
    shutil.copy(minilm_path() / "tokenizer_config.json", folder / "tokenizer_config.json")
    meta = {"query_token_id": "[unused0]", "doc_token_id": "[unused1]", "query_maxlen": query_maxlen,
            "doc_maxlen": doc_maxlen, "attend_to_mask_tokens": attend, "dim": dim}  # fmt: skip
    (folder / "artifact.metadata").write_text(json.dumps(meta))
    cfg = {
        "query_prefix": "[unused0]",
        "document_prefix": "[unused1]",
        "query_length": query_maxlen,
        "document_length": doc_maxlen,
        "attend_to_expansion_tokens": attend,
        "skiplist_words": list(string.punctuation),
        "do_query_expansion": True,
    }
    return folder, model, lin, cfg


# ---- PyLate's formulas ------------------------------------------------------------------------------
def pylate_reference(model, lin, folder: Path, cfg: dict, texts, is_query: bool):
    """ColBERT vectors as PyLate's ColBERT.encode computes them: the marker after [CLS],
    truncation to the length less the marker, queries padded with [MASK] to query_length
    (attention mask 0 on the expansion tokens unless attend_to_expansion_tokens), documents
    without their skiplist tokens; each vector L2-normalised."""
    import torch
    import torch.nn.functional as F
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    length = cfg["query_length"] if is_query else cfg["document_length"]
    prefix = cfg["query_prefix"] if is_query else cfg["document_prefix"]
    marker = tok.token_to_id(prefix) if prefix else None
    tok.no_padding()
    tok.enable_truncation(length - (marker is not None))
    mask = tok.token_to_id("[MASK]")
    unk = tok.token_to_id("[UNK]")
    skip = {
        tok.token_to_id(w) if tok.token_to_id(w) is not None else unk for w in cfg["skiplist_words"]
    }
    out = []
    for t in texts:
        ids = tok.encode(t).ids
        if marker is not None:
            ids = ids[:1] + [marker] + ids[1:]
        att = [1] * len(ids)
        if is_query and cfg["do_query_expansion"] and len(ids) < length:
            n = length - len(ids)
            ids = ids + [mask] * n
            att = att + [1 if cfg["attend_to_expansion_tokens"] else 0] * n
        x = torch.tensor([ids])
        with torch.no_grad():
            h = model(input_ids=x, attention_mask=torch.tensor([att]),
                      token_type_ids=torch.zeros_like(x)).last_hidden_state[0]  # fmt: skip
            v = F.normalize(lin(h), p=2, dim=1).numpy()
        if not is_query:
            v = v[[i not in skip for i in ids]]
        out.append(v)
    return out


def pylate_maxsim(q, d) -> float:
    """PyLate's colbert_scores of one pair: max over the document, summed over the query."""
    import torch

    s = torch.einsum("sh,th->st", torch.from_numpy(q), torch.from_numpy(d))
    return float(s.max(dim=1).values.sum())
