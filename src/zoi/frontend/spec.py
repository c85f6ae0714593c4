"""ModelSpec: the architecture-neutral description of an encoder (docs/ARCHITECTURE.md)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

SUPPORTED_ACTS = ("gelu", "gelu_tanh", "relu", "silu")  # the FFN activation (`act`)
SUPPORTED_POOLING = ("mean", "cls", "max", "last")  # `pooling` (last: the last token)
# decoder architectures (llama ... gemma3) run as encoders: embedders, rerankers
DECODER_ARCHS = ("llama", "mistral", "qwen2", "qwen3", "gemma3")
# BERT's post-norm layers with RoPE (zoi.frontend.archs_rotary): NomicBERT / GTE with a gated
# MLP, jina-embeddings-v3 (XLM-RoBERTa with RoPE) with BERT's plain one
ROTARY_ARCHS = ("nomic_bert", "gte", "jina_v3")
GATED_ROTARY_ARCHS = ("nomic_bert", "gte")
ARCHS = (
    "bert",
    "distilbert",
    "roberta",
    "mpnet",
    "modernbert",
    "electra",
    "albert",
    *ROTARY_ARCHS,
    *DECODER_ARCHS,
)
NORMS = ("layernorm", "rmsnorm")
HEADS = ("", "seq_cls", "token_cls", "splade")  # `head` ("": an embedding model; zoi/heads)
HEAD_ACTS = ("", "tanh", "relu", "gelu", "gelu_tanh")  # `head_act`


@dataclass(frozen=True)
class ModelSpec:
    arch: str  # one of ARCHS
    vocab_size: int
    hidden: int
    layers: int
    heads: int
    intermediate: int
    max_positions: int  # usable tokens per sequence, [CLS]/[SEP] included
    position_offset: int = 0  # RoBERTa: pad_token_id + 1
    type_vocab_size: int = 0  # 0: no token-type table
    eps: float = 1e-12
    act: str = "gelu"
    pooling: str = "mean"
    normalize: bool = False
    name: str = "model"
    # architecture extras (docs/ARCHITECTURE.md; 0 = absent)
    embed_size: int = 0  # Electra / ALBERT: embeddings of this width, then a projection to hidden
    rel_buckets: int = 0  # MPNet: relative position buckets (bidirectional), max distance below
    rel_max_distance: int = 0
    rope_theta: float = 0.0  # ModernBERT: RoPE base of the global layers
    rope_theta_local: float = 0.0  # ... of the local (sliding-window) layers
    rope_factor: float = 0.0  # linear RoPE scaling: inv_freq / rope_factor (0: none; GTE's NTK)
    local_window: int = 0  # ModernBERT: a local layer's token attends to |i - j| <= local_window
    global_every: int = 0  # ModernBERT: layer i is global when i % global_every == 0
    # decoder architectures (zoi.frontend.archs_decoder; 0 / false / () = absent)
    kv_heads: int = 0  # grouped KV heads (0: as many as heads)
    head_size: int = 0  # per-head width when it is not hidden // heads (Qwen3, Gemma3)
    norm: str = "layernorm"  # or "rmsnorm" (x / sqrt(mean(x^2) + eps) * w)
    causal: bool = False  # a token attends to itself and the tokens before it only
    qk_norm: bool = False  # RMSNorm of each q / k head before RoPE (Qwen3, Gemma3)
    attn_scale: float = 0.0  # scores scale (0: 1 / sqrt(head_dim); Gemma3: query_pre_attn_scalar)
    sandwich: bool = False  # Gemma3: the attention / MLP outputs are normed before the residual
    layer_windows: tuple = ()  # per layer: a token sees keys with |i - j| <= w (0: all)
    # sentence-transformers Dense modules after pooling: (in, out, bias, act) each
    dense: tuple = ()
    # task head (docs/ARCHITECTURE.md "Heads"): "" | seq_cls | token_cls | splade;
    # head_act: seq_cls's pooler activation (tanh, relu: DistilBERT), splade's transform act;
    # labels: id2label of the classifier (num_labels = len(labels))
    head: str = ""
    head_act: str = ""
    labels: tuple = ()
    # head_fn: seq_cls predict's default activation ("": sigmoid for 1 label, else identity)
    head_fn: str = ""
    # an LLM reranker (a seq_cls head read from a causal LM, zoi.frontend.heads): the vocabulary
    # ids (true[, false]) whose LM-head rows are the classifier on the last token;
    # score = logit[true] - logit[false] (logit[true] alone with one id)
    score_tokens: tuple = ()
    # task LoRA adapters chosen per sequence at run time (jina-embeddings-v3: zoi.frontend.
    # adapters): their names, in the order of the stacked `*.lora_a` / `*.lora_b` tensors, and
    # their rank; () / 0: none
    adapters: tuple = ()
    adapter_rank: int = 0

    def __post_init__(self):
        if not isinstance(self.labels, tuple):
            object.__setattr__(self, "labels", tuple(self.labels))
        if not isinstance(self.score_tokens, tuple):
            object.__setattr__(self, "score_tokens", tuple(self.score_tokens))
        if not isinstance(self.adapters, tuple):
            object.__setattr__(self, "adapters", tuple(self.adapters))
        if not isinstance(self.layer_windows, tuple):
            object.__setattr__(self, "layer_windows", tuple(self.layer_windows))
        if not isinstance(self.dense, tuple):
            object.__setattr__(self, "dense", tuple(tuple(d) for d in self.dense))
        if self.act not in SUPPORTED_ACTS:
            raise ValueError(
                f"ModelSpec.act {self.act!r} is not supported; zoi runs {', '.join(SUPPORTED_ACTS)}"
            )
        if self.pooling not in SUPPORTED_POOLING:
            raise ValueError(
                f"ModelSpec.pooling {self.pooling!r} is not supported; zoi runs "
                f"{', '.join(SUPPORTED_POOLING)}"
            )

    @property
    def head_dim(self) -> int:
        return self.head_size or self.hidden // self.heads

    @property
    def num_kv_heads(self) -> int:
        return self.kv_heads or self.heads

    @property
    def out_dim(self) -> int:
        """Width of the pooled embedding (after the Dense modules, if any)."""
        return int(self.dense[-1][1]) if self.dense else self.hidden

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> ModelSpec:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise ValueError(f"unknown ModelSpec fields {sorted(unknown)}")
        spec = cls(**d)
        spec.validate()
        return spec

    def validate(self) -> None:
        """Refuse values that make no sense (ValueError naming the field): every backend
        assumes them, and a bad one gives a crash or NaN far from its cause."""

        def count(name: str, lo: int) -> int:
            v = getattr(self, name)
            if type(v) is not int or v < lo:
                raise ValueError(f"{name} must be an integer >= {lo}, got {v!r}")
            return v

        if self.arch not in ARCHS:
            raise ValueError(f"arch must be one of {', '.join(ARCHS)}, got {self.arch!r}")
        for name in ("vocab_size", "hidden", "layers", "heads", "intermediate"):
            count(name, 1)
        count("max_positions", 2)  # [CLS] and [SEP]
        count("position_offset", 0)
        count("type_vocab_size", 0)
        count("kv_heads", 0)
        count("head_size", 0)
        if self.heads % self.num_kv_heads:
            raise ValueError(
                f"heads {self.heads} must be a multiple of kv_heads {self.num_kv_heads} "
                "(num_key_value_heads)"
            )
        if not self.head_size and self.hidden % self.heads:
            raise ValueError(
                f"hidden {self.hidden} must be a multiple of heads {self.heads} (head_dim)"
            )
        eps = self.eps
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 < eps < 1:
            raise ValueError(f"eps (layer_norm_eps) must be a number in (0, 1), got {eps!r}")
        if self.act not in SUPPORTED_ACTS:
            raise ValueError(f"act must be one of {SUPPORTED_ACTS}, got {self.act!r}")
        if self.pooling not in SUPPORTED_POOLING:
            raise ValueError(f"pooling must be one of {SUPPORTED_POOLING}, got {self.pooling!r}")
        if not isinstance(self.normalize, bool):
            raise ValueError(f"normalize must be true or false, got {self.normalize!r}")
        for name in ("embed_size", "rel_buckets", "rel_max_distance", "local_window"):
            count(name, 0)
        count("global_every", 0)
        for name in ("rope_theta", "rope_theta_local", "rope_factor"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < 1e12:
                raise ValueError(f"{name} must be a number >= 0, got {v!r}")
        if self.arch == "modernbert":
            if self.rope_theta <= 0 or self.head_dim % 2:
                raise ValueError(
                    f"modernbert needs rope_theta > 0 and an even head_dim, got "
                    f"{self.rope_theta!r} / {self.head_dim}"
                )
            if self.global_every < 1:
                raise ValueError(f"global_every must be >= 1, got {self.global_every!r}")
        if self.arch in ROTARY_ARCHS and (self.rope_theta <= 0 or self.head_dim % 2):
            raise ValueError(
                f"{self.arch} needs rope_theta > 0 and an even head_dim, got "
                f"{self.rope_theta!r} / {self.head_dim}"
            )
        if self.arch == "mpnet" and (self.rel_buckets < 2 or self.rel_max_distance < 1):
            raise ValueError(
                f"mpnet needs rel_buckets >= 2 and rel_max_distance >= 1, got "
                f"{self.rel_buckets!r} / {self.rel_max_distance!r}"
            )
        if not isinstance(self.name, str):
            raise ValueError(f"name must be a string, got {self.name!r}")
        self._validate_decoder()
        self._validate_head()
        self._validate_adapters()

    def _validate_adapters(self) -> None:
        ad, r = self.adapters, self.adapter_rank
        if type(r) is not int or r < 0 or r > 256:
            raise ValueError(f"adapter_rank must be an integer in [0, 256], got {r!r}")
        if not ad and not r:
            return
        if (
            not ad
            or r < 1
            or any(not isinstance(a, str) or not a for a in ad)
            or len(set(ad)) != len(ad)
        ):
            raise ValueError(
                "adapters must be distinct non-empty task names with adapter_rank >= 1, got "
                f"{ad!r} / rank {r!r}"
            )
        if self.head:
            raise ValueError(f"task adapters on a {self.head!r} head model are not supported")

    def _validate_decoder(self) -> None:
        if self.norm not in NORMS:
            raise ValueError(f"norm must be one of {NORMS}, got {self.norm!r}")
        for name in ("causal", "qk_norm", "sandwich"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false, got {getattr(self, name)!r}")
        a = self.attn_scale
        if isinstance(a, bool) or not isinstance(a, (int, float)) or not 0 <= a < 1e6:
            raise ValueError(f"attn_scale must be a number >= 0, got {a!r}")
        lw = self.layer_windows
        if lw and (len(lw) != self.layers or any(type(w) is not int or w < 0 for w in lw)):
            raise ValueError(
                f"layer_windows must hold one window >= 0 per layer ({self.layers}), got {lw!r}"
            )
        if self.arch in DECODER_ARCHS and (self.rope_theta <= 0 or self.head_dim % 2):
            raise ValueError(
                f"{self.arch} needs rope_theta > 0 and an even head_dim, got "
                f"{self.rope_theta!r} / {self.head_dim}"
            )
        width = self.hidden
        for d in self.dense:
            if (
                len(d) != 4
                or type(d[0]) is not int
                or type(d[1]) is not int
                or d[0] != width
                or not 0 < d[1] <= 1 << 16
                or not isinstance(d[2], bool)
                or d[3] not in ("none", "tanh", "relu", "gelu", "gelu_tanh", "sigmoid")
            ):
                raise ValueError(
                    f"dense: each module is (in, out, bias, act) with in = the width before it "
                    f"({width}), got {d!r}"
                )
            width = d[1]

    def _validate_head(self) -> None:
        if self.head not in HEADS:
            raise ValueError(f"head must be one of {HEADS}, got {self.head!r}")
        if self.head_act not in HEAD_ACTS:
            raise ValueError(f"head_act must be one of {HEAD_ACTS}, got {self.head_act!r}")
        if not all(isinstance(x, str) for x in self.labels):
            raise ValueError("labels must be a list of label names (str)")
        if self.head in ("seq_cls", "token_cls") and not self.labels:
            raise ValueError(f"head {self.head!r} needs labels (num_labels >= 1)")
        if self.head_fn not in ("", "sigmoid", "softmax", "identity"):
            raise ValueError(f"head_fn must be sigmoid, softmax or identity, got {self.head_fn!r}")
        if self.score_tokens:
            self._validate_score_tokens()
        elif self.head and not self.head_act and self.head != "token_cls":
            raise ValueError(f"head {self.head!r} needs head_act")

    def _validate_score_tokens(self) -> None:
        st = self.score_tokens
        if self.head != "seq_cls" or self.num_labels != 1 or self.head_act:
            raise ValueError(
                "score_tokens (an LLM reranker) need head 'seq_cls' with one label and no "
                f"head_act, got head {self.head!r}, {self.num_labels} labels, head_act "
                f"{self.head_act!r}"
            )
        if not 1 <= len(st) <= 2 or any(
            type(t) is not int or not 0 <= t < self.vocab_size for t in st
        ):
            raise ValueError(
                f"score_tokens must be one or two token ids (true[, false]) in [0, "
                f"{self.vocab_size}), got {st!r}"
            )
        if len(st) == 2 and st[0] == st[1]:
            raise ValueError(f"score_tokens: the true and false tokens are one id {st[0]}")
        if self.pooling != "last":
            raise ValueError(
                f"score_tokens read the last token's logits: pooling must be 'last', got "
                f"{self.pooling!r}"
            )

    @property
    def num_labels(self) -> int:
        return len(self.labels)

    def replace(self, **kw) -> ModelSpec:
        return dataclasses.replace(self, **kw)
