"""Export a compiled model's native plan for csrc/tests/arm_engine_test.cc (docs/ARM.md).

The CPU backend (zoi.backends.cpu) builds the native Engine through a sequence of calls
(Engine(...), add_embed, add_linear_i8, ..., finalize). This records that sequence, with every
array it passes, by building the backend over a recording stand-in for zoi._cpu.Engine; the
C++ driver replays it into the same csrc/runtime/engine.cc (cross-compiled for aarch64) and runs
the same batches. The outputs of this machine's engine on each of its ISAs go into the file too,
so the aarch64 run compares its embeddings with the x86-64 ones.

File (little-endian): b"ZOIPLAN1", u32 calls, each: str name, u8 args, each arg a tagged value
(0 None, 1 i64, 2 f64, 3 bool, 4 str, 5 array: u8 dtype 0 f32 / 1 i8 / 2 i32, u8 ndim, i64
shape[ndim], the data); then u32 batches, each: i32 T, i32 B, u8 normalize, i32 ids[T],
positions[T], cu[B + 1], u32 ISAs, each: str name, i32 rows, i32 cols, f32 out[rows, cols].
A str is u32 length + bytes.

Usage: python scripts/arm_engine_export.py OUT.bin [--texts N] [--max-tokens N]
  compiles the bundled all-MiniLM-L6-v2 INT8 (a small calibration budget) and exports it with
  N short texts in one batch (and each text alone).
"""

from __future__ import annotations

import argparse
import re
import struct
import sys
from pathlib import Path

import numpy as np

MAGIC = b"ZOIPLAN1"
DTYPES = {np.dtype(np.float32): 0, np.dtype(np.int8): 1, np.dtype(np.int32): 2}


# The calls the C++ driver replays (csrc/tests/arm_engine_test.cc); any other is refused here.
CALLS = (
    "init",
    "add_embed",
    "add_linear_f32",
    "add_linear_i8",
    "set_first_row_residual",
    "add_attention",
    "add_attention_ext",
    "set_attention_precision",
    "add_glu",
    "add_layernorm",
    "add_pool",
    "set_batch_rows",
    "set_embed_types",
    "set_output",
    "finalize",
)
_NO_DEFAULT = object()


def _split_top(s: str) -> list[str]:
    """s split at the commas outside brackets."""
    out, depth, cur = [], 0, ""
    for ch in s:
        if ch in "[(":
            depth += 1
        elif ch in "])":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    return out + ([cur.strip()] if cur.strip() else [])


def binding_params(name: str) -> list[tuple[str, object]]:
    """[(parameter, default or _NO_DEFAULT)] of zoi._cpu.Engine's method `name` ("init": the
    constructor), read from the nanobind signature: the order in which the driver reads them."""
    from zoi import _cpu

    fn = _cpu.Engine.__init__ if name == "init" else getattr(_cpu.Engine, name)
    text, _doc, defaults = fn.__nb_signature__[0]
    inner = text[text.index("(") + 1 : text.rindex(") ->")]
    out = []
    for p in _split_top(inner)[1:]:  # [0]: self
        pname = p.split(":")[0].strip()
        m = re.search(r"= \\(\d+)$", p)
        out.append((pname, defaults[int(m.group(1))] if m else _NO_DEFAULT))
    return out


class RecordingEngine:
    """Stands in for zoi._cpu.Engine while a backend is built: records each call."""

    def __init__(self, *args, **kw):
        self.calls: list[tuple[str, list]] = []
        self._record("init", args, kw)

    def _record(self, name, args, kw):
        if name not in CALLS:
            raise NotImplementedError(
                f"Engine.{name}: the plan export does not know this call (a model with task "
                "adapters or LoRA); export a model without them"
            )
        params = binding_params(name)
        if len(args) > len(params):
            raise TypeError(
                f"Engine.{name}: {len(args)} arguments, the binding takes {len(params)}"
            )
        vals = list(args)
        for pname, default in params[len(args) :]:
            if pname in kw:
                vals.append(kw.pop(pname))
            elif default is _NO_DEFAULT:
                raise TypeError(f"Engine.{name}: argument {pname} missing")
            else:
                vals.append(default)
        if kw:
            raise TypeError(f"Engine.{name}: unknown arguments {sorted(kw)}")
        self.calls.append((name, vals))

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        return lambda *a, **kw: self._record(name, a, kw)


def record_plan(model, backend_cls=None) -> list[tuple[str, list]]:
    """The Engine calls the CPU backend makes for `model` (a CompiledModel)."""
    from zoi.backends.cpu import backend as cpu_backend

    real = cpu_backend._cpu

    class _Shim:  # zoi._cpu with the recording Engine
        Engine = RecordingEngine

        def __getattr__(self, name):
            return getattr(real, name)

    cpu_backend._cpu = _Shim()
    try:
        be = (backend_cls or cpu_backend.CpuBackend)(model, isa="scalar")
    finally:
        cpu_backend._cpu = real
    return be.engine.calls


