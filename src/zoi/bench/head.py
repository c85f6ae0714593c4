"""What follows the transformer in a benchmark model, as every provider runs it.

The BERT family (minilm, bert-base, mpnet-base, modernbert-base) is timed to the mean-pooled
hidden state, as it always was: their folders' Normalize (MiniLM's) is left out everywhere.
The decoder architectures run as encoders (gemma-embed, qwen3-embed) are timed to the sentence
embedding their sentence-transformers folder defines: pooling (mean, or the last token),
Dense modules, Normalize. The peers (PyTorch, the ONNX export the ONNX Runtime and OpenVINO
rows run) put the same module after the transformer; zoi runs the folder's head itself.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

# config.json model types whose folders' sentence-transformers head is benchmarked in full
FULL_HEAD_TYPES = ("qwen3", "gemma3_text")

_ACTS = {
    "torch.nn.modules.linear.Identity": "Identity",
    "torch.nn.modules.activation.Tanh": "Tanh",
}


@dataclass(frozen=True)
class Head:
    pooling: str = "mean"  # "mean" | "lasttoken"
    dense: tuple[str, ...] = ()  # the Dense module folders, in order
    normalize: bool = False


def model_type(model_dir: str | Path) -> str | None:
    return json.loads((Path(model_dir) / "config.json").read_text()).get("model_type")


def read_head(model_dir: str | Path) -> Head:
    """The head the benchmark runs after the transformer of ``model_dir``."""
    d = Path(model_dir)
    if model_type(d) not in FULL_HEAD_TYPES:
        return Head()
    mods = json.loads((d / "modules.json").read_text())
    pooling, dense, normalize = "mean", [], False
    for m in mods:
        kind = m["type"].rsplit(".", 1)[-1]
        if kind == "Pooling":
            cfg = json.loads((d / m["path"] / "config.json").read_text())
            modes = [k for k, v in cfg.items() if k.startswith("pooling_mode") and v is True]
            names = {"pooling_mode_mean_tokens": "mean", "pooling_mode_lasttoken": "lasttoken"}
            if len(modes) != 1 or modes[0] not in names:
                raise ValueError(f"{d}: the benchmark pools by mean or last token, not {modes}")
            pooling = names[modes[0]]
        elif kind == "Dense":
            dense.append(str(d / m["path"]))
        elif kind == "Normalize":
            normalize = True
        elif kind != "Transformer":
            raise ValueError(f"{d}: sentence-transformers module {m['type']} is not benchmarked")
    return Head(pooling, tuple(dense), normalize)


def head_module(model_dir: str | Path, clamp: float = 1e-9):
    """``Head`` as a torch module: ``(hidden [B, S, H], attention_mask [B, S]) -> [B, D]``.

    Batches are right-padded (every row starts at position 0), so a row's last token sits at
    its mask's count minus one. ``clamp``: the smallest token count mean pooling divides by
    (1 in FP16, where 1e-9 is zero)."""
    import torch
    from safetensors.torch import load_file

    head = read_head(model_dir)

    class PoolHead(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.last = head.pooling == "lasttoken"
            self.normalize = head.normalize
            layers = []
            for path in head.dense:
                c = json.loads((Path(path) / "config.json").read_text())
                act = _ACTS.get(c.get("activation_function", "torch.nn.modules.activation.Tanh"))
                if act is None:
                    raise ValueError(
                        f"{path}: activation {c['activation_function']} not benchmarked"
                    )
                lin = torch.nn.Linear(c["in_features"], c["out_features"], bias=c.get("bias", True))
                lin.load_state_dict(
                    {
                        k.removeprefix("linear."): v
                        for k, v in load_file(str(Path(path) / "model.safetensors")).items()
                    }
                )
                layers += [lin, getattr(torch.nn, act)()]
            self.dense = torch.nn.Sequential(*layers)

        def forward(self, h, attention_mask):
            if self.last:
                idx = attention_mask.sum(1) - 1  # [B]
                idx = idx.view(-1, 1, 1).expand(-1, 1, h.shape[-1])
                x = h.gather(1, idx).squeeze(1)
            else:
                mk = attention_mask.unsqueeze(-1).to(h.dtype)
                x = (h * mk).sum(1) / mk.sum(1).clamp(min=clamp)
            x = self.dense(x)
            if self.normalize:
                x = torch.nn.functional.normalize(x, p=2.0, dim=1)
            return x

    return PoolHead().eval()


def bidirectional_masks(config, additive: bool = True):
    """Bidirectional Gemma3 (EmbeddingGemma): the masks of its full and sliding layers, built
    from the [B, S] attention mask with index arithmetic, or None for any other model.

    transformers builds them through ``torch.vmap`` and a mask function that makes a CPU
    tensor: the TorchScript ONNX exporter cannot trace that, nor can a CUDA graph capture it.
    The model's forward takes the same masks ready made (a dict by layer type). Full layers:
    every real key; sliding layers: real keys at distance < ``config.sliding_window``
    (transformers' bidirectional window, already halved by Gemma3TextConfig). ``additive``:
    0 / float32 min, as eager attention adds them; else boolean (keep), as SDPA takes them.
    The tests check both against transformers' own."""
    import torch

    if getattr(config, "model_type", None) != "gemma3_text":
        return None
    if not getattr(config, "use_bidirectional_attention", False):
        return None
    window = int(config.sliding_window)

    def build(attention_mask):
        n = attention_mask.shape[1]
        pos = torch.arange(n, device=attention_mask.device)
        near = (pos[:, None] - pos[None, :]).abs() < window  # [S, S]
        keep = attention_mask.bool()[:, None, None, :]  # [B, 1, 1, S]
        full = keep.expand(-1, -1, n, -1)
        sliding = keep & near[None, None]
        if not additive:
            return {"full_attention": full, "sliding_attention": sliding}
        zero = torch.zeros((), dtype=torch.float32)
        neg = torch.tensor(torch.finfo(torch.float32).min)
        return {
            "full_attention": torch.where(full, zero, neg),
            "sliding_attention": torch.where(sliding, zero, neg),
        }

    return build
