"""The public entry points behind `zoi.compile` / `zoi.load`: which compiler a folder goes to.

The package root only names things (zoi/__init__.py); the routing lives here so that the root
stays a list of names and `import zoi` stays cheap (nothing heavy is imported until a call).
"""

from __future__ import annotations


def compile(  # noqa: A001
    path=None,
    device: str = "cpu",
    precision: str = "fp32",
    max_tokens=None,
    max_batch=None,
    calibration=None,
    quant_config=None,
    progress: bool = False,
    tokenizer=None,
    weight_bits=None,
    **decoder_options,
):
    """zoi.engine.compile (encoders: an Engine); a decoder folder (Llama / Qwen2 / Qwen3) gives a
    zoi.decoder Generator instead (decoder_options: max_seq_len, kv_blocks, block_size, threads,
    isa; docs/DECODERS.md); for an encoder they are engine.compile's (truncate_dim, pooling,
    task: "rerank" compiles a decoder folder as an LLM reranker, docs/RERANK.md).
    tokenizer: an encoder's tokenizer, "auto" / "native" / "hf" (None: ZOI_TOKENIZER, else
    "auto"; zoi.frontend.tokenizer.tokenizer_choice); a decoder's text goes through HF
    tokenizers.
    weight_bits (INT8): 8 (None, the default), 7 or "auto" (7-bit weights per linear where the
    quantiser measures they cost little: the AVX2 kernel's cheaper loop; docs/QUANT.md)."""
    if weight_bits is not None:
        from zoi.quant.gptq import with_weight_bits

        quant_config = with_weight_bits(quant_config, weight_bits)
    if path is not None:
        from zoi.decoder.compile import decoder_folder

        folder = decoder_folder(path, decoder_options.get("task"))
        if folder is not None:
            from zoi.decoder.compile import compile_decoder

            if tokenizer is not None and str(tokenizer).strip().lower() == "native":
                raise ValueError(
                    f"tokenizer={tokenizer!r}: {path} is a decoder folder, whose text goes "
                    "through HF tokenizers; leave tokenizer unset for it"
                )

            return compile_decoder(
                folder,
                device=device,
                precision=precision,
                max_batch=max_batch,
                max_tokens=max_tokens,
                calibration=calibration,
                quant_config=quant_config,
                **decoder_options,
            )
    from zoi import engine

    # encoder options (truncate_dim, ...) go on to engine.compile, which refuses unknown ones
    return engine.compile(
        path,
        device=device,
        precision=precision,
        max_tokens=max_tokens,
        max_batch=max_batch,
        calibration=calibration,
        quant_config=quant_config,
        progress=progress,
        tokenizer=tokenizer,
        **decoder_options,
    )


def load(path, device=None, max_tokens=None, tokenizer=None):
    """zoi.engine.load: an artifact written by Engine.save. tokenizer: "auto" / "native" /
    "hf" (None: ZOI_TOKENIZER, else "auto")."""
    from zoi import engine

    return engine.load(path, device=device, max_tokens=max_tokens, tokenizer=tokenizer)