def _str(s: str) -> bytes:
    b = s.encode()
    return struct.pack("<I", len(b)) + b


def _value(v) -> bytes:
    if v is None:
        return b"\0"
    if isinstance(v, (bool, np.bool_)):
        return b"\3" + struct.pack("<B", bool(v))
    if isinstance(v, (int, np.integer)):
        return b"\1" + struct.pack("<q", int(v))
    if isinstance(v, (float, np.floating)):
        return b"\2" + struct.pack("<d", float(v))
    if isinstance(v, str):
        return b"\4" + _str(v)
    a = np.ascontiguousarray(v)
    if a.dtype not in DTYPES:
        raise TypeError(f"cannot export an array of {a.dtype}")
    head = struct.pack("<BB", DTYPES[a.dtype], a.ndim) + struct.pack(f"<{a.ndim}q", *a.shape)
    return b"\5" + head + a.astype(a.dtype.newbyteorder("<")).tobytes()


def write_plan(path, calls, batches, outputs) -> None:
    """calls: record_plan's; batches: [(ids, positions, cu, normalize)]; outputs: {isa: [out of
    each batch]} (this machine's engine)."""
    with open(path, "wb") as f:
        f.write(MAGIC + struct.pack("<I", len(calls)))
        for name, args in calls:
            f.write(_str(name) + struct.pack("<B", len(args)))
            for v in args:
                f.write(_value(v))
        f.write(struct.pack("<I", len(batches)))
        for i, (ids, pos, cu, norm) in enumerate(batches):
            T, B = len(ids), len(cu) - 1
            f.write(struct.pack("<iiB", T, B, bool(norm)))
            for a in (ids, pos, cu):
                f.write(np.ascontiguousarray(a, dtype="<i4").tobytes())
            f.write(struct.pack("<I", len(outputs)))
            for isa, outs in outputs.items():
                o = np.ascontiguousarray(outs[i], dtype="<f4")
                f.write(_str(isa) + struct.pack("<ii", *o.shape) + o.tobytes())


def export(model, token_lists, path, isas, normalize=True) -> dict:
    """Records model's plan, runs one batch of all token lists and one per list on this
    machine's CPU backend for each ISA, writes the file; returns {isa: outputs}."""
    from zoi.backends.cpu import CpuBackend

    off = model.spec.position_offset
    batches = []
    for group in [token_lists] + [[t] for t in token_lists]:
        ids = np.concatenate(group).astype(np.int32)
        pos = np.concatenate([np.arange(len(t)) + off for t in group]).astype(np.int32)
        cu = np.concatenate([[0], np.cumsum([len(t) for t in group])]).astype(np.int32)
        batches.append((ids, pos, cu, normalize))
    outputs = {}
    for isa in isas:
        be = CpuBackend(model, isa=isa)
        outputs[isa] = [be.run(ids, pos, cu, norm) for ids, pos, cu, norm in batches]
    write_plan(path, record_plan(model), batches, outputs)
    return outputs


TEXTS = [
    "A man is playing a guitar on stage.",
    "Edge devices run small encoders.",
    "The quick brown fox jumps over the lazy dog near the river bank today.",
]


def compile_minilm(max_tokens: int = 256):
    """The bundled all-MiniLM-L6-v2 compiled INT8 for the CPU with a small calibration budget
    (the quantiser's quality is not what this checks: the same plan runs on both machines)."""
    import zoi
    from zoi.quant import QuantConfig

    lines = (Path(zoi.__file__).parent / "data" / "eval.txt").read_text("utf-8").splitlines()
    calib = [ln.strip() for ln in lines if ln.strip()][:64]
    cfg = QuantConfig(smoothquant="on", smooth_alpha=0.5, search_texts=16, sqnr_texts=32)
    return zoi.compile(
        device="cpu",
        precision="int8",
        calibration=calib,
        quant_config=cfg,
        max_tokens=max_tokens,
        max_batch=4,
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--texts", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=256)
    args = ap.parse_args(argv)
    if not 1 <= args.texts <= len(TEXTS):
        ap.error(f"--texts must be in [1, {len(TEXTS)}]")
    from zoi import _cpu

    eng = compile_minilm(args.max_tokens)
    toks = eng.tokenize(TEXTS[: args.texts])
    isas = [
        i for i in ("scalar", "avx2", "avxvnni", "avx512", "vnni", "amx") if _cpu.isa_supported(i)
    ]
    export(eng.model, toks, args.out, isas)
    print(f"wrote {args.out}: {sum(map(len, toks))} tokens, x86-64 ISAs {', '.join(isas)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
