"""The `zoi` command line: info, compile, convert, encode, demo, eval, bench, serve, export, deploy."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from zoi._version import __version__
from zoi.tools.info import _console, cmd_info


# ---- compile / encode ----------------------------------------------------------------------
def _open_engine(args, progress: bool = True):
    import zoi
    from zoi.engine import is_artifact

    pooling = getattr(args, "pooling", None)
    if args.model and is_artifact(args.model):
        if getattr(args, "task", None):
            raise ValueError(
                f"--task {args.task}: {args.model} is an artifact, compiled already; give "
                "--task when compiling the model folder"
            )
        eng = zoi.load(args.model, device=args.device, max_tokens=args.max_tokens)
        if pooling is not None and pooling != eng.spec.pooling:
            raise ValueError(
                f"--pooling {pooling}: {args.model} is an artifact compiled with pooling "
                f"{eng.spec.pooling!r}; compile the model folder again with --pooling {pooling}"
            )
        return eng
    return zoi.compile(
        args.model,
        device=args.device or "cpu",
        precision=args.precision,
        max_tokens=args.max_tokens,
        **_calibration_kwargs(args),
        progress=progress,
        **({"pooling": pooling} if pooling is not None else {}),
        **({"task": args.task} if getattr(args, "task", None) else {}),
        **({"weight_bits": args.weight_bits} if getattr(args, "weight_bits", None) else {}),
    )


def _calibration_kwargs(args) -> dict:
    """zoi.compile's calibration / quant_config from --calibrate FILE and --calibration BUDGET
    (both: the file's texts with the budget's QuantConfig preset)."""
    texts, budget = getattr(args, "calibrate", None), getattr(args, "calibration", None)
    if texts is not None and budget is not None:
        from zoi.quant.config import QuantConfig

        return {"calibration": texts, "quant_config": QuantConfig.preset(budget)}
    return {"calibration": texts if texts is not None else budget}


def cmd_compile(args) -> int:
    con = _console()
    t0 = time.perf_counter()
    eng = _open_engine(args)
    out = eng.save(args.output)
    mem = eng.memory()
    con.print(f"[green]compiled[/] {eng!r} in {time.perf_counter() - t0:.1f} s -> {out}")
    con.print(
        f"weights {mem['weights_bytes'] / 2**20:.1f} MiB, arena {mem['arena_bytes'] / 2**20:.1f} MiB"
    )
    return 0


def cmd_convert(args) -> int:
    """The folder's PyTorch pickles that zoi reads (BGE-M3's heads, Dense modules) as
    safetensors, read by torch's weights_only loader in a child process (zoi.frontend.convert)."""
    from zoi.frontend.convert import convert_folder

    done = convert_folder(args.folder, python=args.python, force=args.force)
    if not done:
        print(
            f"{args.folder}: nothing to convert (no sparse_linear / colbert_linear pickle, no "
            "Dense module pytorch_model.bin)"
        )
    for c in done:
        shapes = ", ".join(f"{k} {v}" for k, v in c.shapes.items())
        print(f"{c.status}: {c.dst} (from {c.src.name}: {shapes})")
    return 0


# `zoi encode -f`: a file (or stdin) of any size runs in chunks, its embeddings streamed to
# the output, so memory holds one chunk whatever the input; a line is read up to a cap, so a
# file without newlines (a device, a binary) fails at once instead of filling memory
MAX_LINE_BYTES = 1 << 20  # default --max-line-bytes: far past what a model reads of one text
CHUNK_TEXTS = 4096  # texts per engine call of `zoi encode -f`
CHUNK_BYTES = 16 << 20  # ... or fewer, when they hold this many bytes


def _read_line(fh, cap: int):
    """The next line of fh (binary or text) without its newline, None at the end; a line of
    more than `cap` bytes (characters for a text stream) is refused by the caller: this reads
    at most cap + 1 of it."""
    line = fh.readline(cap + 1)
    if not line:
        return None, False
    nl = "\n" if isinstance(line, str) else b"\n"
    if line.endswith(nl):
        return line[:-1], False
    return line, len(line) > cap


