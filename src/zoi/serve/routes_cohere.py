"""Cohere-style POST /v2/embed: `input_type` chooses the model's prompt, `embedding_types` the
number formats, `output_dimension` a Matryoshka prefix.

`input_type` maps onto the prompts of the model's config_sentence_transformers.json:
search_query -> "query", search_document -> "document" (or "passage"), classification ->
"classification", clustering -> "clustering" (names compared without case). A model without
the matching prompt embeds the text as it is (Qwen3-Embedding, for one, instructs queries only).
A model with task adapters (jina-embeddings-v3, zoi.serve.tasks) runs the input_type's adapter
with its instruction instead: search_query -> retrieval.query, search_document ->
retrieval.passage, classification -> classification, clustering -> separation.

Formats, all from the same normalised float rows: "float"; "base64" (little-endian float32);
"int8" = round(127 x) and "uint8" = round(127.5 (x + 1)) (fixed scales: a unit vector's
components lie in [-1, 1], so a row's numbers never depend on the rest of its batch);
"binary" / "ubinary" = the signs packed 8 to a byte (x > 0 -> 1), as sentence-transformers'
quantize_embeddings, "binary" offset by -128 into int8.
"""

from __future__ import annotations

import base64
import uuid

import numpy as np
from starlette.requests import Request
from starlette.routing import Route

from zoi.serve.handler import Answers, admitted, json_answer
from zoi.serve.http import ApiError, error_headers, json_response, parse_json, timing_headers
from zoi.serve.service import Service, as_json
from zoi.serve.tasks import cohere_task, instruction, tagged

ROUTE = "cohere"
INPUT_TYPES = {
    "search_query": ("query", "search_query", "retrieval.query"),
    "search_document": ("document", "passage", "search_document", "retrieval.passage"),
    "classification": ("classification",),
    "clustering": ("clustering",),
}
TYPES = ("float", "base64", "int8", "uint8", "binary", "ubinary")


def error_response(e: ApiError):
    return json_response({"message": e.message}, e.status, headers=error_headers(e))


ANSWERS = Answers(error_response, {"message": "client went away"})


def prompt_for(svc: Service, input_type: str) -> str | None:
    """The model's prompt for a Cohere input_type (None: the text as it is)."""
    prompts = {k.lower(): v for k, v in svc.prompts().items()}
    for name in INPUT_TYPES[input_type]:
        if name in prompts:
            return prompts[name]
    return None


def formats(emb: np.ndarray, types: list[str]) -> dict:
    out: dict = {}
    for t in types:
        if t == "float":
            out[t] = list(emb)
        elif t == "base64":
            out[t] = [
                base64.b64encode(np.ascontiguousarray(r, "<f4").tobytes()).decode() for r in emb
            ]
        elif t == "int8":
            out[t] = np.clip(np.rint(emb * 127.0), -127, 127).astype(np.int8)
        elif t == "uint8":
            out[t] = np.clip(np.rint((emb + 1.0) * 127.5), 0, 255).astype(np.uint8)
        else:
            bits = np.packbits(emb > 0, axis=1)
            out[t] = (bits.astype(np.int16) - 128).astype(np.int8) if t == "binary" else bits
    return out


def make_routes(svc: Service) -> list[Route]:
    @admitted(svc, ROUTE, ANSWERS)
    async def embed(request: Request, raw: bytes, t0: float):
        body = parse_json(raw)
        if not isinstance(body, dict):
            raise ApiError("validation", "request body should be a JSON object")
        svc.check_model(body.get("model"))
        if "images" in body or "inputs" in body:
            raise ApiError("invalid", "this model embeds text: send `texts`", "texts")
        texts = body.get("texts")
        if not isinstance(texts, list):
            raise ApiError("validation", "texts should be an array of strings", "texts")
        if not texts:
            raise ApiError("empty", "texts is an empty array", "texts")
        itype = body.get("input_type", "search_document")
        if itype not in INPUT_TYPES:
            raise ApiError(
                "invalid",
                f"input_type {as_json(itype)} is not one of {sorted(INPUT_TYPES)}",
                "input_type",
            )
        types = body.get("embedding_types") or ["float"]
        if (
            not isinstance(types, list)
            or not all(isinstance(t, str) for t in types)
            or any(t not in TYPES for t in types)
        ):
            raise ApiError(
                "invalid",
                f"embedding_types {as_json(types)}: each should be one of {list(TYPES)}",
                "embedding_types",
            )
        types = list(dict.fromkeys(types))
        dims = svc.check_dims(body.get("output_dimension"), "output_dimension")
        trunc = body.get("truncate", "END")
        if trunc not in ("END", "NONE", "START"):
            raise ApiError(
                "invalid", f'truncate {as_json(trunc)} should be "END" or "NONE"', "truncate"
            )
        if trunc == "START":
            raise ApiError(
                "invalid",
                'truncate "START" is not supported: zoi keeps the start of a text; use "END" '
                '(cut the end) or "NONE" (refuse a text over the limit)',
                "truncate",
            )
        texts = svc.check_texts(texts, "texts")
        # a model with task adapters: the input_type's adapter and its instruction
        task = cohere_task(svc, itype)
        prompt = instruction(svc, task) if task is not None else prompt_for(svc, itype)
        if prompt:
            texts = [prompt + t for t in texts]
        seqs, tok_s = await svc.tokenize(texts, trunc == "END")
        res = await svc.embed(request, tagged(seqs, task), True, tok_s, t0)
        emb = res.embeddings
        emb = svc.matryoshka(emb, dims)
        out = {
            "id": str(uuid.uuid4()),
            "embeddings": formats(emb, types),
            "texts": body["texts"],
            "meta": {"api_version": {"version": "2"}, "billed_units": {"input_tokens": res.tokens}},
            "response_type": "embeddings_by_type",
        }
        return await json_answer(out, emb.size * len(types), headers=timing_headers(res.timings))

    return [Route("/v2/embed", embed, methods=["POST"])]
