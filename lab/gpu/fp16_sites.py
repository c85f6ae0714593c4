"""Which fp16 storage site of the CUDA backend moves an INT8 artifact's output, and whether the
backend does exactly what the numpy emulation of that storage does (docs/GPU.md, "The
static-tiny tolerance failure"; tests/cuda_backend/cuda_helpers.fp16_storage_emulation).

    TRITON_INTERPRET=1 python lab/gpu/fp16_sites.py static           # the interpreter case
    TRITON_INTERPRET=1 python lab/gpu/fp16_sites.py default compiled  # the H200's lens
    ... --arena   also runs the backend (interpreter) launch by launch and compares its buffers
                  and int8 copies with the emulation (~2 min on 2 cores)

Sites: tables (fp16 position / type / float word tables), embed, qkv / o / ffn1 / ffn2 (a
linear's output after activation and residual), attn (attention's output), attn_p (its fp16
probabilities before the PV product), ln (add_layernorm's output); the table prints the rel
error against float64 with each site alone, all, and the emulation of the test helper.
"""

from __future__ import annotations

import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from tests.cuda_backend.cuda_helpers import (  # noqa: E402
    batch,
    default_quant_model,
    fp16_storage_rel,
    min_cosine,
    rel,
)

from zoi.numerics import primitives as qp  # noqa: E402
from zoi.numerics import reference as R  # noqa: E402

SITES = ("tables", "embed", "qkv", "attn", "attn_p", "o", "ln", "ffn1", "ffn2")
CONFIGS = {
    "static": dict(activations="static", smooth_shift=True),
    "default": {},
    "shift": dict(smooth_shift=True),
    "dynamic": dict(activations="dynamic"),
}


def h(x):
    return np.asarray(x, np.float32).astype(np.float16).astype(np.float32)


def _attention_p16(qkv, cu, heads, hd, scale):
    """Flash attention's numerics: p = exp(s - max) fp32, l = sum p, (fp16(p) @ v) / l."""
    H = heads * hd
    out = np.empty((qkv.shape[0], H), np.float32)
    for s in range(len(cu) - 1):
        a, e = int(cu[s]), int(cu[s + 1])
        q, k, v = (
            qkv[a:e, i * H : (i + 1) * H].reshape(e - a, heads, hd).transpose(1, 0, 2)
            for i in range(3)
        )
        sc = (q @ k.transpose(0, 2, 1)).astype(np.float32) * np.float32(scale)
        p = np.exp(sc - sc.max(-1, keepdims=True)).astype(np.float32)
        out[a:e] = ((h(p) @ v) / p.sum(-1, keepdims=True)).transpose(1, 0, 2).reshape(e - a, H)
    return out


def emulate(model, ids, pos, cu, sites) -> dict:
    """The float32 INT8 emulation with fp16 storage at `sites` (BERT graphs)."""
    g, W, Q = model.graph, dict(model.weights), model.quant
    if "tables" in sites:
        for k in ("embed.word", "embed.pos", "embed.type"):
            if k in W:
                W[k] = h(W[k])
    env = {"ids": ids, "positions": pos, "cu_seqlens": cu, "types": None}
    for op in g.ops:
        ins = [env[n] for n in op.inputs]
        a, wn = op.attrs, op.weights
        if op.kind == "embed":
            rows = R.gather_rows(W, wn["word"], ins[0])
            typ = W[wn["type"]] if "type" in wn else None
            y = R.embed_rows(
                rows, ins[1], W[wn["pos"]], W[wn["ln_w"]], W[wn["ln_b"]], a["eps"], typ
            )
            site = "embed"
        elif op.kind == "linear":
            p = wn["w"].rsplit(".", 1)[0]
            y = R.activation(R.linear_apply(ins[0], W, p, Q.get(p)).astype(np.float32), a["act"])
            y = y + ins[1] if len(ins) > 1 else y
            site = p.split(".")[1]
        elif op.kind == "attention":
            f = _attention_p16 if "attn_p" in sites else R.attention
            y, site = f(ins[0], ins[1], a["heads"], a["head_dim"], a["scale"]), "attn"
        elif op.kind == "add_layernorm":
            y, site = R.add_layernorm(ins[0], ins[1], W[wn["w"]], W[wn["b"]], a["eps"]), "ln"
        elif op.kind == "pool":
            y, site = R.pool(ins[0], ins[1], a["mode"]), "pool"
        else:
            raise ValueError(f"fp16_sites: no emulation of {op.kind!r}")
        env[op.output] = h(y) if site in sites else np.asarray(y, np.float32)
    return env