def iter_lines(fh, name: str, cap: int = MAX_LINE_BYTES):
    """The texts of `zoi encode -f`, one per line, blank lines included: row i of the output is
    line i + 1 of the input. Lines end at "\n" ("\r\n" too); bytes are decoded as UTF-8.
    A line longer than `cap` bytes is an error naming it (the engine reads only the first
    max_positions tokens of a text, a few KiB, so such a line is a wrong file or needs
    splitting), raised before any of it is kept."""
    n = 0
    while True:
        raw, over = _read_line(fh, cap)
        if raw is None:
            return
        n += 1
        if over:
            raise ValueError(
                f"{name}: line {n} is longer than the limit of {cap} bytes per line "
                "(--max-line-bytes); `zoi encode -f` reads one text per line: split the text "
                "into lines, or raise --max-line-bytes (a model reads only its first "
                "max_positions tokens of a text)"
            )
        if raw[-1:] in ("\r", b"\r"):  # a CRLF file
            raw = raw[:-1]
        if isinstance(raw, bytes):
            try:
                raw = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise ValueError(
                    f"{name}: line {n} is not valid UTF-8 ({e.reason} at byte {e.start} of the "
                    "line); save the file as UTF-8"
                ) from None
        yield raw


def iter_chunks(lines, max_texts: int | None = None, max_bytes: int | None = None):
    """Consecutive lists of texts, each at most max_texts texts or about max_bytes bytes
    (default CHUNK_TEXTS, CHUNK_BYTES)."""
    max_texts = max_texts or CHUNK_TEXTS
    max_bytes = max_bytes or CHUNK_BYTES
    chunk: list[str] = []
    size = 0
    for t in lines:
        chunk.append(t)
        size += len(t) + 1
        if len(chunk) >= max_texts or size >= max_bytes:
            yield chunk
            chunk, size = [], 0
    if chunk:
        yield chunk


def _text_chunks(args):
    """The texts of `zoi encode` in chunks, and the name of their source."""
    if args.texts:
        return iter([list(args.texts)]), "argv"
    cap = args.max_line_bytes
    if cap < 1:
        raise ValueError(f"--max-line-bytes must be >= 1, got {cap}")
    if args.file and args.file != "-":
        fh = open(args.file, "rb")  # closed by lines() below, at the end or on an error

        def lines():
            with fh:
                yield from iter_lines(fh, args.file, cap)

        return iter_chunks(lines()), args.file
    src = getattr(sys.stdin, "buffer", sys.stdin)
    return iter_chunks(iter_lines(src, "stdin", cap)), "stdin"


OUTPUT_FORMATS = {".json": "JSON", ".npy": "a numpy array", ".csv": "CSV, one row per text"}
PROGRESS_AUTO_TEXTS = 100  # `zoi encode` shows a bar by itself above this many texts on a tty


def _output_format(path: str | None) -> str | None:
    """The format `-o PATH` asks for, from its extension; unknown extensions are refused
    (before any work) rather than silently written as JSON."""
    if path is None:
        return None
    ext = Path(path).suffix.lower()
    if ext not in OUTPUT_FORMATS:
        known = ", ".join(f"{k} ({v})" for k, v in OUTPUT_FORMATS.items())
        raise ValueError(
            f"-o {path}: unknown output format {ext or '(no extension)'!r}; name the file "
            f"with one of {known}"
        )
    return ext


