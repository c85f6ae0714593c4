"""`zoi generate MODEL "prompt"`: stream a decoder's completion to stdout."""

from __future__ import annotations

import sys
import time


def cmd_generate(args) -> int:
    from zoi.decoder.compile import compile_decoder

    prompt = args.prompt
    if prompt == "-" or prompt is None:
        prompt = sys.stdin.read()
    g = compile_decoder(
        args.model,
        device=args.device,
        precision=args.precision,
        max_seq_len=args.max_seq_len,
        threads=args.threads,
    )
    kw = dict(
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        stop=args.stop or None,
        seed=args.seed,
    )
    t0 = time.perf_counter()
    n = 0
    if args.chat:
        it = g.chat([{"role": "user", "content": prompt}], stream=True, **kw)
    else:
        it = g.stream(prompt, **kw)
    first = None
    for delta in it:
        if first is None:
            first = time.perf_counter() - t0
        n += 1
        sys.stdout.write(delta)
        sys.stdout.flush()
    sys.stdout.write("\n")
    if args.verbose:
        dt = time.perf_counter() - t0
        print(
            f"[{g.name}: {g.precision} on {g.backend.isa if hasattr(g.backend, 'isa') else g.device}; "
            f"first text {1e3 * (first or 0):.1f} ms, {dt:.2f} s total]",
            file=sys.stderr,
        )
    return 0


def register(sub) -> None:
    p = sub.add_parser(
        "generate", help="generate text with a decoder (Llama / Qwen2 / Qwen3 folder)"
    )
    p.add_argument("model", help="Hugging Face decoder folder")
    p.add_argument("prompt", nargs="?", default=None, help="prompt text ('-' or none: stdin)")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0, help="under 1e-5 (0 included): greedy")
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument(
        "--chat", action="store_true", help="wrap the prompt as a user message (chat template)"
    )
    p.add_argument("--device", default="cpu", choices=["cpu", "reference", "cuda"])
    p.add_argument(
        "--precision",
        default="fp32",
        choices=["fp32", "int8", "w8", "fp16", "w8a8"],
        help="int8: W8A8 (INT8 weights and activations; w8a8 means the same); w8: weight-only "
        "INT8 and fp16 on --device cuda only (default fp32)",
    )
    p.add_argument("--max-seq-len", type=int, default=None)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("-v", "--verbose", action="store_true", help="timing on stderr")
    p.set_defaults(func=cmd_generate)
