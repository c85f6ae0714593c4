"""Several models behind one `zoi serve`: each with its own engine, batcher and limits, one port.

Each model is served by the same application a lone model gets (`create_app`); a dispatcher in
front picks the model of each request and hands the request to that application unchanged:

- `/v2/models/{name}/...` (KServe, Triton clients) and `/v1/models/{name}` by the path;
- any other POST by its JSON body's top-level `"model"` (OpenAI, Cohere, TEI and rerank bodies;
  TEI's own clients send none), the first model when the body names none;
- `/`, `/health`, `/v1/models` and `/metrics` answer for every model (health is the worst of
  them; metrics carry a `model` label); other GETs answer for the first model.

The body is read once here, within the same payload limit and body timeout the routes apply,
and handed on (decompressed) so that the route reads it as it arrived. A request naming a model
this server does not serve is answered 404 with the names it does serve, before any model sees
it. The memory check at start (`check_memory`) adds up every model's weights before the first
one is compiled, so a list that cannot fit is refused in a second, not after minutes of
compiling.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from zoi.serve.http import ApiError, ClientGone, error_headers, json_response, loads, read_body

log = logging.getLogger("zoi.serve")

# bytes a weight takes once loaded, per precision (an INT8 engine keeps its embeddings and
# norms in float32: a quarter is the floor, the 1.2 covers what stays wider)
_RESIDENT = {"fp32": 4.0, "fp16": 2.0, "bf16": 2.0, "int8": 1.2, "w8": 1.2, "fp8": 1.2}


def parse_models(items: list[str]) -> list[tuple[str | None, str]]:
    """`NAME=PATH` or `PATH` for each model argument -> [(name or None, path)]. A path that
    exists is taken whole even when it has an '=' in it."""
    out: list[tuple[str | None, str]] = []
    for it in items:
        if "=" in it and not os.path.exists(it):
            name, path = it.split("=", 1)
            if not name or not path:
                raise ValueError(
                    f"model argument {it!r}: give NAME=PATH (a served name and a model folder "
                    "or artifact) or just the path"
                )
            out.append((name, path))
        else:
            out.append((None, it))
    return out


def weight_bytes(path: str, precision: str | None) -> int:
    """About the bytes `path`'s weights take once served: a zoi artifact's size, else the
    parameters of the folder's safetensors files at the serving precision. 0 when unknown
    (the engine's own checks still run)."""
    p = Path(path)
    if p.is_file():
        return p.stat().st_size
    if not p.is_dir():
        return 0
    from zoi.errors import ZoiError
    from zoi.frontend.safetensors_io import SafetensorsFile

    params = 0
    per = _RESIDENT.get((precision or "fp32").lower(), 4.0)
    for f in sorted(p.glob("*.safetensors")):
        try:
            st = SafetensorsFile(f)
            for name in st.names():
                n = 1
                for d in st.meta(name)[1]:
                    n *= d
                params += n
        except (ZoiError, OSError):
            return 0  # the compile names what is wrong with the file
    if params == 0 and any(p.glob("*.zoi")):
        return sum(f.stat().st_size for f in p.glob("*.zoi"))
    return int(params * per)


def check_memory(models: list[tuple[str | None, str]], precision: str | None) -> int:
    """Refuse, before any compile, a list of models whose weights together exceed the memory
    this process can still take. Returns the estimate in bytes."""
    from zoi.decoder.memory import available_host_bytes, human_bytes

    sizes = [(path, weight_bytes(path, precision)) for _, path in models]
    total = sum(s for _, s in sizes)
    room = available_host_bytes()
    if room is not None and total > room[0]:
        each = ", ".join(f"{path} {human_bytes(s)}" for path, s in sizes)
        raise MemoryError(
            f"zoi serve: the {len(models)} models need about {human_bytes(total)} for their "
            f"weights ({each}) but {human_bytes(room[0])} is {room[1]}; serve fewer models, "
            "or compile with --precision int8"
        )
    return total


class MultiModelApp:
    """ASGI dispatcher over one application per model (see the module docstring)."""

    def __init__(self, entries: list[tuple[str, object, object]], config):
        # entries: (served name, service, its ASGI app); the first is the default
        if not entries:
            raise ValueError("no models to serve")
        names = [n for n, _, _ in entries]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(
                f"two models are served as {dup[0]!r}; name them apart with NAME=PATH "
                "(e.g. zoi serve small=./a large=./b)"
            )
        self.entries = entries
        self.by_name = {n: (s, a) for n, s, a in entries}
        self.default = names[0]
        self.config = config
        self.services = [s for _, s, _ in entries]

    @property
    def names(self) -> list[str]:
        return [n for n, _, _ in self.entries]

    def _served(self) -> str:
        return ", ".join(repr(n) for n in self.names)

    async def __call__(self, scope, receive, send):
        if scope["type"] == "lifespan":
            return await self._lifespan(receive, send)
        if scope["type"] != "http":
            return await self.by_name[self.default][1](scope, receive, send)
        path = scope.get("path", "")
        method = scope.get("method", "GET")
        if path.startswith("/v2/models/"):
            name = path[len("/v2/models/") :].split("/", 1)[0]
            return await self._to(name, scope, receive, send, kserve=True)
        if path.startswith("/v1/models/"):
            return await self._to(path[len("/v1/models/") :], scope, receive, send)
        if method == "GET":
            if path == "/":
                return await json_response(
                    {"name": "zoi", "models": self.names, "default_model": self.default}
                )(scope, receive, send)
            if path == "/v1/models":
                return await json_response(
                    {
                        "object": "list",
                        "data": [
                            {"id": n, "object": "model", "created": 0, "owned_by": "zoi"}
                            for n in self.names
                        ],
                    }
                )(scope, receive, send)
            if path == "/health":
                return await self._health(scope, receive, send)
            if path == "/metrics":
                return await self._metrics(scope, receive, send)
            return await self.by_name[self.default][1](scope, receive, send)
        if method != "POST":
            return await self.by_name[self.default][1](scope, receive, send)
        return await self._post(scope, receive, send)

    async def _to(self, name: str, scope, receive, send, kserve: bool = False):
        if name in self.by_name:
            return await self.by_name[name][1](scope, receive, send)
        if kserve:  # KServe's error shape
            body = {"error": f"model {name!r} is not served here; served: {self._served()}"}
        else:
            body = self._not_found(name, scope.get("path", ""))
        return await json_response(body, 404)(scope, receive, send)

    def _not_found(self, name, path: str) -> dict:
        """The 404 in the shape of the route's protocol: OpenAI's error object on the OpenAI
        routes, TEI's elsewhere."""
        msg = f"the model {name!r} is not served here; this server serves {self._served()}"
        if path.startswith(("/v1/embeddings", "/v1/completions", "/v1/chat/", "/v1/models")):
            return {
                "error": {
                    "message": msg,
                    "type": "invalid_request_error",
                    "param": "model",
                    "code": "model_not_found",
                }
            }
        return {"error": msg, "error_type": "Validation"}

    async def _post(self, scope, receive, send):
        from starlette.requests import Request

        cfg = self.config
        request = Request(scope, receive)
        try:
            body = await read_body(request, cfg.payload_limit, cfg.body_timeout)
        except ClientGone:
            return None
        except ApiError as e:
            return await json_response(
                {"error": e.message, "error_type": "Validation"}, e.status, error_headers(e)
            )(scope, receive, send)
        name = self.default
        if body[:1] in (b"{", b" ", b"\n", b"\t", b"\r"):
            try:
                obj = loads(body)
            except Exception:  # the route answers malformed JSON in its protocol's shape
                obj = None
            if isinstance(obj, dict) and isinstance(obj.get("model"), str) and obj["model"]:
                name = obj["model"]
        if name not in self.by_name:
            return await json_response(self._not_found(name, scope.get("path", "")), 404)(
                scope, receive, send
            )
        # the route reads the body again: hand it on as it now is (decompressed)
        headers = [
            (k, v)
            for k, v in scope.get("headers", [])
            if k.lower() not in (b"content-encoding", b"content-length", b"transfer-encoding")
        ]
        headers.append((b"content-length", str(len(body)).encode()))
        inner = dict(scope, headers=headers)
        sent = False

        async def replay():
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # http.disconnect, when the client goes

        return await self.by_name[name][1](inner, replay, send)

    async def _health(self, scope, receive, send):
        worst = []
        for name, svc in ((n, s) for n, s, _ in self.entries):
            ok, why = svc.can_admit()
            if not ok:
                worst.append(f"{name}: {why}")
        if worst:
            return await json_response(
                {"error": "degraded: " + "; ".join(worst), "error_type": "Unhealthy"}, 503
            )(scope, receive, send)
        from starlette.responses import Response

        return await Response(status_code=200)(scope, receive, send)

    async def _metrics(self, scope, receive, send):
        from starlette.responses import Response

        data, ctype = render_metrics([(n, s.metrics.registry) for n, s, _ in self.entries])
        return await Response(data, media_type=ctype)(scope, receive, send)

    async def _lifespan(self, receive, send):
        while True:
            msg = await receive()
            if msg["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif msg["type"] == "lifespan.shutdown":
                # uvicorn has stopped accepting and waited for in-flight requests; drain what is
                # queued, model by model
                log.info("zoi serve: shutting down, answering what is queued")
                for svc in self.services:
                    try:
                        svc.close()
                    except Exception:  # one model's failure must not keep the others open
                        log.exception("closing a model failed")
                await send({"type": "lifespan.shutdown.complete"})
                return


def render_metrics(registries: list[tuple[str, object]]) -> tuple[bytes, str]:
    """One Prometheus exposition of several models' registries, each sample labelled with its
    model (the same metric names, so dashboards sum or split them by `model`)."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.exposition import CONTENT_TYPE_LATEST
    from prometheus_client.metrics_core import Metric

    merged: dict[str, Metric] = {}
    for model, reg in registries:
        for fam in reg.collect():
            out = merged.get(fam.name)
            if out is None:
                out = merged[fam.name] = Metric(fam.name, fam.documentation, fam.type, fam.unit)
            for s in fam.samples:
                out.add_sample(
                    s.name, {"model": model, **s.labels}, s.value, s.timestamp, s.exemplar
                )

    class _Merged:
        def collect(self):
            return list(merged.values())

    reg = CollectorRegistry(auto_describe=False)
    reg.register(_Merged())
    return generate_latest(reg), CONTENT_TYPE_LATEST