class _EmbeddingWriter:
    """The embeddings of `zoi encode`, written chunk by chunk: JSON (stdout or a file), .npy
    (its header rewritten with the row count at the end) or CSV. A file is written beside its
    name and renamed when complete, so an error leaves no partial output file."""

    NPY_HEADER = 128  # bytes: room for any row count, a multiple of 64 as numpy aligns them

    def __init__(self, fmt: str | None, path: str | None, model: str):
        self.fmt, self.path, self.model = fmt, path, model
        self.rows, self.dim = 0, None
        self.tmp = None
        if path is None:
            self.fh = sys.stdout
        else:
            dest = Path(path)
            self.tmp = dest.with_name(f".{dest.name}.part-{os.getpid()}")
            self.fh = open(
                self.tmp,
                "wb" if fmt == ".npy" else "w",
                encoding=None if fmt == ".npy" else "utf-8",
            )

    def _npy_header(self) -> bytes:
        d = f"{{'descr': '<f4', 'fortran_order': False, 'shape': ({self.rows}, {self.dim}), }}"
        body = d.ljust(self.NPY_HEADER - 10 - 1) + "\n"
        return b"\x93NUMPY\x01\x00" + len(body).to_bytes(2, "little") + body.encode("latin1")

    def write(self, emb: np.ndarray, width: int | None = None) -> None:
        """Rows of embeddings; `width`: the row width when emb has no rows to tell it."""
        emb = np.ascontiguousarray(emb, dtype=np.float32)
        emb = emb.reshape(len(emb), -1) if emb.size else emb.reshape(0, width or 0)
        first = self.dim is None
        if first:
            self.dim = int(emb.shape[1])
            if self.fmt == ".npy":
                self.fh.write(self._npy_header())  # rewritten with the row count at the end
            elif self.fmt is None or self.fmt == ".json":
                self.fh.write(
                    f'{{"model": {json.dumps(self.model)}, "dim": {self.dim}, "embeddings": ['
                )
        if self.fmt == ".npy":
            self.fh.write(emb.astype("<f4").tobytes())
        elif self.fmt == ".csv":
            np.savetxt(self.fh, emb, fmt="%.9g", delimiter=",")
        else:
            body = ", ".join(json.dumps([round(float(v), 7) for v in row]) for row in emb)
            if body:
                self.fh.write((", " if self.rows else "") + body)
        self.rows += len(emb)

    def close(self) -> str | None:
        """Finish the output; the message for stderr (None for stdout)."""
        if self.fmt == ".npy":
            self.fh.seek(0)
            self.fh.write(self._npy_header())
        elif self.fmt in (None, ".json"):
            self.fh.write("]}")
            if self.path is None:
                self.fh.write("\n")
        if self.path is None:
            self.fh.flush()
            return None
        self.fh.close()
        os.replace(self.tmp, self.path)
        self.tmp = None
        if self.fmt == ".npy":
            return f"wrote ({self.rows}, {self.dim}) float32 to {self.path}"
        if self.fmt == ".csv":
            return f"wrote {self.rows} embeddings as CSV rows to {self.path}"
        return f"wrote {self.rows} embeddings to {self.path}"

    def abort(self) -> None:
        if self.tmp is not None:
            self.fh.close()
            Path(self.tmp).unlink(missing_ok=True)
            self.tmp = None


def _line_error(e: Exception, source: str, first_line: int) -> Exception:
    """An engine error about texts[i] of a chunk, told as the line of the input it is."""
    import re

    if source == "argv":
        return e
    msg = re.sub(
        r"texts\[(\d+)\]",
        lambda m: f"line {first_line + int(m.group(1))} of {source}",
        str(e),
    ).replace("pass truncate=True", "leave out --no-truncate")
    return type(e)(msg)


def cmd_encode(args) -> int:
    from zoi.errors import InputError

    fmt = _output_format(args.output)
    chunks, source = _text_chunks(args)
    eng = _open_engine(args, progress=False)
    norm = None if args.normalize is None else args.normalize == "yes"
    out = _EmbeddingWriter(fmt, args.output, eng.spec.name)
    bar = None
    done = 0
    try:
        for chunk in chunks:
            if bar is None and done == 0:
                show = args.progress
                if show is None:  # many texts (a full first chunk: more to come) on a terminal
                    show = len(chunk) > PROGRESS_AUTO_TEXTS and sys.stderr.isatty()
                if show:
                    from tqdm.auto import tqdm

                    bar = tqdm(
                        total=len(chunk) if source == "argv" else None, desc="encode", unit="text"
                    )
            try:
                emb = eng.encode(
                    chunk,
                    batch_size=args.batch_size,
                    normalize_embeddings=norm,
                    show_progress_bar=False,
                    truncate=not args.no_truncate,
                )
            except (InputError, ValueError, TypeError) as e:
                raise _line_error(e, source, done + 1) from None
            out.write(emb)
            done += len(chunk)
            if bar is not None:
                bar.update(len(chunk))
        if out.dim is None:  # no text at all: the model's width, as for any other input
            out.write(eng.encode([], normalize_embeddings=norm), eng.spec.hidden)
        msg = out.close()
    except BaseException:
        out.abort()
        raise
    finally:
        if bar is not None:
            bar.close()
    if msg:
        print(msg, file=sys.stderr)
    return 0


# ---- demo ----------------------------------------------------------------------------------
DEMO_SENTENCES = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The girl is carrying a baby.",
    "A man is riding a horse.",
    "A woman is playing violin.",
    "Two men pushed carts through the woods.",
    "A man is riding a white horse on an enclosed ground.",
    "A monkey is playing drums.",
]