def setup(conf: str, mode: str):
    if mode == "compiled":  # tests/cuda_backend/test_backend.py's M of the GPU run
        size, cases = dict(max_tokens=512, max_batch=64), ([1], [16], [17], [5, 1, 9, 32])
    else:
        size, cases = dict(max_tokens=64), ([1], [5, 1, 9], [32, 3, 17], [20, 20, 20])
    return default_quant_model(**size, **CONFIGS[conf]), cases


def table(model, cases):
    rng = np.random.default_rng(11)  # _check's generator
    g = model.graph
    for lens in cases:
        ids, pos, cu = batch(lens, model.spec.vocab_size, rng)
        gold = R.execute(g, model.weights, ids, pos, cu, quant=model.quant, dtype=np.float64)
        for norm in (False, True):
            f = R.normalize if norm else (lambda x: x)
            G = f(gold[g.output])

            def e(s, f=f, G=G, ids=ids, pos=pos, cu=cu):
                return rel(f(emulate(model, ids, pos, cu, s)[g.output]), G)

            cells = [
                f"helper {fp16_storage_rel(model, ids, pos, cu, norm):.4f}",
                f"all {e(SITES):.4f}",
            ]
            cells += [f"{s} {e((s,)):.4f}" for s in SITES]
            print(f"{lens} norm={norm}: " + "  ".join(cells), flush=True)
    return ids, pos, cu


def arena(model, ids, pos, cu, mode):
    """The backend launch by launch (interpreter) against the all-sites emulation."""
    import torch

    from zoi.backends.cuda.backend import CudaBackend

    kw = dict(buckets=[16, 64]) if mode != "compiled" else {}
    be = CudaBackend(model, interpret=True, **kw)
    T = len(ids)
    tb = next(b for b in be.buckets if b >= T)
    plan, rows = be.plan_for(tb), be.plan_for(tb)["amax_row"]
    n, _ = be._stage(ids, pos, cu, False, tb)
    be.d_in[:n] = torch.from_numpy(be.h_in[:n].copy())
    emu = emulate(model, ids, pos, cu, SITES)
    g = model.graph
    gold = R.execute(g, model.weights, ids, pos, cu, quant=model.quant, dtype=np.float64)
    for step, la in zip(be._steps[tb], plan["launches"], strict=True):
        xin = None
        if la.kind == "quantize":
            xin = be._act(plan, la.ins[0], tb)[:T].float().numpy().copy()
        step()
        if la.kind == "pool":
            continue
        y = be._act(plan, la.out, tb)[:T].float().numpy()
        if la.out in emu:
            print(f"{la.kind:13s} {la.out:24s} vs float64 {rel(y, gold[la.out]):.2e}  "
                  f"vs emulation {rel(y, emu[la.out]):.2e}")  # fmt: skip
        qn = la.out if la.kind == "quantize" else la.extra.get("q")
        if not qn:
            continue
        codes = be._act(plan, qn, tb)[:T].numpy().astype(np.int32)
        scale = be.mem.amax_region[rows[qn]][:T].numpy()
        cons = next(o for o in g.ops if o.attrs.get("quant_in") == qn)
        p = cons.weights["w"].rsplit(".", 1)[0]
        lq = model.quant[p]
        x = R.pre_transform((xin if xin is not None else y).astype(np.float32), model.weights, p)
        if lq.scheme == "dynamic_asym":
            q, sc, _ = qp.quantize_act_asym(x)
            q = q.astype(np.int32) - 128
        else:
            q, sc = qp.quantize_act(x, lq.amax if lq.scheme == "static" else None)
        d = int((q.astype(np.int32) != codes).sum())
        print(f"  copy {qn}: {d}/{codes.size} codes differ from the numpy quantiser on the "
              f"stored fp16 input, scale rel {rel(scale, sc):.1e}")  # fmt: skip
    got = be.d_out[: len(cu) - 1].numpy()
    G, E = gold[g.output], emu[g.output]
    print(f"output: backend vs float64 rel {rel(got, G):.4f} (min cos {min_cosine(got, G):.5f}), "
          f"emulation {rel(E, G):.4f}, backend vs emulation {rel(got, E):.1e}")  # fmt: skip


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    conf, mode = (args + ["static", "interp"])[:2] if len(args) < 2 else args[:2]
    model, cases = setup(conf, mode)
    ids, pos, cu = table(model, cases)
    if "--arena" in sys.argv:
        arena(model, ids, pos, cu, mode)
