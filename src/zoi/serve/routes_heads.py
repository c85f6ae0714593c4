"""Routes of the task heads.

TEI: /rerank, /predict (sequence classification), /embed_sparse (SPLADE; BGE-M3's lexical
weights), /embed_all (token embeddings of an embedding model). Cohere-style /v1/rerank (the
shape Jina and vLLM accept too). /embed_multivector: the ColBERT vectors of BGE-M3 or a ColBERT
model. A route whose head the model lacks answers 400 naming the model's head. Pairs and texts
go through the heads' dynamic batcher (zoi.serve.heads); token embeddings and the multi-vector
outputs run on a worker thread. docs/SERVE.md documents every body.
"""

from __future__ import annotations

import numpy as np
from starlette.requests import Request
from starlette.routing import Route

from zoi.heads.api import _sigmoid, _softmax
from zoi.serve.handler import admitted, json_answer
from zoi.serve.heads import in_thread, need
from zoi.serve.http import ApiError, json_response, parse_json, timing_headers
from zoi.serve.openapi_heads import ALL, ROUTES_OF, multivector_routes
from zoi.serve.routes_tei import ANSWERS as TEI_ANSWERS
from zoi.serve.routes_tei import _flag, _inputs
from zoi.serve.service import Service

ROUTE = "heads"


def _scores(svc: Service, logits: np.ndarray, raw: bool) -> np.ndarray:
    """TEI: sigmoid for one label, softmax over labels otherwise (raw_scores: the logits)."""
    if raw:
        return logits
    return _sigmoid(logits) if logits.shape[1] == 1 else _softmax(logits)


def _str(body: dict, name: str, limit: int) -> str:
    v = body.get(name)
    if not isinstance(v, str):
        raise ApiError("validation", f"{name} should be a string", name)
    if not v:
        raise ApiError("empty", f"{name} is an empty string", name)
    if len(v) > limit:
        raise ApiError(
            "too_large",
            f"{name} has {len(v)} characters, over the cap of {limit} (--max-input-chars)",
            name,
        )
    return v


def _rank(scores: np.ndarray, top: int | None) -> list[int]:
    return [int(i) for i in np.argsort(-scores, kind="stable")[:top]]