def _median_ms(fn, n: int) -> float:
    fn()
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return float(np.median(ts) * 1e3)


def cmd_demo(args) -> int:
    from rich.table import Table

    from zoi.engine import default_model_path

    con = _console()
    con.print(f"[bold]zoi demo[/]: all-MiniLM-L6-v2 (bundled), compiled for {args.device}")
    engines = {p: _demo_engine(con, args, p) for p in args.precisions}
    main = engines[args.precisions[-1]]
    emb = main.encode(DEMO_SENTENCES)
    sims = emb @ emb.T
    t = Table(title=f"cosine similarity ({main.precision})")
    t.add_column("sentence")
    t.add_column("most similar")
    t.add_column("cos", justify="right")
    for i, s in enumerate(DEMO_SENTENCES):
        j = int(np.argsort(-sims[i])[1])
        t.add_row(s, DEMO_SENTENCES[j], f"{sims[i, j]:.3f}")
    con.print(t)
    long_text = " ".join(DEMO_SENTENCES * 8)
    ids = main.tokenize([long_text])[0][:128]
    n = args.iters

    def zoi_rows():
        rows = []
        for p, e in engines.items():
            ms16 = _median_ms(
                lambda e=e: e.run_packed(ids[:16], np.arange(16), np.array([0, 16])), n
            )
            ms128 = _median_ms(
                lambda e=e: e.run_packed(ids, np.arange(len(ids)), np.array([0, len(ids)])), n
            )
            rows.append((f"zoi {e.device} {p}", ms16, ms128))
        return rows

    measure, ref = zoi_rows, None
    try:
        import torch
        from transformers import AutoModel

        torch.set_num_threads(len(os.sched_getaffinity(0)))
        tm = AutoModel.from_pretrained(str(default_model_path())).eval()

        def tfwd(k):
            with torch.inference_mode():
                x = torch.from_numpy(ids[:k].astype(np.int64))[None]
                h = tm(input_ids=x, attention_mask=torch.ones_like(x)).last_hidden_state
                return h.mean(1).numpy()

        ref = tfwd(len(ids))[0]

        def measure():
            torch_row = (
                f"PyTorch {torch.__version__} eager fp32",
                _median_ms(lambda: tfwd(16), n),
                _median_ms(lambda: tfwd(len(ids)), n),
            )
            return [*zoi_rows(), torch_row]

    except ImportError:
        con.print("[yellow]PyTorch/transformers not installed: skipping the PyTorch comparison[/]")
    from zoi.bench.sysinfo import LoadMeter

    rows, load = timed_under_load(
        measure, LoadMeter(), args.max_load, args.load_wait, log=con.print
    )
    if ref is not None:
        for p, e in engines.items():
            z = e.run_packed(ids, np.arange(len(ids)), np.array([0, len(ids)]))[0]
            con.print(
                f"cosine zoi {p} vs PyTorch on the 128-token text: {np.dot(z, ref) / np.linalg.norm(z) / np.linalg.norm(ref):.6f}"
            )
    tt = Table(title=f"latency, one sequence, p50 of {n} calls ({os.cpu_count()} cores)")
    for c in ("engine", "1x16 ms", "1x128 ms", "speed-up vs PyTorch (1x128)"):
        tt.add_column(c, justify="right" if c != "engine" else "left")
    base = rows[-1][2] if rows[-1][0].startswith("PyTorch") else None
    for name, a, b in rows:
        tt.add_row(name, f"{a:.2f}", f"{b:.2f}", f"{base / b:.1f}x" if base else "-")
    con.print(tt)
    con.print(load_line(load), highlight=False)
    return 0


def _demo_engine(con, args, precision: str):
    """The bundled model compiled for `precision`, through the artifact cache unless
    --no-cache (INT8 calibration takes about a minute; a cached artifact loads in a second)."""
    import zoi

    if args.no_cache:
        return zoi.compile(device=args.device, precision=precision, progress=True)
    from zoi.cache import cached_compile

    t0 = time.perf_counter()
    eng, how, entry = cached_compile(device=args.device, precision=precision, progress=True)
    took = time.perf_counter() - t0
    if how == "cached":
        con.print(f"{precision}: cached artifact {entry} loaded in {took:.1f} s", highlight=False)
    else:
        con.print(f"{precision}: compiled in {took:.1f} s, cached in {entry}", highlight=False)
    return eng


