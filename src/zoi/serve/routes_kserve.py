"""KServe v2 / Open Inference Protocol, with Triton's binary tensor data extension.

Model signature: input `TEXT` (BYTES, shape [n] or [n, 1]; any single BYTES input is taken)
-> output `EMBEDDING` (FP32, [n, H]). Request parameters `normalize` (default true) and
`truncate` (default: the server's --auto-truncate) are honoured.

Binary extension: when the header `Inference-Header-Content-Length: N` is present, the first
N bytes of the body are the JSON header and the rest holds the binary inputs, in order, each
`parameters.binary_data_size` bytes; a BYTES tensor is serialised as a 4-byte little-endian
length before each element. An output is answered in binary when the request asks for it
(`binary_data_output` or the output's `binary_data`), as tritonclient does by default.
"""

from __future__ import annotations

import struct

import numpy as np
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from zoi._version import __version__
from zoi.serve import kserve_heads
from zoi.serve.handler import Answers, admitted, json_answer
from zoi.serve.http import ApiError, dumps, error_headers, json_response, parse_json, timing_headers
from zoi.serve.service import Service, as_json

ROUTE = "kserve"
INPUT = "TEXT"
OUTPUT = "EMBEDDING"
HEADER = "inference-header-content-length"


def error_response(e: ApiError):
    return json_response({"error": e.message}, e.status, headers=error_headers(e))


ANSWERS = Answers(error_response, {"error": "client went away"})


def deserialize_bytes(buf: bytes, count: int, name: str) -> list[bytes]:
    out = []
    off = 0
    n = len(buf)
    while off < n:
        if off + 4 > n:
            raise ApiError("validation", f"input {name}: truncated BYTES element length")
        (ln,) = struct.unpack_from("<I", buf, off)
        off += 4
        if off + ln > n:
            raise ApiError("validation", f"input {name}: BYTES element runs past the binary data")
        out.append(buf[off : off + ln])
        off += ln
    if len(out) != count:
        raise ApiError(
            "validation", f"input {name}: shape says {count} elements, binary data holds {len(out)}"
        )
    return out


MAX_DATA_DEPTH = 32  # nesting of a tensor's `data` (a rank far beyond any real tensor)


def _flatten(data, out: list, name: str = INPUT) -> None:
    """Row-major elements of nested `data`, without recursion (deep nesting is a 422)."""
    stack = [(data, 0)]
    while stack:
        x, depth = stack.pop()
        if isinstance(x, list):
            if depth >= MAX_DATA_DEPTH:
                raise ApiError(
                    "validation",
                    f"input {name}: data is nested more than {MAX_DATA_DEPTH} levels deep",
                )
            stack.extend((y, depth + 1) for y in reversed(x))
        else:
            out.append(x)


def _count(shape, name: str) -> int:
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
        raise ApiError(
            "validation", f"input {name}: shape should be an array of non-negative integers"
        )
    n = 1
    for d in shape:
        n *= d
    return n


def parse_infer_request(body: bytes, header_len: str | None) -> tuple[dict, list[str]]:
    if header_len is not None:
        try:
            hl = int(header_len)
        except ValueError:
            raise ApiError(
                "validation", f"bad Inference-Header-Content-Length {header_len!r}"
            ) from None
        if not 0 < hl <= len(body):
            raise ApiError(
                "validation",
                f"Inference-Header-Content-Length {hl} does not fit a body of {len(body)} bytes",
            )
        req, binary = parse_json(body[:hl]), body[hl:]
    else:
        req, binary = parse_json(body), b""
    if not isinstance(req, dict):
        raise ApiError("validation", "request should be a JSON object with 'inputs'")
    inputs = req.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise ApiError("validation", "request needs a non-empty 'inputs' array")
    texts = None
    off = 0
    for t in inputs:
        if not isinstance(t, dict) or not isinstance(t.get("name"), str):
            raise ApiError("validation", "each input should be an object with a 'name'")
        name = t["name"]
        params = t.get("parameters") or {}
        if not isinstance(params, dict):
            raise ApiError("validation", f"input {name}: parameters should be an object")
        size = params.get("binary_data_size")
        raw = None
        if size is not None:
            if type(size) is not int or size < 0 or off + size > len(binary):
                raise ApiError(
                    "validation",
                    f"input {name}: binary_data_size {size!r} does not fit the "
                    f"{len(binary) - off} binary bytes left",
                )
            raw = binary[off : off + size]
            off += size
        if t.get("datatype") != "BYTES":
            raise ApiError(
                "validation",
                f"input {name}: datatype {t.get('datatype')!r} is not supported; "
                f"send the texts as a BYTES input named {INPUT}",
            )
        if texts is not None:
            raise ApiError("validation", "send exactly one BYTES input (the texts)")
        count = _count(t.get("shape"), name)
        if raw is not None:
            items = deserialize_bytes(raw, count, name)
        else:
            if "data" not in t:
                raise ApiError("validation", f"input {name}: no 'data' and no binary_data_size")
            items = []
            _flatten(t["data"], items, name)
            if len(items) != count:
                raise ApiError(
                    "validation",
                    f"input {name}: shape says {count} elements, data holds {len(items)}",
                )
        texts = []
        for i, x in enumerate(items):
            if isinstance(x, bytes):
                try:
                    x = x.decode("utf-8")
                except UnicodeDecodeError:
                    raise ApiError("validation", f"input {name}[{i}] is not valid UTF-8") from None
            if not isinstance(x, str):
                raise ApiError("validation", f"input {name}[{i}] should be a string")
            texts.append(x)
    if off != len(binary):
        raise ApiError("validation", f"{len(binary) - off} bytes of binary data belong to no input")
    return req, texts


