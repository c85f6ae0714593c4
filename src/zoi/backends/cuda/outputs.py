"""CudaBackend.run_outputs (zoi.backends.base.HeadRunner): one forward, then the
graph's output and taps copied from the arena: per-token logits (token classification),
SPLADE's fp32 [B, V] rows (pooled on the GPU in the decoder's epilogue: kernels/sparse_pool.py),
token embeddings;
and CudaBackend.memory's report."""

from __future__ import annotations

import numpy as np

from zoi.backends.cuda.device import on_device
from zoi.backends.cuda.steps import per_op_steps
from zoi.errors import InputError


def run_outputs(be, ids, positions, cu_seqlens, types=None, taps=()) -> dict:
    """Heads (zoi.backends.base.HeadRunner): the graph's output and each buffer of
    taps, float32. Per-token logits [T, labels], SPLADE's [B, V] (pooled on the GPU:
    kernels/sparse_pool.py) and taps [T, cols] are copied from the arena after the forward
    (a tap is the input of the graph's last op, intact at the end); pooled rows come back
    as in run. A bucket built as the one-launch persistent forward keeps its activations
    elsewhere: with taps, its per-op launches run instead (eagerly, uncaptured)."""
    g = be.model.graph
    if types is not None and "types" in g.inputs and np.any(np.asarray(types) != 0):
        raise InputError("device='cuda' runs token type 0 only for this model")
    ids, tb = be._bucket(ids, cu_seqlens)
    T, B = len(ids), len(cu_seqlens) - 1
    plan = be.plan_for(tb)
    names = (g.output, *taps)
    for n in names[1:]:
        if n not in plan["cols"] or g.buffers[n].rows != "T":
            raise ValueError(f"device='cuda' cannot hand back buffer {n!r}")
    torch = be.torch
    with be._lock:
        n, _ = be._stage(ids, positions, cu_seqlens, False, tb)
        pplan = be._pplans.get(tb)
        if be.eager:
            be.d_in[:n] = torch.from_numpy(be.h_in[:n].copy())
            for s in be._steps[tb]:
                s()
            if pplan is not None and pplan.barrier_timed_out():
                be._barrier_failed(tb)
            pooled = be.d_out[:B].numpy().copy()
        elif pplan is not None and taps:
            steps = be.__dict__.setdefault("_tap_steps", {}).get(tb)
            if steps is None:  # built (kernels compiled) on first use, on this GPU
                steps = be._tap_steps[tb] = per_op_steps(plan, be.mem, be.w, be.spec, tb, False)
            with on_device(be.opts), torch.cuda.stream(be.tstream):
                be.d_in[:n].copy_(torch.from_numpy(be.h_in[:n].copy()))
                for s in steps:
                    s()
                pooled = be.d_out[:B].cpu().numpy()
            be.tstream.synchronize()
        else:
            flag = pplan.bar[1:] if pplan is not None else None
            if be.call.run(be.staging, be._graphs[tb][1], n, B, flag):
                be._barrier_failed(tb)
            pooled = be.h_out[:B].copy()
        out = {}
        for name in names:
            if name == g.output and g.ops[-1].attrs.get("mode") == "splade":  # fp32 [B, V]
                v = be.mem.f32(plan, name, B, int(g.buffers[name].cols))
                out[name] = v.cpu().numpy().copy()
            elif name == g.output and g.buffers[name].rows == "B":  # pooled (+ Dense modules)
                out[name] = pooled
            else:
                out[name] = be.mem.act(plan, name, tb)[:T].float().cpu().numpy()
    return out


def memory_report(be) -> dict:
    """CudaBackend.memory: bytes held, buckets and the path each took."""
    out = {
        "weights_bytes": int(be.weights_bytes),
        "arena_bytes": int(be.arena_bytes),
        "activation_bytes": int(be.act_bytes),
        "buckets": list(be.buckets),
        "kernels_per_forward": {
            tb: 1
            if be.bucket_paths.get(tb, {}).get("path") == "persistent"
            else len(be.plan_for(tb)["launches"])
            for tb in be.buckets
        },
        "persistent_max": be.persistent_max,
        "bucket_paths": {tb: dict(v) for tb, v in be.bucket_paths.items()},
        "pdl": be.pdl,
        "device": be.device_name,
        "prebuild": getattr(be, "prebuild_info", None),
    }
    if not be.eager:
        out["pinned_bytes"] = be.staging.nbytes + be.slots.nbytes
        out["graph_nodes"] = {tb: g[2] for tb, g in be._graphs.items()}
        out["device_bytes_used"] = int(be._free0 - be.drv.mem_info()[0])
        out["torch_reserved_bytes"] = int(
            be.torch.cuda.memory_reserved(be.device_index) - be._reserved0
        )
        out["device_index"] = be.device_index
    return out