def timed_under_load(measure, meter, max_load: float, wait_s: float, log=print):
    """Run `measure()` (-> rows) while watching the CPU other processes use. When they used
    more than `max_load` cores, wait (at most `wait_s`) for a quieter machine and measure once
    more. Returns (rows, load): load says the other processes' cores during the kept run,
    how many runs were made and whether the machine was quiet."""
    runs = 0
    while True:
        runs += 1
        meter.start()
        rows = measure()
        other = meter.stop()
        if other <= max_load or runs == 2:
            break
        log(
            f"[yellow]other processes used {other:.2f} cores while timing (more than "
            f"{max_load}): waiting up to {wait_s:.0f} s for a quieter machine, then timing again"
        )
        meter.wait_quiet(max_load, wait_s, log=lambda *a, **k: None)
    from zoi.bench.sysinfo import loadavg

    return rows, {
        "other_cores": round(other, 3),
        "max_load": max_load,
        "runs": runs,
        "quiet": other <= max_load,
        "loadavg": loadavg(),
        "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
    }


def load_line(load: dict) -> str:
    la = load.get("loadavg")
    s = (
        f"machine load while timing: other processes used {load['other_cores']:.2f} cores"
        + (f" of {load['cores']}" if load.get("cores") else "")
        + (f" (loadavg {la[0]:.2f} {la[1]:.2f} {la[2]:.2f})" if la else "")
        + (f", timed {load['runs']} times" if load["runs"] > 1 else "")
    )
    if load["quiet"]:
        return s + "."
    return (
        "[yellow]warning:[/] "
        + s
        + f": more than {load['max_load']} cores, so these latencies are noisy (other work "
        "shares the cores); rerun `zoi demo` on a quiet machine, or use `zoi bench`, which waits "
        "for quiet and records the load"
    )


# ---- entry ---------------------------------------------------------------------------------
def _add_engine_args(p, with_output: bool) -> None:
    p.add_argument(
        "model",
        nargs="?" if not with_output else None,
        default=None,
        help="Hugging Face model folder or zoi artifact (default: bundled all-MiniLM-L6-v2)",
    )
    p.add_argument("--device", default=None, choices=["auto", "cpu", "cuda", "reference"])
    p.add_argument("--precision", default="fp32", choices=["fp32", "int8", "fp16", "fp8"])
    p.add_argument(
        "--max-tokens", type=int, default=None, help="tokens per backend call (arena size)"
    )
    p.add_argument(
        "--calibrate", default=None, metavar="FILE", help="INT8 calibration texts, one per line"
    )
    _add_calibration_arg(p)
    _add_pooling_arg(p)


def _add_calibration_arg(p) -> None:
    from zoi.quant.config import CALIBRATION_BUDGETS

    p.add_argument(
        "--calibration",
        default=None,
        choices=list(CALIBRATION_BUDGETS),
        help="INT8 compile budget: fast (least quantiser time), default (meets zoi's fidelity "
        "targets on all-MiniLM-L6-v2), thorough (SmoothQuant candidates scored with the "
        "GPTQ rounding that ships, ~3x the quantiser time); docs/QUANT.md",
    )


