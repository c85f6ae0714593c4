"""KServe v2 signatures of the task heads (zoi.serve.routes_kserve calls in here when
the served model has a head). Input `TEXT` (BYTES) throughout:

| head | input TEXT | outputs |
|---|---|---|
| seq_cls | [n] texts or [n, 2] pairs | SCORES FP32 [n, labels] (sigmoid / softmax; parameters.raw_scores: logits) |
| token_cls | [n] | TOKEN_LOGITS FP32 [n, L, labels] (L: the longest, zero padded), TOKEN_COUNT INT32 [n] |
| splade | [n] | SPARSE FP32 [n, vocab] (dense) |
"""

from __future__ import annotations

import numpy as np
from starlette.responses import Response

from zoi.serve.handler import json_answer
from zoi.serve.heads import in_thread
from zoi.serve.http import ApiError, dumps, timing_headers
from zoi.serve.service import as_json

HEADER = "inference-header-content-length"


def signature(svc) -> tuple[list[dict], list[dict]]:
    """(inputs, outputs) of the model metadata: name, datatype, shape."""
    e = svc.engine
    n = e.head_cols
    if e.head == "seq_cls":
        return [{"name": "TEXT", "datatype": "BYTES", "shape": [-1, -1]}], [
            {"name": "SCORES", "datatype": "FP32", "shape": [-1, n]}
        ]
    if e.head == "token_cls":
        return [{"name": "TEXT", "datatype": "BYTES", "shape": [-1]}], [
            {"name": "TOKEN_LOGITS", "datatype": "FP32", "shape": [-1, -1, n]},
            {"name": "TOKEN_COUNT", "datatype": "INT32", "shape": [-1]},
        ]
    return [{"name": "TEXT", "datatype": "BYTES", "shape": [-1]}], [
        {"name": "SPARSE", "datatype": "FP32", "shape": [-1, n]}
    ]


def config_io(svc) -> tuple[list[dict], list[dict]]:
    ins, outs = signature(svc)
    t = {"BYTES": "TYPE_STRING", "FP32": "TYPE_FP32", "INT32": "TYPE_INT32"}

    def conv(xs):
        return [{"name": x["name"], "data_type": t[x["datatype"]], "dims": x["shape"]} for x in xs]

    return conv(ins), conv(outs)


def output_binary(outs, names: list[str], binary: bool) -> bool:
    """Check a KServe request's `outputs` against the model's output names; returns whether the
    answer is binary (an output's `binary_data` parameter overrides `binary`). Only a JSON
    boolean decides: "no" or 0 are refused rather than taken for true."""
    if outs is None:
        return binary
    if not isinstance(outs, list):
        raise ApiError("validation", "outputs should be an array")
    known = (
        f"the only output is {names[0]}"
        if len(names) == 1
        else f"this model's outputs are {', '.join(names)}"
    )
    for o in outs:
        if not isinstance(o, dict) or o.get("name") not in names:
            raise ApiError(
                "validation",
                f"unknown output {o.get('name') if isinstance(o, dict) else o!r}; {known}",
            )
        op = o.get("parameters")
        if op is None:
            continue
        if not isinstance(op, dict):
            raise ApiError("validation", f"output {o['name']}: parameters should be an object")
        if "binary_data" in op:
            if not isinstance(op["binary_data"], bool):
                raise ApiError(
                    "validation",
                    f"output {o['name']}: parameters.binary_data should be true or false, got "
                    f"{as_json(op['binary_data'])}",
                )
            binary = op["binary_data"]
    return binary


async def infer(svc, request, req: dict, texts: list[str], params: dict, binary: bool, t0: float):
    e = svc.engine
    shape = (req.get("inputs") or [{}])[0].get("shape") or [len(texts)]
    raw = params.get("raw_scores", False)
    truncate = params.get("truncate", svc.config.auto_truncate)
    if not isinstance(raw, bool) or not isinstance(truncate, bool):
        raise ApiError("validation", "parameters raw_scores and truncate should be booleans")
    names = [o["name"] for o in signature(svc)[1]]
    outs = req.get("outputs")
    binary = output_binary(outs, names, binary)
    timings = None
    if e.head == "seq_cls":
        pairs = len(shape) == 2 and shape[1] == 2
        if len(shape) == 2 and shape[1] not in (1, 2):
            raise ApiError("validation", "TEXT should be [n] texts or [n, 2] pairs")
        if pairs:  # a pair is one input, as a document of /rerank is
            svc.check_count(len(texts) // 2, "TEXT", "pairs")
        texts = svc.check_texts(texts, "TEXT", count=not pairs)
        if pairs:
            seqs, tok_s = await svc.heads.pair_seqs(list(zip(texts[::2], texts[1::2], strict=True)))
        else:
            seqs, tok_s = await svc.heads.text_seqs(texts, truncate)
        res = await svc.heads.run(request, seqs, tok_s, t0)
        from zoi.serve.routes_heads import _scores

        arrays = [("SCORES", "FP32", _scores(svc, res.embeddings, raw))]
        timings = res.timings
    elif e.head == "splade":
        texts = svc.check_texts(texts, "TEXT")
        svc.check_output(
            len(texts) * e.head_cols, f"{len(texts)} texts x {e.head_cols} vocabulary entries"
        )
        seqs, tok_s = await svc.heads.text_seqs(texts, truncate)
        res = await svc.heads.run(request, seqs, tok_s, t0)
        arrays = [("SPARSE", "FP32", res.embeddings)]
        timings = res.timings
    else:
        texts = svc.check_texts(texts, "TEXT")
        # tokenised first, so that the answer's size is known (and bounded) before the model
        # runs: TOKEN_LOGITS is padded to the longest text
        seqs, _ = await svc.tokenize(texts, True)
        longest = max(len(s) for s in seqs)
        svc.check_output(
            len(texts) * longest * e.head_cols,
            f"{len(texts)} texts x {longest} tokens (the longest) x {e.head_cols} labels",
        )
        lg = await in_thread(e.predict_tokens, texts)
        L = max(len(x) for x in lg)
        pad = np.zeros((len(lg), L, e.head_cols), np.float32)
        for i, x in enumerate(lg):
            pad[i, : len(x)] = x
        count = np.array([len(x) for x in lg], np.int32)
        arrays = [("TOKEN_LOGITS", "FP32", pad), ("TOKEN_COUNT", "INT32", count)]
    if outs is not None:
        want = {o["name"] for o in outs}
        arrays = [a for a in arrays if a[0] in want]
    resp = {"model_name": svc.model_name, "model_version": "1", "outputs": []}
    if "id" in req:
        resp["id"] = req["id"]
    blobs = []
    for name, dt, arr in arrays:
        a = np.ascontiguousarray(arr, dtype="<f4" if dt == "FP32" else "<i4")
        out = {"name": name, "datatype": dt, "shape": list(a.shape)}
        if binary:
            blobs.append(a.tobytes())
            out["parameters"] = {"binary_data_size": len(blobs[-1])}
        else:
            out["data"] = a.reshape(-1)
        resp["outputs"].append(out)
    headers = timing_headers(timings) if timings else {}
    if binary:
        head = dumps(resp)
        headers[HEADER] = str(len(head))
        return Response(
            head + b"".join(blobs), headers=headers, media_type="application/octet-stream"
        )
    return await json_answer(resp, sum(a.size for _, _, a in arrays), headers=headers)
