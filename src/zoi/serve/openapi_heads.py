"""OpenAPI entries of the task heads' routes (zoi.serve.routes_heads): only the routes of the
served model's head are registered and described (the others answer 404 naming the head)."""

from __future__ import annotations

from zoi.serve.openapi_parts import _post

ROUTES_OF = {
    "": ("/embed_all",),
    "seq_cls": ("/rerank", "/predict", "/v1/rerank", "/v2/rerank"),
    "token_cls": (),
    "splade": ("/embed_sparse",),
}
# the routes of a model with multi-vector / sparse heads (docs/MULTIVECTOR.md), beside its
# embedding routes: /embed_sparse (BGE-M3's lexical weights), /embed_multivector (ColBERT vectors)
MULTIVECTOR_ROUTES = ("/embed_sparse", "/embed_multivector")
ALL = (
    "/embed_all",
    "/rerank",
    "/predict",
    "/v1/rerank",
    "/v2/rerank",
    "/embed_sparse",
    "/embed_multivector",
)


def multivector_routes(engine) -> tuple[str, ...]:
    cfg = getattr(engine, "multivector", None)
    if cfg is None:
        return ()
    return tuple(
        p
        for p, o in zip(MULTIVECTOR_ROUTES, ("sparse", "colbert"), strict=True)
        if o in cfg.outputs
    )


def head_operations(head: str, hidden: int, extra: tuple[str, ...] = ()) -> dict[str, dict]:
    """The entries of the routes of `head`, and of `extra` (the multi-vector routes a model
    with those outputs registers: MULTIVECTOR_ROUTES)."""
    text = {"type": "string", "minLength": 1}
    texts = {"type": "array", "minItems": 1, "items": text}
    inputs = {"oneOf": [text, texts]}
    pair = {"type": "array", "items": text, "minItems": 2, "maxItems": 2}
    flag = {"type": "boolean"}
    texts_body = {  # /embed_all, /embed_sparse
        "type": "object",
        "required": ["inputs"],
        "properties": {"inputs": inputs, "truncate": flag},
    }

    def post(summary, body, example, resp, tag="TEI"):
        return _post(summary, tag, body, example, resp)

    label_score = {
        "type": "object",
        "properties": {"label": {"type": "string"}, "score": {"type": "number"}},
    }
    ops = {
        "/embed_all": post(
            "TEI embed_all: the last hidden state of every token of each input",
            texts_body,
            {"inputs": ["hello world"]},
            {
                "type": "array",
                "items": {
                    "type": "array",
                    "items": {"type": "array", "items": {"type": "number"}},
                    "description": f"[tokens][{hidden}]",
                },
            },
        ),
        "/rerank": post(
            "TEI rerank: the texts by the cross-encoder's score for (query, text), best first",
            {
                "type": "object",
                "required": ["query", "texts"],
                "properties": {
                    "query": text,
                    "texts": texts,
                    "raw_scores": flag,
                    "return_text": flag,
                    "truncate": flag,
                    "truncation_direction": {"type": "string", "enum": ["Right"]},
                },
            },
            {"query": "what is zoi?", "texts": ["an inference engine", "a fish"]},
            {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "index": {"type": "integer"},
                        "score": {"type": "number"},
                        "text": {"type": "string"},
                    },
                },
            },
        ),
        "/predict": post(
            "TEI predict: the labels and scores of a text or a pair (or of each of a batch)",
            {
                "type": "object",
                "required": ["inputs"],
                "properties": {
                    "inputs": {
                        "oneOf": [
                            text,
                            pair,
                            {"type": "array", "minItems": 1, "items": {"oneOf": [text, pair]}},
                        ]
                    },
                    "raw_scores": flag,
                    "truncate": flag,
                },
            },
            {"inputs": ["what is zoi?", "an inference engine"]},
            {
                "oneOf": [
                    {"type": "array", "items": label_score},
                    {"type": "array", "items": {"type": "array", "items": label_score}},
                ]
            },
        ),
        "/v1/rerank": post(
            "Cohere-style rerank (also Jina's and vLLM's shape): documents by relevance",
            {
                "type": "object",
                "required": ["query", "documents"],
                "properties": {
                    "model": {"type": "string"},
                    "query": text,
                    "documents": {
                        "type": "array",
                        "minItems": 1,
                        "items": {
                            "oneOf": [
                                text,
                                {
                                    "type": "object",
                                    "required": ["text"],
                                    "properties": {"text": text},
                                },
                            ]
                        },
                    },
                    "top_n": {"type": "integer", "minimum": 1},
                    "return_documents": flag,
                },
            },
            {"query": "what is zoi?", "documents": ["an inference engine", "a fish"], "top_n": 1},
            {
                "type": "object",
                "properties": {
                    "id": {"type": "string"},
                    "model": {"type": "string"},
                    "results": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "properties": {
                                "index": {"type": "integer"},
                                "relevance_score": {"type": "number"},
                                "document": {
                                    "type": "object",
                                    "properties": {"text": {"type": "string"}},
                                },
                            },
                        },
                    },
                    "usage": {"type": "object"},
                    "meta": {"type": "object"},
                },
            },
            tag="Cohere",
        ),
        "/embed_sparse": post(
            "TEI embed_sparse: the SPLADE vector of each input (nonzero entries)",
            texts_body,
            {"inputs": ["hello world"]},
            {
                "type": "array",
                "items": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {"index": {"type": "integer"}, "value": {"type": "number"}},
                    },
                },
            },
        ),
        "/embed_multivector": post(
            "embed_multivector: the ColBERT vectors of each input, one L2-normalised vector per "
            "token (a query with is_query: its marker and [MASK] expansion)",
            {
                "type": "object",
                "required": ["inputs"],
                "properties": {"inputs": inputs, "truncate": flag, "is_query": flag},
            },
            {"inputs": ["what is zoi?"], "is_query": True},
            {
                "type": "array",
                "items": {
                    "type": "array",
                    "items": {"type": "array", "items": {"type": "number"}},
                    "description": "[vectors][dimensions]",
                },
            },
            tag="zoi",
        ),
    }
    ops["/v2/rerank"] = {
        "post": {
            **ops["/v1/rerank"]["post"],
            "summary": "Cohere v2 rerank (cohere.ClientV2.rerank): the /v1/rerank body and answer",
        }
    }
    # a multi-vector route is registered only where the model has that output
    return {p: ops[p] for p in dict.fromkeys((*ROUTES_OF.get(head, ()), *extra))}