def _add_pooling_arg(p) -> None:
    from zoi.frontend.spec import SUPPORTED_POOLING

    p.add_argument(
        "--pooling",
        default=None,
        choices=list(SUPPORTED_POOLING),
        help="pooling of the embeddings (default: the folder's sentence-transformers Pooling "
        "config; without one, sentence-transformers' default for a plain folder: mean)",
    )


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="zoi", description="ZeroOverhead-Inference: compile once, run small encoders fast"
    )
    ap.add_argument("--version", action="version", version=f"zoi {__version__}")
    sub = ap.add_subparsers(dest="cmd", required=True)

    p = sub.add_parser("info", help="machine, ISA, GPU; or a model folder / artifact")
    p.add_argument("path", nargs="?", help="a model folder or zoi artifact")
    p.add_argument(
        "--archs", action="store_true", help="the architectures zoi runs, per device and output"
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_info)

    p = sub.add_parser("compile", help="compile a model folder into a zoi artifact")
    _add_engine_args(p, with_output=False)
    p.add_argument("-o", "--output", required=True, help="artifact folder to write")
    p.add_argument(
        "--task",
        default=None,
        choices=["rerank"],
        help="rerank: a causal LM (*ForCausalLM folder) as an LLM reranker, scoring "
        "logit['yes'] - logit['no'] of the last token as sentence-transformers' CrossEncoder "
        "does (default: what the folder is)",
    )
    p.add_argument(
        "--weight-bits",
        default=None,
        choices=["8", "7", "auto"],
        help="INT8 weights: 8 (default), 7 (|w| <= 63: a cheaper exact AVX2 kernel, some "
        "fidelity), or auto (7 per linear where its measured error stays close to 8-bit's; "
        "docs/QUANT.md, 7-bit weights)",
    )
    p.set_defaults(func=cmd_compile)

    p = sub.add_parser(
        "convert",
        help="convert a model folder's PyTorch pickles zoi needs (BGE-M3's sparse_linear.pt / "
        "colbert_linear.pt, Dense modules) to safetensors, once",
        description="Reads each pickle with torch's weights_only loader in a child process "
        "(zoi itself never unpickles) and writes <name>.safetensors beside it, atomically. "
        "torch is needed for this alone.",
    )
    p.add_argument("folder", help="the model folder")
    p.add_argument(
        "--python",
        default=None,
        metavar="PATH",
        help="the interpreter whose torch reads the pickles (default: this one)",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="replace a safetensors file that differs from its pickle (default: refuse)",
    )
    p.set_defaults(func=cmd_convert)

    p = sub.add_parser("encode", help="embed texts (arguments, --file, or stdin)")
    p.add_argument(
        "--model", "-m", default=None, help="model folder or artifact (default: bundled MiniLM)"
    )
    p.add_argument("texts", nargs="*")
    p.add_argument("--file", "-f", default=None, help="one text per line ('-' for stdin)")
    p.add_argument(
        "--output",
        "-o",
        default=None,
        help="write .json, .npy or .csv (one row per text); default: JSON to stdout",
    )
    p.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help=f"progress bar on stderr (default: on a terminal, above {PROGRESS_AUTO_TEXTS} texts)",
    )
    p.add_argument("--device", default=None, choices=["auto", "cpu", "cuda", "reference"])
    p.add_argument("--precision", default="fp32", choices=["fp32", "int8", "fp16", "fp8"])
    p.add_argument("--max-tokens", type=int, default=None)
    p.add_argument(
        "--batch-size",
        type=int,
        default=None,
        help="texts per engine call at most (default: chunks by token budget, up to max_tokens)",
    )
    p.add_argument(
        "--normalize", choices=["yes", "no"], default=None, help="default: as the model says"
    )
    p.add_argument(
        "--no-truncate", action="store_true", help="error on over-long texts instead of truncating"
    )
    p.add_argument(
        "--max-line-bytes",
        type=int,
        default=MAX_LINE_BYTES,
        metavar="N",
        help=f"longest line of --file (a longer one is an error naming it) [default {MAX_LINE_BYTES}]",
    )
    _add_pooling_arg(p)
    p.set_defaults(func=cmd_encode)

    p = sub.add_parser("demo", help="similarities and timing of the bundled MiniLM against PyTorch")
    p.add_argument("--device", default="cpu", choices=["auto", "cpu", "cuda", "reference"])
    p.add_argument("--precisions", nargs="+", default=["fp32", "int8"])
    p.add_argument("--iters", type=int, default=50)
    p.add_argument(
        "--no-cache",
        action="store_true",
        help="compile afresh instead of reusing the cached artifacts (~/.cache/zoi, ZOI_CACHE_DIR)",
    )
    p.add_argument(
        "--max-load",
        type=float,
        default=0.25,
        metavar="CORES",
        help="other processes' CPU (cores) above which the timing is repeated, then flagged",
    )
    p.add_argument(
        "--load-wait",
        type=float,
        default=30.0,
        metavar="S",
        help="seconds to wait for a quieter machine before timing again",
    )
    p.set_defaults(func=cmd_demo)

    for mod in (
        "zoi.tools.cli",
        "zoi.bench.cli",
        "zoi.serve.cli",
        "zoi.integrations.cli",
        "zoi.decoder.cli",
    ):
        try:
            m = __import__(mod, fromlist=["register"])
        except ImportError:
            continue
        m.register(sub)
    return ap


def main(argv: list[str] | None = None) -> int:
    import logging

    from zoi.errors import ZoiError

    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (ZoiError, ValueError, TypeError, FileNotFoundError) as e:
        print(f"zoi: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