def make_routes(svc: Service) -> list[Route]:
    def check_model(request: Request) -> None:
        name = request.path_params["model"]
        if name != svc.model_name:
            raise ApiError(
                "not_found", f"unknown model {name!r}; this server serves {svc.model_name!r}"
            )
        version = request.path_params.get("version")
        if version not in (None, "", "1"):
            raise ApiError(
                "not_found", f"unknown version {version!r} of model {name!r}; the only version is 1"
            )

    async def server_meta(request: Request):
        return json_response(
            {"name": "zoi", "version": __version__, "extensions": ["binary_tensor_data"]}
        )

    async def live(request: Request):
        return Response(status_code=200)

    async def ready(request: Request):
        ok, why = svc.can_admit()
        if not ok:
            return json_response({"error": f"degraded: {why}"}, 503)
        return Response(status_code=200)

    async def model_meta(request: Request):
        try:
            check_model(request)
        except ApiError as e:
            return error_response(e)
        if getattr(svc.engine, "head", ""):  # a task head's signature (zoi.serve.kserve_heads)
            ins, outs = kserve_heads.signature(svc)
            return json_response(
                {
                    "name": svc.model_name,
                    "versions": ["1"],
                    "platform": "zoi",
                    "inputs": ins,
                    "outputs": outs,
                }
            )
        return json_response(
            {
                "name": svc.model_name,
                "versions": ["1"],
                "platform": "zoi",
                "inputs": [{"name": INPUT, "datatype": "BYTES", "shape": [-1]}],
                "outputs": [{"name": OUTPUT, "datatype": "FP32", "shape": [-1, svc.hidden]}],
            }
        )

    async def model_ready(request: Request):
        try:
            check_model(request)
        except ApiError as e:
            return error_response(e)
        return Response(status_code=200 if svc.ready else 503)

    async def model_config(request: Request):
        try:
            check_model(request)
        except ApiError as e:
            return error_response(e)
        if getattr(svc.engine, "head", ""):
            ins, outs = kserve_heads.config_io(svc)
            return json_response(
                {
                    "name": svc.model_name,
                    "platform": "zoi",
                    "backend": "zoi",
                    "max_batch_size": 0,
                    "input": ins,
                    "output": outs,
                }
            )
        return json_response(
            {
                "name": svc.model_name,
                "platform": "zoi",
                "backend": "zoi",
                "max_batch_size": 0,
                "input": [{"name": INPUT, "data_type": "TYPE_STRING", "dims": [-1]}],
                "output": [{"name": OUTPUT, "data_type": "TYPE_FP32", "dims": [-1, svc.hidden]}],
            }
        )

    @admitted(svc, ROUTE, ANSWERS, before=check_model)
    async def infer(request: Request, body: bytes, t0: float):
        req, texts = parse_infer_request(body, request.headers.get(HEADER))
        params = req.get("parameters") or {}
        if not isinstance(params, dict):
            raise ApiError("validation", "parameters should be an object")
        normalize = params.get("normalize", True)
        truncate = params.get("truncate", svc.config.auto_truncate)
        if not isinstance(normalize, bool) or not isinstance(truncate, bool):
            raise ApiError("validation", "parameters normalize and truncate should be booleans")
        binary = params.get("binary_data_output", False)
        if not isinstance(binary, bool):  # "no" or 0 must not ask for a binary answer
            raise ApiError(
                "validation",
                f"parameters.binary_data_output should be true or false, got {as_json(binary)}",
            )
        if getattr(svc.engine, "head", ""):  # a task head (zoi.serve.kserve_heads)
            return await kserve_heads.infer(svc, request, req, texts, params, binary, t0)
        binary = kserve_heads.output_binary(req.get("outputs"), [OUTPUT], binary)
        texts = svc.check_texts(texts, INPUT)
        seqs, tok_s = await svc.tokenize(texts, truncate)
        res = await svc.embed(request, seqs, normalize, tok_s, t0)
        emb = np.ascontiguousarray(res.embeddings, dtype="<f4")
        out = {"name": OUTPUT, "datatype": "FP32", "shape": [len(texts), svc.hidden]}
        resp = {"model_name": svc.model_name, "model_version": "1", "outputs": [out]}
        if "id" in req:
            resp["id"] = req["id"]
        headers = timing_headers(res.timings)
        if binary:
            raw = emb.tobytes()
            out["parameters"] = {"binary_data_size": len(raw)}
            head = dumps(resp)
            headers[HEADER] = str(len(head))
            return Response(head + raw, headers=headers, media_type="application/octet-stream")
        out["data"] = emb.reshape(-1)
        return await json_answer(resp, emb.size, headers=headers)

    m = "/v2/models/{model}"
    mv = "/v2/models/{model}/versions/{version}"
    return [
        Route("/v2", server_meta, methods=["GET"]),
        Route("/v2/health/live", live, methods=["GET"]),
        Route("/v2/health/ready", ready, methods=["GET"]),
        Route(m, model_meta, methods=["GET"]),
        Route(mv, model_meta, methods=["GET"]),
        Route(m + "/ready", model_ready, methods=["GET"]),
        Route(mv + "/ready", model_ready, methods=["GET"]),
        Route(m + "/config", model_config, methods=["GET"]),
        Route(mv + "/config", model_config, methods=["GET"]),
        Route(m + "/infer", infer, methods=["POST"]),
        Route(mv + "/infer", infer, methods=["POST"]),
    ]