def make_routes(svc: Service) -> list[Route]:
    def handler(route_fn):
        @admitted(svc, ROUTE, TEI_ANSWERS)
        async def h(request: Request, raw: bytes, t0: float):
            body = parse_json(raw)
            if not isinstance(body, dict):
                raise ApiError("validation", "request body should be a JSON object")
            out, timings, floats = await route_fn(request, body, t0)
            headers = timing_headers(timings) if timings else None
            return await json_answer(out, floats, headers=headers)

        return h

    async def _pair_logits(request, query: str, docs: list[str], t0: float):
        seqs, tok_s = await svc.heads.pair_seqs([(query, d) for d in docs])
        res = await svc.heads.run(request, seqs, tok_s, t0)
        return res.embeddings, res

    async def rerank(request, body, t0):
        need(svc, "/rerank", "seq_cls")
        query = _str(body, "query", svc.max_input_chars)
        texts = body.get("texts")
        if not isinstance(texts, list):
            raise ApiError("validation", "texts should be an array of strings", "texts")
        texts = svc.check_texts(texts, "texts")
        raw = _flag(body, "raw_scores", False)
        ret = _flag(body, "return_text", False)
        _flag(body, "truncate", True)  # pairs are truncated to the model's positions
        logits, res = await _pair_logits(request, query, texts, t0)
        if logits.shape[1] != 1:
            raise ApiError(
                "invalid",
                f"/rerank needs a one-label cross-encoder; this one has {logits.shape[1]} labels (use /predict)",
            )
        s = _scores(svc, logits, raw)[:, 0]
        out = []
        for i in _rank(s, None):
            r = {"index": i, "score": float(s[i])}
            if ret:
                r["text"] = texts[i]
            out.append(r)
        return out, res.timings, 0

    async def cohere_rerank(request, body, t0, path="/v1/rerank"):
        need(svc, path, "seq_cls")
        svc.check_model(body.get("model"))
        query = _str(body, "query", svc.max_input_chars)
        docs = body.get("documents")
        if not isinstance(docs, list):
            raise ApiError(
                "validation",
                'documents should be an array of strings or {"text"} objects',
                "documents",
            )
        texts = [d.get("text") if isinstance(d, dict) else d for d in docs]
        texts = svc.check_texts(texts, "documents")
        top = body.get("top_n")
        if top is not None and (type(top) is not int or top < 1):
            raise ApiError("validation", "top_n should be a positive integer", "top_n")
        ret = _flag(body, "return_documents", False)
        logits, res = await _pair_logits(request, query, texts, t0)
        if logits.shape[1] != 1:
            raise ApiError(
                "invalid",
                f"{path} needs a one-label cross-encoder; this one has {logits.shape[1]} labels",
            )
        s = _sigmoid(logits[:, 0])
        results = []
        for i in _rank(s, top):
            r = {"index": i, "relevance_score": float(s[i])}
            if ret:
                r["document"] = {"text": texts[i]}
            results.append(r)
        out = {
            "id": f"rerank-{int(t0 * 1e6)}",
            "model": svc.model_name,
            "results": results,
            "usage": {"total_tokens": res.tokens},
            "meta": {"billed_units": {"search_units": 1}},
        }
        return out, res.timings, 0

    async def cohere_rerank_v2(request, body, t0):
        # Cohere's v2 client (cohere.ClientV2.rerank, LlamaIndex's CohereRerank): the v1 body
        # and answer, which v2 reads (documents as strings; return_documents is v1's)
        return await cohere_rerank(request, body, t0, "/v2/rerank")

    async def predict(request, body, t0):
        need(svc, "/predict", "seq_cls")
        if "inputs" not in body:
            raise ApiError("validation", "missing required field 'inputs'", "inputs")
        inp = body["inputs"]
        single = isinstance(inp, str) or (
            isinstance(inp, list) and len(inp) == 2 and all(isinstance(x, str) for x in inp)
        )
        items = [inp] if single else inp
        if not isinstance(items, list):
            raise ApiError(
                "validation",
                "inputs should be a string, a pair [a, b] or an array of them",
                "inputs",
            )
        svc.check_count(len(items), "inputs")
        raw = _flag(body, "raw_scores", False)
        truncate = _flag(body, "truncate", svc.config.auto_truncate)
        pairs_at, texts_at = [], []
        for i, x in enumerate(items):
            if isinstance(x, str):
                texts_at.append(i)
            elif isinstance(x, list) and len(x) == 2 and all(isinstance(y, str) for y in x):
                pairs_at.append(i)
            else:
                raise ApiError(
                    "validation", f"inputs[{i}] should be a string or a pair of strings", "inputs"
                )
        seqs: list = [None] * len(items)
        tok_s = 0.0
        if texts_at:
            texts = svc.check_texts([items[i] for i in texts_at], "inputs")
            ts, tok_s = await svc.heads.text_seqs(texts, truncate)
            for i, s in zip(texts_at, ts, strict=True):
                seqs[i] = s
        if pairs_at:  # a pair is one input (counted above), as a document of /rerank is
            flat = svc.check_texts([y for i in pairs_at for y in items[i]], "inputs", count=False)
            ps, dt = await svc.heads.pair_seqs(
                [(flat[2 * k], flat[2 * k + 1]) for k in range(len(pairs_at))]
            )
            tok_s += dt
            for i, s in zip(pairs_at, ps, strict=True):
                seqs[i] = s
        res = await svc.heads.run(request, seqs, tok_s, t0)
        s = _scores(svc, res.embeddings, raw)
        labels = svc.engine.labels
        out = [
            [{"label": labels[j], "score": float(row[j])} for j in np.argsort(-row, kind="stable")]
            for row in s
        ]
        return (out[0] if single else out), res.timings, 0

    async def embed_sparse(request, body, t0):
        lexical = "/embed_sparse" in multivector_routes(svc.engine)
        if not lexical:
            need(svc, "/embed_sparse", "splade")
        texts = svc.check_texts(_inputs(body), "inputs")
        truncate = _flag(body, "truncate", svc.config.auto_truncate)
        if lexical:  # BGE-M3: its heads run on the host after the forward, on a worker thread
            rows = await in_thread(svc.engine.encode_sparse, texts, None, False, None, truncate)
            svc.metrics.inputs.inc(len(texts))
            out = [
                [{"index": int(i), "value": float(v)} for i, v in zip(idx, val, strict=True)]
                for idx, val in rows
            ]
            return out, None, sum(len(x) for x in out)
        seqs, tok_s = await svc.heads.text_seqs(texts, truncate)
        res = await svc.heads.run(request, seqs, tok_s, t0)
        out = []
        for row in res.embeddings:
            nz = np.flatnonzero(row > 0)
            out.append([{"index": int(i), "value": float(row[i])} for i in nz])
        return out, res.timings, sum(len(x) for x in out)

    async def embed_all(request, body, t0):
        need(svc, "/embed_all", "")
        texts = svc.check_texts(_inputs(body), "inputs")
        truncate = _flag(body, "truncate", svc.config.auto_truncate)
        # tokenised first (on the tokenizer thread when big; over-long texts with truncation off
        # are a 413 here), so that the answer, tokens x hidden floats, is bounded before the
        # model runs
        seqs, _ = await svc.tokenize(texts, truncate)
        ntok = int(sum(len(s) for s in seqs))
        floats = ntok * svc.hidden
        svc.check_output(floats, f"{ntok:,} tokens x {svc.hidden} dimensions", "inputs")
        embs = await in_thread(svc.engine.token_embeddings, texts, None, truncate)
        svc.metrics.inputs.inc(len(texts))
        svc.metrics.request_tokens.inc(ntok)
        return list(embs), None, floats

    async def embed_multivector(request, body, t0):
        texts = svc.check_texts(_inputs(body), "inputs")
        truncate = _flag(body, "truncate", svc.config.auto_truncate)
        is_query = _flag(body, "is_query", False)
        eng = svc.engine
        # the answer (vectors x dimensions floats) bounded before the model runs
        lens = await in_thread(eng.multivector_lengths, texts, is_query, truncate)
        dim = eng.multivector.colbert_dim
        floats = int(lens.sum()) * dim
        svc.check_output(floats, f"{int(lens.sum()):,} vectors x {dim} dimensions", "inputs")
        vecs = await in_thread(eng.encode_multi, texts, "colbert", is_query, None, truncate)
        svc.metrics.inputs.inc(len(texts))
        svc.metrics.request_tokens.inc(int(lens.sum()))
        return list(vecs), None, floats

    fns = {
        "/rerank": rerank,
        "/predict": predict,
        "/embed_sparse": embed_sparse,
        "/embed_all": embed_all,
        "/v1/rerank": cohere_rerank,
        "/v2/rerank": cohere_rerank_v2,
        "/embed_multivector": embed_multivector,
    }
    mine = ROUTES_OF.get(getattr(svc.engine, "head", ""), ()) + multivector_routes(svc.engine)
    return [Route(p, handler(fns[p]), methods=["POST"]) for p in dict.fromkeys(mine)]


def absent(svc: Service, path: str):
    """A head route this model has not (not registered): 404 naming the model's head."""
    if path == "/embed_multivector":
        msg = (
            f"/embed_multivector needs a model with ColBERT vectors (BGE-M3, a ColBERT "
            f"checkpoint); {svc.model_name} has none"
        )
        return json_response({"error": msg, "error_type": "Validation"}, 404)
    wants = {"/embed_all": ("",), "/rerank": ("seq_cls",), "/predict": ("seq_cls",),
             "/v1/rerank": ("seq_cls",), "/v2/rerank": ("seq_cls",),
             "/embed_sparse": ("splade",)}  # fmt: skip
    try:
        need(svc, path, *wants[path])
    except ApiError as e:
        return json_response({"error": e.message, "error_type": "Validation"}, 404)
    return json_response({"error": f"{path}: not found", "error_type": "Validation"}, 404)


__all__ = ["ALL", "absent", "make_routes"]
