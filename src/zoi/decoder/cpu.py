"""The CPU DecoderBackend: zoi._cpu.DecoderModel (csrc/decoder/) behind the paged bookkeeping of
zoi.decoder.paged. Weights are packed here (one layout for every ISA: panels of 32 output
channels, [panel][K][32]), q/k/v and gate/up concatenated into one GEMM each; precision "int8"
stores per-channel symmetric INT8 weights (zoi.numerics.primitives.quantize_weight) with FP32
activations; "w8a8" also quantises each linear's input rows per token (symmetric INT8) and runs
the encoders' INT8 GEMM of csrc/kernels (VNNI / AVX-512 / AVX2 / scalar). The KV pool and every buffer of a step are allocated at construction; a step is one
native call (prefill chunks and decode tokens packed together) with the GIL released.
"""

from __future__ import annotations

import numpy as np

from zoi.decoder.api import DecoderSpec
from zoi.decoder.memory import FLAGS, Part
from zoi.decoder.paged import PagedBackend
from zoi.decoder.reference import rope_cos_sin, rope_inv_freq
from zoi.errors import InputError
from zoi.numerics.primitives import dequantize_weight, quantize_weight

PANEL = 32
DEFAULT_MAX_TOKENS = 512
MAX_HEAD_DIM, MAX_BLOCK_SIZE, MAX_BATCH = 512, 256, 1024  # csrc/decoder (kDecMaxD, kDecMaxBlock)


