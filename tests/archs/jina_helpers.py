"""Random-init jina-embeddings-v3 checkpoints with task adapters in the hub's layout, and the
oracle of each task: transformers' JinaEmbeddingsV3Model with the adapters merged into its weights
(W + s B_t A_t, E + s A_t B_t: the hub's modeling_lora.py formula, zoi.frontend.adapters).

tests/archs/test_jina_v3.py and tests/serve/test_jina_tasks.py build on them."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import numpy as np

TASKS = ["retrieval.query", "retrieval.passage", "separation", "classification", "text-matching"]
INSTRUCTIONS = {
    "retrieval.query": "Represent the query for retrieving evidence documents: ",
    "retrieval.passage": "Represent the document for retrieval: ",
    "separation": "",
    "classification": "",
    "text-matching": "",
}
# awkward sizes: hidden 84 in 6 heads of 14 (RoPE over 7 pairs), an odd intermediate size
CONFIG = dict(
    hidden_size=84,
    num_hidden_layers=2,
    num_attention_heads=6,
    intermediate_size=75,
    max_position_embeddings=300,
    type_vocab_size=1,
)
PARAM = ".parametrizations.weight"


def build(seed: int = 0, **overrides):
    from tests.conftest import random_hf_model

    kw = {**CONFIG, **overrides}
    return random_hf_model(
        "JinaEmbeddingsV3Config", "JinaEmbeddingsV3Model", seed, vocab_size=30522, **kw
    )


def adapted_modules(layers: int) -> dict[str, str]:
    """The hub's adapted module -> its kind ("linear" / "embedding")."""
    mods = {
        "embeddings.word_embeddings": "embedding",
        "embeddings.token_type_embeddings": "embedding",
        "pooler.dense": "linear",
    }
    for i in range(layers):
        for m in ("mixer.Wqkv", "mixer.out_proj", "mlp.fc1", "mlp.fc2"):
            mods[f"encoder.layers.{i}.{m}"] = "linear"
    return mods


def random_adapters(
    weights: dict[str, np.ndarray], layers: int, n: int, rank: int, seed: int, scale: float = 0.1
) -> dict[str, np.ndarray]:
    """{module: (lora_A, lora_B)} in the hub's shapes (modeling_lora.py LoRAParametrization):
    linear A [n, r, in], B [n, out, r]; embedding A [n, rows, r], B [n, r, H]."""
    rng = np.random.default_rng(seed)
    out = {}
    for mod, kind in adapted_modules(layers).items():
        rows, cols = weights[mod + ".weight"].shape
        if kind == "linear":
            a_shape, b_shape = (n, rank, cols), (n, rows, rank)
        else:
            a_shape, b_shape = (n, rows, rank), (n, rank, cols)
        a = (rng.standard_normal(a_shape) * scale).astype(np.float32)
        b = (rng.standard_normal(b_shape) * scale).astype(np.float32)
        out[mod] = (a, b)
    return out


def checkpoint(
    folder: Path,
    seed: int = 0,
    prefix: str = "roberta.",
    rank: int = 4,
    alpha: float = 1.0,
    original_config: bool = False,
    **overrides,
):
    """(transformers model, folder, adapters {module: (A, B)}, scaling): save_pretrained's folder
    rewritten as the hub ships jina-embeddings-v3: every adapted module's weight under
    `M.parametrizations.weight.original` with its `...weight.0.lora_A` / `lora_B`, the tensors
    under `prefix`, config.json's lora_adaptations / lora_rank / lora_alpha / task_instructions,
    and the prompts in config_sentence_transformers.json (mean pooling, Normalize).
    original_config: the hub's own config.json (model_type xlm-roberta, rotary positions)."""
    from safetensors.numpy import load_file, save_file
    from tests.conftest import save_checkpoint

    model = build(seed, **overrides)
    save_checkpoint(model, folder, pooling="mean", normalize=True)
    w = load_file(str(folder / "model.safetensors"))
    layers = model.config.num_hidden_layers
    ad = random_adapters(w, layers, len(TASKS), rank, seed + 100)
    out = {}
    for k, v in w.items():
        mod = k[: -len(".weight")] if k.endswith(".weight") else None
        if mod in ad:
            out[prefix + mod + PARAM + ".original"] = v
            out[prefix + mod + PARAM + ".0.lora_A"], out[prefix + mod + PARAM + ".0.lora_B"] = ad[
                mod
            ]
        else:
            out[prefix + k] = v
    save_file(out, str(folder / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(
        lora_adaptations=TASKS,
        lora_rank=rank,
        lora_alpha=alpha,
        lora_dropout_p=0.0,
        lora_main_params_trainable=False,
        task_instructions=INSTRUCTIONS,
    )
    if original_config:  # jinaai/jina-embeddings-v3's config.json (XLMRobertaFlashConfig)
        theta = cfg.pop("rope_parameters")["rope_theta"]
        cfg.update(
            model_type="xlm-roberta",
            architectures=["XLMRobertaLoRA"],
            position_embedding_type="rotary",
            rotary_emb_base=theta,
            use_flash_attn=True,
            load_trained_adapters=True,
            emb_pooler=None,
        )
    (folder / "config.json").write_text(json.dumps(cfg))
    (folder / "config_sentence_transformers.json").write_text(
        json.dumps({"prompts": INSTRUCTIONS, "default_prompt_name": None})
    )
    tok = {"tokenizer_class": "BertTokenizerFast", "pad_token": "[PAD]", "unk_token": "[UNK]"}
    (folder / "tokenizer_config.json").write_text(json.dumps(tok))
    return model, folder, ad, alpha / rank


def merged(model, adapters: dict, task: int, s: float):
    """transformers' model with task `task`'s adapters merged into its weights (the hub's
    formula: linear W + s B_t A_t, embedding E + s A_t B_t; the packed Wqkv's delta split into
    q / k / v as transformers splits the packed weight)."""
    import torch

    m = copy.deepcopy(model)
    sd = m.state_dict()
    for mod, (a, b) in adapters.items():
        A = torch.from_numpy(a[task].astype(np.float64))
        B = torch.from_numpy(b[task].astype(np.float64))
        if "embeddings" in mod:
            delta = s * (A @ B)
        else:
            delta = s * (B @ A)
        if mod.endswith("mixer.Wqkv"):
            i = mod.split(".")[2]
            for x, part in zip("qkv", torch.chunk(delta, 3, dim=0), strict=True):
                key = f"layers.{i}.self_attn.{x}_proj.weight"
                sd[key] = (sd[key].double() + part).float()
            continue
        key = (
            mod.replace("encoder.layers.", "layers.")
            .replace("mixer.out_proj", "self_attn.o_proj")
            .replace("emb_ln", "embeddings.LayerNorm")
        ) + ".weight"
        sd[key] = (sd[key].double() + delta).float()
    m.load_state_dict(sd)
    return m.eval()


def mean_pooled(model, seqs: list[np.ndarray]) -> np.ndarray:
    """transformers' mean-pooled hidden states, one sequence at a time (no padding)."""
    import torch

    out = []
    with torch.no_grad():
        for s in seqs:
            x = torch.from_numpy(s.astype(np.int64))[None]
            h = model(input_ids=x, attention_mask=torch.ones_like(x)).last_hidden_state[0]
            out.append(h.mean(0).numpy())
    return np.stack(out)


def copy_folder(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst
