"""Host side of the CUDA C++ persistent encoder kernel (csrc/cuda/megakernel.cu).

One launch per forward of a token bucket: blocks (one per SM) pull instructions from per-block
queues built here, wait on counters in device memory and bump counters when done (no grid
barriers). docs/MEGAKERNEL.md describes the instruction format and the design.

The parts:

* ``describe(launches, w, wbase)``: the model as plain numbers (dimensions, weight offsets)
  from the CUDA backend's launch list; anything but the BERT post-LN layer with fp16
  weights, mean / CLS pooling raises ``MegakernelUnsupported`` (the per-op path stays);
* ``build_program(desc, tb, n_blocks)`` (megakernel_program.py) / ``check_program``
  (megakernel_check.py): the instruction list of one bucket and its static soundness check;
* ``emulate`` / ``compare_scratch`` (megakernel_emulate.py): a numpy run of an instruction list
  as the kernel reads it (the CPU check against the reference; the GPU tests' diagnosis);
* ``cubin()``: the compiled kernel: ``zoi/_cuda/megakernel.cubin`` from the package build, else
  compiled with nvcc at first use into the zoi cache directory, else unsupported;
* ``MegakernelPlan(backend, tb)``: device buffers + a capturable launch (``steps()``).
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import struct
import subprocess
import types
from pathlib import Path

import numpy as np

from zoi.backends.cuda.megakernel_check import check_program  # noqa: F401  (re-exported)
from zoi.backends.cuda.megakernel_emulate import compare_scratch, emulate  # noqa: F401
from zoi.backends.cuda.megakernel_program import (  # noqa: F401  (re-exported)
    ACTS,
    F_FLAGS,
    F_K,
    F_OP,
    F_SIGNAL,
    F_WAIT,
    F_WAIT_N,
    FL_A_ATTN,
    FL_A_LN,
    MAX_D,
    MAX_H,
    OP_ATTN,
    OP_EMBED_LN,
    OP_GEMM,
    OP_LN,
    OP_POOL,
    POLL_LIMIT,
    SMEM_BYTES,
    STATE_CTR,
    STATE_ERR,
    THREADS,
    MegakernelUnsupported,
    attn_fusable,
    build_program,
    ffn2_splits,
)

log = logging.getLogger("zoi")

SOURCE = Path(__file__).resolve().parents[4] / "csrc" / "cuda" / "megakernel.cu"
PACKAGED = Path(__file__).resolve().parents[2] / "_cuda" / "megakernel.cubin"
KERNEL = b"zoi_megakernel"


# ------------------------------------------------------------------ model description
def describe(launches, w: dict, wbase: int) -> dict:
    """The model as numbers: dims, eps, and 16-byte-unit offsets of every weight in the one
    weight buffer (w: packed name -> tensor view, wbase: the buffer's data_ptr)."""
    from zoi.backends.cuda.persistent import PersistentUnsupported, _layers

    try:
        emb, layers, pool = _layers(types.SimpleNamespace(plan={"launches": launches}))
    except PersistentUnsupported as e:
        raise MegakernelUnsupported(str(e).replace("persistent kernel", "megakernel")) from e
    att = layers[0][1].op.attrs
    NH, D = int(att["heads"]), int(att["head_dim"])
    H, I = int(emb.n), int(layers[0][4].n)
    if NH * D != H or layers[0][0].n != 3 * H:
        raise MegakernelUnsupported("megakernel: heads x head_dim != hidden")
    if int(att.get("kv_heads", 0) or NH) != NH or att.get("causal"):
        raise MegakernelUnsupported("megakernel: grouped KV heads / causal attention")
    if H > MAX_H or D > MAX_D or D % 2 or H % 8 or I % 8:
        raise MegakernelUnsupported(
            f"megakernel: hidden {H} / head_dim {D} / intermediate {I} (needs hidden <= {MAX_H}"
            f" and a multiple of 8, head_dim <= {MAX_D} and even, intermediate a multiple of 8)"
        )
    mode = pool.op.attrs.get("mode")
    if mode not in ("mean", "cls"):
        raise MegakernelUnsupported(f"megakernel: pooling {mode!r} (mean / cls only)")
    act = layers[0][4].op.attrs.get("act", "none")
    if act not in ACTS:
        raise MegakernelUnsupported(f"megakernel: activation {act!r} (gelu erf / none only)")
    if "embed.word" not in w or "embed.pos" not in w or "embed.ln.w" not in w:
        raise MegakernelUnsupported("megakernel: fp16 embeddings with a LayerNorm only")

    def off(key):
        if key not in w:
            raise MegakernelUnsupported(f"megakernel: no {key} (fp16 weights with biases only)")
        b = int(w[key].data_ptr()) - int(wbase)
        if b % 16:
            raise MegakernelUnsupported(f"megakernel: {key} not 16-byte aligned")
        return b // 16

    eps = {float(emb.op.attrs["eps"])}
    lay = []
    for ly in layers:
        qkv, at, o, ln1, f1, f2, ln2 = ly
        if at.op.attrs != att or f1.op.attrs.get("act", "none") != act:
            raise MegakernelUnsupported("megakernel: layers differ")
        for x in (qkv, o, f1, f2):
            if x.mode.is_int8 or x.quant:
                raise MegakernelUnsupported("megakernel: fp16 weights only")
        eps |= {float(ln1.op.attrs["eps"]), float(ln2.op.attrs["eps"])}
        lay.append(
            {
                "qkv_w": off(f"{qkv.extra['prefix']}.w"),
                "qkv_b": off(f"{qkv.extra['prefix']}.b"),
                "o_w": off(f"{o.extra['prefix']}.w"),
                "o_b": off(f"{o.extra['prefix']}.b"),
                "ln1_w": off(f"{ln1.out}.ln.w"),
                "ln1_b": off(f"{ln1.out}.ln.b"),
                "f1_w": off(f"{f1.extra['prefix']}.w"),
                "f1_b": off(f"{f1.extra['prefix']}.b"),
                "f2_w": off(f"{f2.extra['prefix']}.w"),
                "f2_b": off(f"{f2.extra['prefix']}.b"),
                "ln2_w": off(f"{ln2.out}.ln.w"),
                "ln2_b": off(f"{ln2.out}.ln.b"),
            }
        )
    if len(eps) != 1:
        raise MegakernelUnsupported("megakernel: LayerNorm eps differ")
    return dict(
        H=H,
        I=I,
        NH=NH,
        D=D,
        L=len(layers),
        eps=eps.pop(),
        scale=float(att["scale"]),
        act=ACTS[act],
        pool=mode,
        emb=dict(
            word=off("embed.word"),
            pos=off("embed.pos"),
            type=off("embed.type0") if "embed.type0" in w else -1,
            ln_w=off("embed.ln.w"),
            ln_b=off("embed.ln.b"),
        ),
        layers=lay,
    )


# ------------------------------------------------------------------ the cubin
def nvcc_flags(arch: str = "sm_90a") -> list[str]:
    comp = "compute_" + arch[3:]
    return [
        "-cubin", "-O3", "-std=c++17", "-lineinfo",
        f"-gencode=arch={comp},code={arch}", "-Xptxas", "-v",
    ]  # fmt: skip


def arch_for(capability: tuple[int, int]) -> str:
    """sm_90a on Hopper (the 'a' features: wgmma, setmaxnreg, later), sm_XY elsewhere."""
    ma, mi = capability
    return f"sm_{ma}{mi}a" if (ma, mi) == (9, 0) else f"sm_{ma}{mi}"


def compile_cubin(out: Path, arch: str = "sm_90a", nvcc: str | None = None) -> str:
    """nvcc the kernel into `out`; returns nvcc's report (-Xptxas -v: registers, spills)."""
    nvcc = nvcc or shutil.which("nvcc")
    if not nvcc:
        raise MegakernelUnsupported("megakernel: no nvcc to build csrc/cuda/megakernel.cu")
    if not SOURCE.exists():
        raise MegakernelUnsupported(f"megakernel: the kernel source {SOURCE} is not installed")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(f".{os.getpid()}.tmp")
    p = subprocess.run(
        [nvcc, *nvcc_flags(arch), "-o", str(tmp), str(SOURCE)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    if p.returncode:
        raise MegakernelUnsupported(f"megakernel: nvcc failed:\n{p.stderr[-4000:]}")
    os.replace(tmp, out)
    return p.stderr + p.stdout


def ptxas_report(text: str) -> dict:
    """Registers, spill bytes, stack frame and shared memory from nvcc -Xptxas -v output."""
    import re

    r = {}
    m = re.search(r"Used (\d+) registers", text)
    if m:
        r["registers"] = int(m.group(1))
    m = re.search(
        r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", text
    )
    if m:
        r["stack"], r["spill_stores"], r["spill_loads"] = map(int, m.groups())
    m = re.search(r"(\d+) bytes smem", text)
    if m:
        r["smem"] = int(m.group(1))
    return r


def packaged_cubins() -> list[Path]:
    """Where the package build puts the sm_90a cubin: beside the package (a wheel, or a copy
    placed in src/zoi/_cuda), or in site-packages (an editable install's compiled files)."""
    import site

    out = [PACKAGED]
    for d in [*site.getsitepackages(), site.getusersitepackages()]:
        out.append(Path(d) / "zoi" / "_cuda" / "megakernel.cubin")
    if SOURCE.exists():  # a source checkout: never a cubin older than the kernel's source
        t = SOURCE.stat().st_mtime
        out = [p for p in out if p.exists() and p.stat().st_mtime >= t]
    return out


def cubin(capability: tuple[int, int] = (9, 0)) -> bytes:
    """The kernel's cubin for this GPU: the package's build (sm_90a) on Hopper, else one
    compiled with nvcc at first use, cached by source hash and arch."""
    arch = arch_for(capability)
    if arch == "sm_90a":
        for p in packaged_cubins():
            if p.exists():
                return p.read_bytes()
    if not SOURCE.exists():
        raise MegakernelUnsupported("megakernel: no packaged cubin and no kernel source")
    from zoi.paths import cache_dir

    h = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]
    path = cache_dir() / "megakernel" / f"megakernel_{arch}_{h}.cubin"
    if not path.exists():
        log.info("zoi: compiling the megakernel for %s with nvcc", arch)
        compile_cubin(path, arch)
    return path.read_bytes()


# ------------------------------------------------------------------ the device plan
class MegakernelPlan:
    """Device buffers and the capturable launch of one bucket. ``bar``: the int64 state
    [unused, error, generation, done, counters...]: the backend reads bar[1] after each call
    (a set flag voids the call) and zeroes bar[1:] to recover."""

    _modules: dict = {}

    def __init__(self, backend, tb: int, poll_limit: int = POLL_LIMIT, program=None, profile=False):
        """profile: the kernel records per instruction (start, dependency met, done, SM) in
        globaltimer ns (``profile_report``); a separate plan, never the captured one."""
        torch = backend.torch
        if backend.eager:
            raise MegakernelUnsupported("megakernel: needs a GPU (no interpreter path)")
        if tb > backend.max_tokens:
            raise MegakernelUnsupported(f"bucket {tb} > max_tokens {backend.max_tokens}")
        self.desc = describe(backend.plan["launches"], backend.w, backend.wbuf.data_ptr())
        if backend.wbuf.data_ptr() % 16:
            raise MegakernelUnsupported("megakernel: weight buffer not 16-byte aligned")
        self.n_blocks = int(backend.sm)
        self.prog = program or build_program(
            self.desc, tb, self.n_blocks, max_seq=min(backend.max_batch, tb)
        )
        self.n_blocks = self.prog.n_blocks
        drv = backend.drv
        key = (backend.device_index, tuple(backend.capability))
        if key not in MegakernelPlan._modules:
            # a NUL-terminated copy whose address the driver reads (kept with the module)
            data = np.frombuffer(cubin(tuple(backend.capability)) + b"\0", np.uint8).copy()
            mod = drv.check(drv.cu.cuModuleLoadData(data.ctypes.data))
            fn = drv.check(drv.cu.cuModuleGetFunction(mod, KERNEL))
            attr = drv.cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
            drv.check(drv.cu.cuFuncSetAttribute(fn, attr, SMEM_BYTES))
            MegakernelPlan._modules[key] = (mod, fn, data)
        self.fn = MegakernelPlan._modules[key][1]
        dev = backend.dev
        qoff, flat = self.prog.queue_arrays()
        self.instr = torch.from_numpy(self.prog.rows.reshape(-1).copy()).to(dev)
        self.qoff = torch.from_numpy(qoff).to(dev)
        self.queue = torch.from_numpy(flat).to(dev)
        self.bar = torch.zeros(STATE_CTR + len(self.prog.per_call), dtype=torch.int64, device=dev)
        self.scratch = torch.zeros(self.prog.scratch_bytes + 256, dtype=torch.uint8, device=dev)
        self.tb = tb
        self.backend = backend
        n = len(self.prog.rows)
        self.prof = torch.zeros(n * 4, dtype=torch.int64, device=dev) if profile else None
        self.params = struct.pack(
            "<8Q3i4xqQ",
            self.instr.data_ptr(), self.qoff.data_ptr(), self.queue.data_ptr(),
            self.bar.data_ptr(), backend.wbuf.data_ptr(), self.scratch.data_ptr(),
            backend.d_in.data_ptr(), backend.d_out.data_ptr(),
            int(backend.hdr_ints), int(tb), int(self.n_blocks), int(poll_limit),
            self.prof.data_ptr() if profile else 0,
        )  # fmt: skip
        import ctypes

        self._pbuf = ctypes.create_string_buffer(self.params, len(self.params))
        self._pptr = (ctypes.c_void_p * 1)(ctypes.addressof(self._pbuf))

    def launch(self):
        cu, drv = self.backend.drv.cu, self.backend.drv
        stream = self.backend.torch.cuda.current_stream(self.backend.dev).cuda_stream
        drv.check(
            cu.cuLaunchKernel(
                self.fn, self.n_blocks, 1, 1, THREADS, 1, 1, SMEM_BYTES, cu.CUstream(stream),
                __import__("ctypes").addressof(self._pptr), 0,
            )
        )  # fmt: skip

    def steps(self) -> list:
        return [self.launch]

    def barrier_timed_out(self) -> bool:
        return bool(int(self.bar[STATE_ERR].item()) != 0)

    def reset(self):
        self.bar[1:].zero_()

    def profile_report(self) -> dict:
        """After a profiled launch: the forward's span and, per phase (instruction name up to
        the first space: "qkv0", "attention0", "ffn2_0", ...), its instructions' span from the
        first start to the last end, mean wait for the dependency and mean busy time, in us."""
        t = self.prof.cpu().numpy().reshape(-1, 4).astype(np.float64)
        t0 = t[:, 0].min()
        out = {"span_us": (t[:, 2].max() - t0) / 1e3, "phases": {}}
        for name in dict.fromkeys(n.split(" ")[0] for n in self.prog.names):
            idx = [i for i, n in enumerate(self.prog.names) if n.split(" ")[0] == name]
            r = t[idx]
            out["phases"][name] = dict(
                n=len(idx),
                start_us=round((r[:, 0].min() - t0) / 1e3, 2),
                end_us=round((r[:, 2].max() - t0) / 1e3, 2),
                wait_us=round(float((r[:, 1] - r[:, 0]).mean()) / 1e3, 2),
                busy_us=round(float((r[:, 2] - r[:, 1]).mean()) / 1e3, 2),
            )
        return out

    def error_message(self) -> str:
        return (
            f"cuda: the megakernel forward of bucket {self.tb} gave up waiting for a dependency "
            "(its blocks were not all resident, or an instruction list is inconsistent); this "
            "call's result was discarded and the kernel's counters were reset. Retry, or build "
            "with CudaOptions(megakernel='off') for per-op graphs"
        )


def megakernel_options(backend, opts) -> None:
    """CudaOptions.megakernel "on" / "auto" (compiled only): the megakernel takes the one-launch
    path's place for buckets <= megakernel_max, forced or timed against the per-op graph."""
    if opts.megakernel != "off" and not backend.eager:
        backend.persistent_max = int(opts.megakernel_max)
        backend.persistent_choice = {"on": "force", "auto": "time"}[opts.megakernel]


def megakernel_steps(backend, tb: int) -> list:
    """Bucket tb's steps for CudaBackend._steps_for: the megakernel's launch (its plan kept in
    backend._pplans for the error flag), else, where the model or the machine is not covered,
    the per-op steps (logged; the backend stops trying the megakernel)."""
    try:
        plan = MegakernelPlan(backend, tb)
    except MegakernelUnsupported as e:
        log.info("zoi: bucket %d keeps the per-op kernels (%s)", tb, e)
        backend.persistent_max = 0
        return backend._steps_for(tb, persistent=False)
    backend._pplans[tb] = plan
    return plan.steps()