def pack_panels(w: np.ndarray) -> np.ndarray:
    """[N, K] -> [ceil(N / 32), K, 32] (zero columns pad N), the layout of csrc/decoder."""
    N, K = w.shape
    Np = -(-N // PANEL) * PANEL
    p = np.zeros((Np, K), w.dtype)
    p[:N] = w
    return np.ascontiguousarray(p.reshape(Np // PANEL, PANEL, K).transpose(0, 2, 1))


def _linears(spec: DecoderSpec, w: dict, i: int) -> dict[str, np.ndarray]:
    p = f"model.layers.{i}."
    a = p + "self_attn."
    return {
        "qkv": np.concatenate(
            [w[a + "q_proj.weight"], w[a + "k_proj.weight"], w[a + "v_proj.weight"]]
        ),
        "o": w[a + "o_proj.weight"],
        "gu": np.concatenate([w[p + "mlp.gate_proj.weight"], w[p + "mlp.up_proj.weight"]]),
        "d": w[p + "mlp.down_proj.weight"],
    }


def int8_weights(weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The weights an int8 backend computes with, dequantised (the reference for its kernels):
    every projection and lm_head rounded per output channel; embeddings and norms as given."""
    out = dict(weights)
    for k, v in weights.items():
        if k.endswith("_proj.weight") or k == "lm_head.weight":
            if k == "lm_head.weight" and v is weights.get("model.embed_tokens.weight"):
                v = np.array(v)
            out[k] = dequantize_weight(*quantize_weight(v))
    return out


class CpuBackend(PagedBackend):
    def __init__(
        self,
        spec: DecoderSpec,
        weights: dict[str, np.ndarray],
        precision: str = "fp32",
        num_blocks: int = 64,
        block_size: int = 16,
        max_batch: int = 8,
        max_seq_len: int | None = None,
        max_tokens: int | None = None,
        threads: int | None = None,
        isa: str | None = None,
        options=None,
    ):
        from zoi import _cpu
        from zoi.backends.cpu.options import apply_cpu_options

        if precision not in ("fp32", "int8", "w8a8"):
            raise InputError(
                f"precision {precision!r}: the CPU decoder runs 'fp32', 'int8' or 'w8a8'"
            )
        # the native core's limits, checked here to name the option (its own message lumps them)
        if spec.head_dim > MAX_HEAD_DIM:
            raise InputError(
                f"the model's head_dim {spec.head_dim} is over the CPU decoder's limit of "
                f"{MAX_HEAD_DIM}"
            )
        for name, v, hi in (
            ("block_size", block_size, MAX_BLOCK_SIZE),
            ("max_batch", max_batch, MAX_BATCH),
        ):
            if isinstance(v, int) and v > hi:
                flag = f" (zoi serve {FLAGS[name]})" if name in FLAGS else ""
                raise InputError(
                    f"{name}={v}{flag} is out of range for the CPU decoder: it must lie in "
                    f"[1, {hi}]"
                )
        max_tokens = max_tokens or DEFAULT_MAX_TOKENS
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise InputError(f"max_tokens must be a positive integer, got {max_tokens!r}")
        self.precision = precision
        self.max_tokens = max_tokens  # sizes the step buffers _host_parts counts
        super().__init__(spec, num_blocks, block_size, max_batch, max_seq_len)
        int8 = precision in ("int8", "w8a8")
        raw = precision == "w8a8"
        # the core's process-wide switches (CpuOptions; None: from the environment) before it
        # builds the model: isa=None takes options.isa
        self.options = apply_cpu_options(options)
        self.model = m = _cpu.DecoderModel(
            vocab=spec.vocab_size,
            hidden=spec.hidden_size,
            inter=spec.intermediate_size,
            layers=spec.num_layers,
            heads=spec.num_heads,
            kv_heads=spec.num_kv_heads,
            head_dim=spec.head_dim,
            eps=spec.rms_norm_eps,
            qk_norm=spec.qk_norm,
            wtype={"fp32": 0, "int8": 1, "w8a8": 2}[precision],
            max_tokens=self.max_tokens,
            max_batch=max_batch,
            num_blocks=num_blocks,
            block_size=block_size,
            max_blocks=self.max_blocks_per_seq,
            max_pos=self.max_seq_len,
            nthreads=threads or 0,
            isa=isa or "",
        )

        def put(layer: int, slot: str, a: np.ndarray) -> None:
            m.set(layer, slot, np.ascontiguousarray(a).reshape(-1).view(np.uint8))

        def put_linear(layer: int, slot: str, w: np.ndarray) -> None:
            w = np.asarray(w, np.float32)
            if raw:  # the core packs them for its INT8 GEMM
                q, s = quantize_weight(w)
                put(layer, slot + "_w", q)
                put(layer, slot + "_s", s)
            elif int8:
                q, s = quantize_weight(w)
                put(layer, slot + "_w", pack_panels(q))
                sp = np.zeros(-(-len(s) // PANEL) * PANEL, np.float32)
                sp[: len(s)] = s
                put(layer, slot + "_s", sp)
            else:
                put(layer, slot + "_w", pack_panels(w))

        f32 = np.float32
        put(-1, "embed", weights["model.embed_tokens.weight"].astype(f32))
        put(-1, "norm", weights["model.norm.weight"].astype(f32))
        cos, sin = rope_cos_sin(rope_inv_freq(spec), np.arange(self.max_seq_len))
        put(-1, "cos", cos)
        put(-1, "sin", sin)
        put_linear(-1, "lm", weights["lm_head.weight"])
        for i in range(spec.num_layers):
            p = f"model.layers.{i}."
            put(i, "ln1", weights[p + "input_layernorm.weight"].astype(f32))
            put(i, "ln2", weights[p + "post_attention_layernorm.weight"].astype(f32))
            for slot, w in _linears(spec, weights, i).items():
                put_linear(i, slot, w)
            if spec.attention_bias:
                a = p + "self_attn."
                put(
                    i,
                    "qkv_b",
                    np.concatenate([weights[a + n + "_proj.bias"] for n in "qkv"]).astype(f32),
                )
            if p + "self_attn.o_proj.bias" in weights:
                put(i, "o_b", weights[p + "self_attn.o_proj.bias"].astype(f32))
            if spec.qk_norm:
                put(i, "qn", weights[p + "self_attn.q_norm.weight"].astype(f32))
                put(i, "kn", weights[p + "self_attn.k_norm.weight"].astype(f32))
        m.finalize()
        self._out = np.empty(max_batch, np.int32)

    def _host_parts(self, spec, num_blocks, block_size, max_batch, max_seq_len) -> list[Part]:
        """The pool and tables (PagedBackend) and the native core's buffers (csrc/decoder/model.cc:
        activations of max_tokens rows, logits and sort buffers of max_batch x vocab rows, the
        RoPE tables, the packed weights)."""
        T, H, D, I, V = (
            self.max_tokens,
            spec.hidden_size,
            spec.head_dim,
            spec.intermediate_size,
            spec.vocab_size,
        )
        nq = (spec.num_heads + 2 * spec.num_kv_heads) * D
        act = 4 * T * (3 * H + nq + spec.num_heads * D + 3 * I + 2)
        samp = max_batch * (4 * (H + V + 1) + (4 + 8) * V)
        wb = 4 if self.precision == "fp32" else 1
        linears = spec.num_layers * (nq * H + H * spec.num_heads * D + 3 * I * H) + V * H
        weights = wb * linears + 4 * V * H  # the embedding table stays float32
        return super()._host_parts(spec, num_blocks, block_size, max_batch, max_seq_len) + [
            Part(f"step activations (max_tokens={T} tokens)", "max_tokens", act),
            Part(f"sampling buffers (max_batch={max_batch} x vocab {V})", "max_batch", samp),
            Part(f"RoPE tables (max_seq_len={max_seq_len})", "max_seq_len", 8 * max_seq_len * D),
            Part(f"packed weights ({self.precision})", None, weights),
        ]

    @property
    def isa(self) -> str:
        return self.model.isa

    def _run(self, rows, starts, counts, ids, samp, seeds) -> np.ndarray:
        """One native call when the tokens fit max_tokens, else chunks (a long prompt's prefill is
        cut; only its last chunk samples)."""
        B = len(rows)
        result = np.full(B, -1, np.int32)
        offs = np.concatenate([[0], np.cumsum(counts)])
        cap = self.max_tokens
        todo = [(b, int(starts[b]), 0) for b in range(B)]  # entry, next position, tokens done
        while todo:
            ent, tok, left, nxt = [], [], cap, []
            for b, s, done in todo:
                n = int(counts[b]) - done
                if left <= 0:
                    nxt.append((b, s, done))
                    continue
                k = min(n, left)
                ent.append((b, s, k, k == n))
                tok.append(ids[offs[b] + done : offs[b] + done + k])
                left -= k
                if k < n:
                    nxt.append((b, s + k, done + k))
            self._native(ent, np.concatenate(tok), rows, samp, seeds, result)
            todo = nxt
        return result

    def _native(self, ent, ids, rows, samp, seeds, result) -> None:
        n = len(ent)
        b = np.fromiter((e[0] for e in ent), np.int64, n)
        out = self._out[:n]
        self.model.step(
            np.ascontiguousarray(ids, np.int32),
            np.ascontiguousarray(rows[b], np.int32),
            np.fromiter((e[1] for e in ent), np.int32, n),
            np.fromiter((e[2] for e in ent), np.int32, n),
            np.fromiter((e[3] for e in ent), np.int32, n),
            np.ascontiguousarray(samp[b, :3]),
            np.ascontiguousarray(seeds[b], np.uint64),
            np.ascontiguousarray(samp[b, 3], np.int64),
            self.block_tables,
            out,
        )
        for j, e in enumerate(ent):
            if e[3]:
                result[e[0]] = out[j]

    def last_logits(self) -> np.ndarray:
        """Logits [n, vocab] of the entries the last native call sampled (tests)."""
        return self.model.logits()
