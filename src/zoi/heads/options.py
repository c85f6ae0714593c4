"""encode's sentence-transformers options: prompts and default_prompt_name from
config_sentence_transformers.json, truncate_dim (Matryoshka), output_value."""

from __future__ import annotations

import numpy as np

from zoi.frontend.tokenizer import Tokenizer


def st_meta(folder, spec, truncate_dim) -> dict:
    """What a compiled model keeps of sentence-transformers' options: `prompts` and
    `default_prompt_name` (config_sentence_transformers.json), the compile option
    truncate_dim (checked against the hidden size), and an LLM reranker's `pair_format`
    (zoi.heads.llm_rerank)."""
    from pathlib import Path

    from zoi.frontend.checkpoint import read_json

    out: dict = {}
    p = Path(folder) / "config_sentence_transformers.json"
    if p.is_file():
        c = read_json(p, Path(folder))
        prompts = c.get("prompts") if isinstance(c, dict) else None
        if isinstance(prompts, dict) and all(
            isinstance(k, str) and isinstance(v, str) for k, v in prompts.items()
        ):
            out["prompts"] = dict(prompts)
            dn = c.get("default_prompt_name")
            if isinstance(dn, str) and dn in prompts:
                out["default_prompt_name"] = dn
    if truncate_dim is not None:
        out["truncate_dim"] = _check_dim(truncate_dim, spec.hidden)
    if spec.score_tokens:  # an LLM reranker: how a pair becomes tokens (chat template or pairs)
        from zoi.heads.llm_rerank import pair_format

        out["pair_format"] = pair_format(folder, spec)
    return out


def _check_dim(d, hidden: int) -> int:
    if isinstance(d, bool) or not isinstance(d, (int, np.integer)) or not 1 <= int(d) <= hidden:
        raise ValueError(
            f"truncate_dim must be an int in [1, {hidden}] (the model's hidden size), got {d!r}"
        )
    return int(d)


class EncodeOptionsMixin:
    """encode's sentence-transformers options: prompts, truncate_dim, output_value."""

    @property
    def prompts(self) -> dict:
        return dict(self.model.meta.get("prompts", {}))

    def _prompted(self, sentences, prompt, prompt_name):
        if self.spec.head:
            from zoi.errors import HeadError
            from zoi.heads.names import HEAD_NAMES, a_

            calls = {"seq_cls": "predict / rerank", "token_cls": "predict_tokens / ner",
                     "splade": "encode_sparse"}[self.spec.head]  # fmt: skip
            raise HeadError(
                f"encode gives the sentence embeddings of an embedding model; {self.spec.name} "
                f"is {a_(HEAD_NAMES[self.spec.head])} model: use {calls}"
            )
        if prompt is None:
            prompts = self.model.meta.get("prompts", {})
            if prompt_name is not None:
                if prompt_name not in prompts:
                    raise ValueError(
                        f"prompt_name {prompt_name!r} is not one of the model's prompts "
                        f"{sorted(prompts)} (config_sentence_transformers.json)"
                    )
                prompt = prompts[prompt_name]
            elif self.model.meta.get("default_prompt_name"):
                prompt = prompts.get(self.model.meta["default_prompt_name"])
        if not prompt:
            return sentences
        if not isinstance(prompt, str):
            raise TypeError(f"prompt should be a str, got {type(prompt).__name__}")
        if isinstance(sentences, str):
            return prompt + sentences
        return [prompt + t for t in Tokenizer.check_texts(sentences)]

    def _truncated(self, out: np.ndarray, truncate_dim, normalize_embeddings) -> np.ndarray:
        d = truncate_dim if truncate_dim is not None else self.model.meta.get("truncate_dim")
        d = _check_dim(d, self.spec.hidden)
        out = np.ascontiguousarray(out[..., :d])
        norm = self.spec.normalize if normalize_embeddings is None else bool(normalize_embeddings)
        if norm:
            n = np.sqrt((out.astype(np.float64) ** 2).sum(axis=-1, keepdims=True))
            out = (out / np.maximum(n, 1e-12)).astype(np.float32)
        return out

    def _other_output(self, sentences, output_value, batch_size, truncate):
        if output_value != "token_embeddings":
            raise ValueError(
                f"output_value must be 'sentence_embedding' or 'token_embeddings', got {output_value!r}"
            )
        single = isinstance(sentences, str)
        res = self.token_embeddings([sentences] if single else sentences, batch_size, truncate)
        return res[0] if single else res
