"""Compile the persistent kernel for sm_90 without a GPU and report what the interpreter cannot
see (codegen errors, the PTX of the grid barrier and of the activation loads, registers and
spills): tests/cuda_backend/test_persistent.py runs it in a process without TRITON_INTERPRET;
lab/gpu/persistent_tools.py uses it as a tool."""

from __future__ import annotations

import os

from zoi.backends.cuda.persistent import k_stages

ARG_TYPES = {
    "hdr_ptr": "*i32",
    "ids_ptr": "*i32",
    "pos_ptr": "*i32",
    "w16_ptr": "*fp16",
    "w32_ptr": "*fp32",
    "tab_ptr": "*i64",
    "x_ptr": "*fp16",
    "big_ptr": "*fp16",
    "ctx_ptr": "*fp16",
    "s_ptr": "*fp32",
    "out_ptr": "*fp32",
    "bar_ptr": "*i64",
    "s_stride": "i32",
    "n_layers": "i32",
    "stage_lo": "i32",
    "stage_hi": "i32",
    "eps": "fp32",
    "qk_scale": "fp32",
}


def compile_ahead(meta: dict, arch: int = 90) -> dict:
    """Compile the kernel for a CUDA target without a GPU (needs TRITON_INTERPRET unset;
    ptxas runs): the CPU check of what the interpreter cannot see (codegen errors, the PTX
    of the barrier and of the activation loads). Pointers assumed 16-byte aligned, as the
    launcher specialises them."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, compile

    from zoi.backends.cuda.kernels import persistent as kp

    names = kp.persistent_kernel.arg_names
    meta = {**k_stages(meta, meta["H"], meta["I"]), "POLLS": kp.POLL_LIMIT, **meta}
    opts = {k: meta[k] for k in ("num_warps", "num_stages")}
    const = {(names.index(k),): v for k, v in meta.items() if k not in opts}
    sig = {n: ARG_TYPES.get(n, "constexpr") for n in names}
    attrs = {  # as the launcher specialises them: 16-aligned pointers, s_stride % 16 == 0
        (i,): [["tt.divisibility", 16]]
        for i, n in enumerate(names)
        if n.endswith("_ptr") or n == "s_stride"
    }
    src = ASTSource(fn=kp.persistent_kernel, signature=sig, constexprs=const, attrs=attrs)
    k = compile(src, target=GPUTarget("cuda", arch, 32), options=opts)
    ptx = k.asm["ptx"]
    sync = [ln.strip() for ln in ptx.splitlines() if "atom." in ln or ".acquire." in ln]
    return {
        "l1_activation_loads": kp.l1_loads_of_activations(ptx),
        "sync_ops": sync,
        "shared": int(k.metadata.shared),
        "cubin_bytes": len(k.asm["cubin"]),
        "cp_async_cg": ptx.count("cp.async.cg"),
        "cp_async_ca": ptx.count("cp.async.ca"),
        **_resource_usage(k.asm["cubin"]),
    }


def _resource_usage(cubin: bytes) -> dict:
    """Registers and spill bytes of the compiled kernel (cuobjdump; {} when unavailable)."""
    import re
    import shutil
    import subprocess
    import tempfile

    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/cuobjdump")
    tool = tool if os.path.exists(tool) else shutil.which("cuobjdump")
    if not tool:
        return {}
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        r = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True)
    m = re.search(r"REG:(\d+)", r.stdout)
    sp = re.search(r"STACK:(\d+)", r.stdout)
    ls = re.search(r"LOCAL:(\d+)", r.stdout)
    return {
        "regs": int(m.group(1)) if m else None,
        "stack": int(sp.group(1)) if sp else None,
        "local": int(ls.group(1)) if ls else None,
    }
